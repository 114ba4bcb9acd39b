//! `/v1/check`, and the one decision on an inbound request (`decide_inbound`) that
//! `/v1/forward-auth` shares: the rules matched, the token's scope, check or acquire, the answer.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use tollgate::{Check, Outcome, Priority, Request};
use tollgate_api::data::{CheckAnswer, CheckBody, CheckDenied, LimitView, RateLimited};
use tollgate_api::schema::{BadRequest, Forbidden, Unauthorized, Unavailable};
use tollgate_rules::Ask;

use super::data::{count_decision, count_outcome, denial, observe_key, rate_limited};
use super::{ApiResult, ms_ceil};
use crate::config::PathEncodedSlash;
use crate::error::ApiError;
use crate::extract::{Body, Data};
use crate::state::AppState;
use crate::tokens::Grant;

/// Paths longer than this are refused rather than normalized.
const CHECK_PATH_BYTES_MAX: usize = 8 * 1024;

#[utoipa::path(post, path = "/v1/check", tag = "data",
    security(("data" = [])),
    request_body = CheckBody,
    responses(
        (status = 200, description = "allowed: commit the permit, if any, when the request \
            is done", body = CheckAnswer,
            links(("Commit" = (operation_id = "commit",
                parameters(("permit" = "$response.body#/permit")))))),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "a limit matched was deleted while it was decided on",
            body = tollgate_api::schema::NotFoundError),
        (status = 429, description = "not allowed now", body = CheckDenied,
            headers(("Retry-After" = u64, description = "seconds to wait: `retry_after_ms` \
                rounded up"))),
        (status = 503, response = Unavailable)))]
pub(crate) async fn check(
    Data(grant): Data,
    State(state): State<AppState>,
    Body(body): Body<CheckBody>,
) -> ApiResult<Response> {
    const FIELDS: InboundFields<'static> = InboundFields {
        method: "method",
        path: "path",
        user: "user",
    };
    let inbound = decide_inbound(
        &state,
        &grant,
        &body.method,
        &body.path,
        body.user.as_deref(),
        &FIELDS,
    )
    .await?;
    Ok(inbound.into_response())
}

/// How the inputs of an inbound decision are named in a refusal: `/v1/check`'s body fields,
/// or the headers `/v1/forward-auth` reads them from.
pub(crate) struct InboundFields<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) user: &'a str,
}

/// An inbound request decided: what was matched, and the answer.
pub(crate) struct Inbound {
    /// The normalized path that was matched.
    path: String,
    /// The limits whose `match` matched, by name.
    matched: Vec<String>,
    /// The priority the request was decided at.
    priority: Priority,
    decision: Decided,
}

enum Decided {
    Allowed {
        limits: Vec<LimitView>,
        permit: Option<String>,
    },
    Denied(RateLimited),
}

impl Inbound {
    /// Each limit matched, after the decision.
    pub(crate) fn limits(&self) -> &[LimitView] {
        match &self.decision {
            Decided::Allowed { limits, .. } => limits,
            Decided::Denied(denied) => &denied.limits,
        }
    }

    pub(crate) fn priority(&self) -> Priority {
        self.priority
    }

    /// `/v1/check`'s answer: 200 with `CheckAnswer`, or 429 with `CheckDenied` and
    /// `Retry-After`.
    pub(crate) fn into_response(self) -> Response {
        let Inbound {
            path,
            matched,
            decision,
            ..
        } = self;
        match decision {
            Decided::Allowed { limits, permit } => Json(CheckAnswer {
                allowed: true,
                path,
                matched,
                permit,
                limits,
            })
            .into_response(),
            Decided::Denied(RateLimited {
                error,
                retry_after_ms,
                reason,
                limits,
            }) => rate_limited(
                CheckDenied {
                    error,
                    retry_after_ms,
                    reason,
                    limits,
                    allowed: false,
                    path,
                    matched,
                },
                retry_after_ms,
            ),
        }
    }
}

/// The one decision on an inbound request, for `/v1/check`: [`find_inbound`], then
/// [`decide_found`] keyed by `user`, which must be a valid key.
pub(crate) async fn decide_inbound(
    state: &AppState,
    grant: &Grant,
    method: &str,
    raw_path: &str,
    user: Option<&str>,
    fields: &InboundFields<'_>,
) -> ApiResult<Inbound> {
    check_request(method, raw_path, fields)?;
    // Refused whether or not a rule matches, so that the answer does not depend on the rules.
    if let Some(user) = user {
        tollgate::check_key(user).map_err(|reason| ApiError::bad_field(fields.user, reason))?;
    }
    let found = find_inbound(state, method, raw_path, fields)?;
    decide_found(state, grant, found, user, fields).await
}

/// The rules an inbound request matches, found before it is decided.
pub(crate) struct Found {
    /// The normalized path as written.
    path: String,
    /// The limits whose `match` matched, by name, in order.
    matched: Vec<String>,
    ask: Ask,
    /// One of them counts per key.
    per_key: bool,
}

impl Found {
    /// The limits matched, by name.
    pub(crate) fn names(&self) -> &[String] {
        &self.matched
    }

    /// Whether one of the limits matched counts per key, so the key will be counted.
    pub(crate) fn per_key(&self) -> bool {
        self.per_key
    }
}

