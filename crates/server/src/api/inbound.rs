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

/// The one decision on an inbound request, for `/v1/check` and `/v1/forward-auth` alike:
/// every rule whose `match` meets `method` and `raw_path` (normalized as the rule set reads
/// paths, as the tower layer does), keyed by `user` for limits counted per key, all or none,
/// within what `grant` may use. A refusal names the input by `fields`.
pub(crate) async fn decide_inbound(
    state: &AppState,
    grant: &Grant,
    method: &str,
    raw_path: &str,
    user: Option<&str>,
    fields: &InboundFields<'_>,
) -> ApiResult<Inbound> {
    if raw_path.len() > CHECK_PATH_BYTES_MAX {
        return Err(ApiError::bad_field(
            fields.path,
            format!("must be at most {CHECK_PATH_BYTES_MAX} bytes"),
        ));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(ApiError::bad_field(fields.method, "must be an HTTP method"));
    }
    // Refused whether or not a rule matches, so that the answer does not depend on the rules.
    if let Some(user) = user {
        tollgate::check_key(user).map_err(|reason| ApiError::bad_field(fields.user, reason))?;
    }
    let snapshot = state.rules().snapshot();
    // Read as the rule set reads paths, as the tower layer does.
    let path = snapshot
        .normalize(raw_path)
        .map_err(|error| ApiError::bad_field(fields.path, error))?
        .into_owned();
    // Every matching rule, as the tower layer matches: the rules in force never let one
    // request match more than it may be decided on (refused at load), so none is left out.
    let inbound = snapshot.inbound();
    let found = inbound.matching(method, &path);
    let mut matched: Vec<String> = found
        .positions
        .iter()
        .filter_map(|&position| inbound.rules().get(position as usize))
        .map(|rule| rule.name().to_owned())
        .collect();
    // The answer lists them by name, as it always has; the order decides nothing (one
    // request, all or nothing).
    matched.sort_unstable();
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
    let decision = if found.ask() == Ask::Check {
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