/// A method and path that can be matched at all, else a refusal naming the field.
fn check_request(method: &str, raw_path: &str, fields: &InboundFields<'_>) -> ApiResult<()> {
    if raw_path.len() > CHECK_PATH_BYTES_MAX {
        return Err(ApiError::bad_field(
            fields.path,
            format!("must be at most {CHECK_PATH_BYTES_MAX} bytes"),
        ));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(ApiError::bad_field(fields.method, "must be an HTTP method"));
    }
    Ok(())
}

/// Every rule whose `match` meets `method` and `raw_path`, normalized as the rule set reads
/// paths (as the tower layer does) and, unless `path_encoded_slash = "segment"`, also with
/// its encoded slashes and dots decoded first, as WSGI and ASGI servers and nginx's
/// `proxy_pass` with a URI read it: a request is counted under the rules of either reading,
/// each once. A refusal names the input by `fields`.
pub(crate) fn find_inbound(
    state: &AppState,
    method: &str,
    raw_path: &str,
    fields: &InboundFields<'_>,
) -> ApiResult<Found> {
    check_request(method, raw_path, fields)?;
    let snapshot = state.rules().snapshot();
    let bad_path = |error| ApiError::bad_field(fields.path, error);
    // Read as the rule set reads paths, as the tower layer does.
    let path = snapshot.normalize(raw_path).map_err(bad_path)?.into_owned();
    // Every matching rule, as the tower layer matches: the rules in force never let one
    // request match more than it may be decided on (refused at load), so none is left out.
    let inbound = snapshot.inbound();
    let mut found = inbound.matching(method, &path);
    let decoded = match state.config().path_encoded_slash {
        PathEncodedSlash::Both => tollgate_rules::decoded_separators(raw_path),
        PathEncodedSlash::Segment => None,
    };
    if let Some(decoded) = decoded {
        let decoded = snapshot.normalize(&decoded).map_err(bad_path)?;
        if *decoded != *path {
            // Two readings may match twice the rules one may; past what one request may be
            // decided on, the limiter refuses it (a 400), which a proxy turns into a denial.
            let also = inbound.matching(method, &decoded);
            for position in also.positions {
                if !found.positions.contains(&position) {
                    found.positions.push(position);
                }
            }
            found.per_user |= also.per_user;
            found.leases |= also.leases;
        }
    }
    let mut matched: Vec<String> = found
        .positions
        .iter()
        .filter_map(|&position| inbound.rules().get(position as usize))
        .map(|rule| rule.name().to_owned())
        .collect();
    // The answer lists them by name, as it always has; the order decides nothing (one
    // request, all or nothing).
    matched.sort_unstable();
    Ok(Found {
        path,
        matched,
        ask: found.ask(),
        per_key: found.per_user,
    })
}

/// The decision on a request whose rules were found: keyed by `user` for limits counted per
/// key, all or none, within what `grant` may use. A refusal names the input by `fields`.
pub(crate) async fn decide_found(
    state: &AppState,
    grant: &Grant,
    found: Found,
    user: Option<&str>,
    fields: &InboundFields<'_>,
) -> ApiResult<Inbound> {
    let Found {
        path, matched, ask, ..
    } = found;
    if matched.is_empty() {
        return Ok(Inbound {
            path,
            matched,
            priority: Priority::default(),
            decision: Decided::Allowed {
                limits: Vec::new(),
                permit: None,
            },
        });
    }
    for name in &matched {
        grant.limit(name)?;
    }
    let names: Vec<&str> = matched.iter().map(String::as_str).collect();
    // No priority is asked for: normal, or a scoped token's highest if lower.
    let priority = grant.priority(None)?;
    let mut request = Request::all(&names).priority(priority);
    if let Some(user) = user {
        request = request.key(user);
        observe_key(state, &names, user);
    }
    // The key is the caller's `user`.
    let user_error = |error| match error {
        tollgate::Error::InvalidRequest {
            field: "key",
            reason,
        } => ApiError::bad_field(fields.user, reason),
        other => ApiError::from(other),
    };
    let decision = if ask == Ask::Check {
        let checked = state.limiter().check(&request).await.map_err(user_error)?;
        let denied = match &checked {
            Check::Allowed(_) => None,
            Check::Denied(denied) => Some(denied),
        };
        count_decision(state, &names, denied);
        match checked {
            Check::Allowed(statuses) => Decided::Allowed {
                limits: names
                    .iter()
                    .zip(&statuses)
                    .map(|(name, status)| LimitView {
                        name: (*name).to_owned(),
                        remaining: status.remaining,
                        reset_ms: ms_ceil(status.reset_after),
                        fence: None,
                        expires_ms: None,
                    })
                    .collect(),
                permit: None,
            },
            Check::Denied(denied) => Decided::Denied(denial(&denied)),
        }
    } else {
        let outcome = state
            .limiter()
            .try_acquire(&request)
            .await
            .map_err(user_error)?;
        count_outcome(state, &names, &outcome);
        match outcome {
            Outcome::Granted(permit) => {
                let limits = permit.limits().iter().map(LimitView::from).collect();
                let has_lease = permit.fence().is_some();
                let id = permit.detach();
                Decided::Allowed {
                    limits,
                    permit: has_lease.then(|| id.to_string()),
                }
            }
            Outcome::Denied(denied) => Decided::Denied(denial(&denied)),
        }
    };
    // The request borrows the names, which borrow `matched`.
    drop(request);
    drop(names);
    Ok(Inbound {
        path,
        matched,
        priority,
        decision,
    })
}
