//! The handlers of HTTP API v1. The bodies they read and answer are `tollgate_api`'s; the
//! annotations here add each operation's statuses, parameters and links to the OpenAPI document
//! (`openapi.rs`), so the document cannot drift from what is served.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tollgate::{Check, Denied, DenyReason, Outcome, Priority, Request, check_limit_name};
use tollgate_api::admin::{Deleted, LimitList, RejectedRow, Resumed};
use tollgate_api::data::{
    AcquireBody, CheckAnswer, CheckBody, CheckDenied, CommitAnswer, CommitBody, Granted, LimitView,
    PauseAnswer, PauseBody, RateLimited, RenewAnswer, RenewBody,
};
use tollgate_api::ops::Health;
use tollgate_api::schema::{
    BadRequest, Forbidden, Key, LimitName, NotFound, PermitText, Unauthorized, Unavailable,
};
use tollgate_api::{Code, ErrorDetail, RawRule, Reason};
use tollgate_rules::Ask;
use utoipa::IntoParams;

use crate::error::ApiError;
use crate::extract::{Admin, Body, Data};
use crate::metrics::{DenialLabels, LimitLabels};
use crate::state::AppState;
use crate::tokens::Grant;

pub(crate) type ApiResult<T> = Result<T, ApiError>;

pub(crate) use tollgate_api::ms_ceil;

fn path_name(path: Result<Path<String>, PathRejection>, field: &str) -> ApiResult<String> {
    path.map(|Path(value)| value)
        .map_err(|rejection| ApiError::bad_field(field, rejection.body_text()))
}

/// A name in the path (a limit's, or a token's, which follow the same rule), as `name`.
pub(crate) fn limit_name(path: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    let name = path_name(path, "name")?;
    check_limit_name(&name).map_err(|reason| ApiError::bad_field("name", reason))?;
    Ok(name)
}

// ---- Admin ---------------------------------------------------------------------------------

#[utoipa::path(get, path = "/v1/limits", tag = "admin",
    security(("admin" = [])),
    responses((status = 200, description = "the limits in force and the rows refused",
            body = LimitList),
        (status = 401, response = Unauthorized)))]
pub(crate) async fn list_limits(_: Admin, State(state): State<AppState>) -> Json<LimitList> {
    let snapshot = state.rules().snapshot();
    Json(LimitList {
        version: snapshot.version(),
        limits: snapshot
            .iter()
            .map(|rule| rule.canonical().clone())
            .collect(),
        rejected: snapshot.rejected().iter().map(RejectedRow::from).collect(),
    })
}

#[utoipa::path(get, path = "/v1/limits/{name}", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name")),
    responses((status = 200, description = "the limit in force, as stored", body = RawRule),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, response = NotFound)))]
pub(crate) async fn get_limit(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<RawRule>> {
    let name = limit_name(name)?;
    let snapshot = state.rules().snapshot();
    let rule = snapshot
        .get(&name)
        .ok_or_else(|| ApiError::not_found(format!("unknown limit {name:?}")))?;
    Ok(Json(rule.canonical().clone()))
}

#[utoipa::path(put, path = "/v1/limits/{name}", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name")),
    request_body = tollgate_api::schema::LimitBody,
    responses(
        (status = 200, description = "the limit as stored, with defaults filled in",
            body = RawRule,
            links(
                ("GetLimit" = (operation_id = "get_limit",
                    parameters(("name" = "$request.path.name")))),
                ("DeleteLimit" = (operation_id = "delete_limit",
                    parameters(("name" = "$request.path.name")))),
                ("Acquire" = (operation_id = "acquire",
                    request_body = json!({"limits": ["$request.path.name"]}))),
                ("Pause" = (operation_id = "pause",
                    request_body = json!({"limit": "$request.path.name"}))),
                ("Stats" = (operation_id = "stats",
                    parameters(("limit" = "$request.path.name")))),
            )),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 409, description = "the limits come from a file, which only its authors \
            change", body = tollgate_api::schema::ConflictError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn put_limit(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    Body(raw): Body<RawRule>,
) -> ApiResult<Json<RawRule>> {
    let name = limit_name(name)?;
    let rule = state.rules().put(&name, &raw).await?;
    tracing::info!(limit = %name, "limit stored");
    Ok(Json(rule.canonical().clone()))
}

#[utoipa::path(delete, path = "/v1/limits/{name}", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name")),
    responses((status = 200, description = "the limit is gone", body = Deleted),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 409, description = "the limits come from a file, which only its authors \
            change", body = tollgate_api::schema::ConflictError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn delete_limit(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Deleted>> {
    let name = limit_name(name)?;
    if !state.rules().delete(&name).await? {
        return Err(ApiError::not_found(format!("unknown limit {name:?}")));
    }
    tracing::info!(limit = %name, "limit deleted");
    Ok(Json(Deleted::new(name)))
}

/// `DELETE /v1/limits/{name}/pause`: which pause to lift.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ResumeQuery {
    /// For a limit counted per key: lift this key's own pause (without it, the limit-wide
    /// pause).
    #[param(value_type = Option<Key>)]
    key: Option<String>,
}

#[utoipa::path(delete, path = "/v1/limits/{name}/pause", tag = "admin",
    security(("admin" = [])),
    params(("name" = LimitName, Path, description = "the limit's name"), ResumeQuery),
    responses(
        (status = 200, description = "the pause is lifted (in every replica sharing the \
            store): grants resume at once, unless the store holds the limit after a loss of \
            state (`recovering`), which is not a pause", body = Resumed),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable)))]
pub(crate) async fn resume(
    _: Admin,
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<ResumeQuery>, QueryRejection>,
) -> ApiResult<Json<Resumed>> {
    let name = limit_name(name)?;
    let Query(query) =
        query.map_err(|rejection| crate::stats::query_error(&rejection.body_text(), "key"))?;
    let resumed = state.limiter().resume(&name, query.key.as_deref()).await?;
    tracing::info!(limit = %name, key = ?query.key, resumed, "pause lifted by an administrator");
    Ok(Json(Resumed {
        limit: name,
        key: query.key,
        resumed,
    }))
}

// ---- Data plane ----------------------------------------------------------------------------

fn denial(denied: &Denied) -> RateLimited {
    let retry_after_ms = ms_ceil(denied.retry_after);
    let reason = Reason::from(denied.reason);
    // A request that asked to wait but found a cap on waiters full was decided at once.
    let not_queued = denied
        .not_queued
        .as_ref()
        .map(|full| format!("not queued to wait: {full}; "))
        .unwrap_or_default();
    let message = not_queued
        + &match denied.reason {
            DenyReason::Recovering => format!(
                "not granted: recovering; the store lost what it counted (an unclean stop, \
                     or a Redis that came back empty), so the limit grants nothing until what \
                     was granted before can no longer count: {} from now (setting \
                     recover_on_start); retry after {retry_after_ms} ms",
                crate::human_duration(denied.retry_after)
            ),
            _ => format!(
                "not granted: {}; retry after {retry_after_ms} ms",
                denied.reason.as_str()
            ),
        };
    RateLimited {
        error: ErrorDetail::new(Code::RateLimited, message),
        retry_after_ms,
        reason,
        limits: denied.limits.iter().map(LimitView::from).collect(),
    }
}

/// A 429 with `body`, and `Retry-After` in whole seconds, rounded up.
fn rate_limited(body: impl Serialize, retry_after_ms: u64) -> Response {
    let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after_ms.div_ceil(1_000)),
    );
    response
}

/// The priority asked for, if any.
fn priority(text: Option<&str>) -> ApiResult<Option<Priority>> {
    text.map(|text| {
        Priority::parse(text).ok_or_else(|| {
            ApiError::bad_field(
                "priority",
                format!("must be high, normal or low, got {text:?}"),
            )
        })
    })
    .transpose()
}

/// Decrements the waiters gauge however the request ends (answered, or dropped because the
/// client went away).
struct Waiting<'s> {
    state: &'s AppState,
    limits: Vec<String>,
    priority: Priority,
}

impl<'s> Waiting<'s> {
    /// Count a request waiting on `limits` from now until it is dropped.
    fn begin(state: &'s AppState, limits: Vec<String>, priority: Priority) -> Waiting<'s> {
        for limit in &limits {
            state.metrics().waiting(limit, priority, 1);
        }
        Waiting {
            state,
            limits,
            priority,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        for limit in &self.limits {
            self.state.metrics().waiting(limit, self.priority, -1);
        }
    }
}

/// Count a request for `key` on each of `names` that is counted per key, for the hottest keys
/// of `/v1/stats`. A key a limit would refuse is refused by the decision, never counted here.
fn observe_key(state: &AppState, names: &[&str], key: &str) {
    if tollgate::check_key(key).is_err() {
        return;
    }
    let table = state.limiter().limits();
    for name in names {
        if table.get(name).is_some_and(|limit| limit.per().is_some()) {
            state.hot_keys().observe(name, key);
        }
    }
}

fn count_outcome(state: &AppState, names: &[&str], outcome: &Outcome) {
    let denied = match outcome {
        Outcome::Granted(_) => None,
        Outcome::Denied(denied) => Some(denied),
    };
    count_decision(state, names, denied);
}

/// Count a grant (`denied` is `None`) or a denial on every limit of a request.
fn count_decision(state: &AppState, names: &[&str], denied: Option<&Denied>) {
    let metrics = state.metrics();
    for name in names {
        match denied {
            None => {
                metrics
                    .grants
                    .get_or_create(&LimitLabels {
                        limit: (*name).to_owned(),
                    })
                    .inc();
            }
            Some(denied) => {
                metrics
                    .denials
                    .get_or_create(&DenialLabels {
                        limit: (*name).to_owned(),
                        reason: denied.reason.as_str(),
                    })
                    .inc();
            }
        }
    }
}

#[utoipa::path(post, path = "/v1/acquire", tag = "data",
    security(("data" = [])),
    request_body = AcquireBody,
    responses(
        (status = 200, description = "granted: commit the permit when done", body = Granted,
            links(
                ("Commit" = (operation_id = "commit",
                    parameters(("permit" = "$response.body#/permit")))),
                ("Renew" = (operation_id = "renew",
                    parameters(("permit" = "$response.body#/permit")))),
            )),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "a limit named is unknown", body = tollgate_api::schema::NotFoundError),
        (status = 429, description = "not granted within `wait_ms`", body = RateLimited,
            headers(("Retry-After" = u64, description = "seconds to wait: `retry_after_ms` \
                rounded up"))),
        (status = 503, response = Unavailable)))]
pub(crate) async fn acquire(
    Data(grant): Data,
    State(state): State<AppState>,
    Body(body): Body<AcquireBody>,
) -> ApiResult<Response> {
    for (index, name) in body.limits.iter().enumerate() {
        check_limit_name(name)
            .map_err(|reason| ApiError::bad_field(format!("limits[{index}]"), reason))?;
    }
    let asked_priority = grant.priority(priority(body.priority.as_deref())?)?;
    for name in &body.limits {
        grant.limit(name)?;
    }
    let names: Vec<&str> = body.limits.iter().map(String::as_str).collect();
    let wait_ms = body.wait_ms.unwrap_or(0).min(state.config().wait_ms_max);
    let mut request = Request::all(&names)
        .cost(body.cost.unwrap_or(1))
        .priority(asked_priority)
        .wait(Duration::from_millis(wait_ms));
    if let Some(key) = body.key.as_deref() {
        request = request.key(key);
        observe_key(&state, &names, key);
    }
    let outcome = if wait_ms == 0 {
        state.limiter().acquire(&request).await?
    } else {
        // Only existing limits become metric labels: resolve before counting waiters.
        let table = state.limiter().limits();
        let known = names.iter().all(|name| table.get(name).is_some());
        let started = Instant::now();
        let _waiting = known.then(|| Waiting::begin(&state, body.limits.clone(), asked_priority));
        let outcome = state.limiter().acquire(&request).await?;
        for name in &names {
            state
                .metrics()
                .wait_seconds
                .get_or_create(&LimitLabels {
                    limit: (*name).to_owned(),
                })
                .observe(started.elapsed().as_secs_f64());
        }
        outcome
    };
    count_outcome(&state, &names, &outcome);
    Ok(match outcome {
        Outcome::Granted(permit) => {
            let limits: Vec<LimitView> = permit.limits().iter().map(LimitView::from).collect();
            let id = permit.detach();
            Json(Granted {
                permit: id.to_string(),
                limits,
            })
            .into_response()
        }
        Outcome::Denied(denied) => {
            let body = denial(&denied);
            let retry_after_ms = body.retry_after_ms;
            rate_limited(body, retry_after_ms)
        }
    })
}

#[utoipa::path(post, path = "/v1/permits/{permit}/commit", tag = "data",
    security(("data" = [])),
    params(("permit" = PermitText, Path, description = "the permit id from /v1/acquire")),
    request_body = CommitBody,
    responses(
        (status = 200, description = "committed: unused units refunded, leases released",
            body = CommitAnswer,
            links(("CommitAgain" = (operation_id = "commit",
                parameters(("permit" = "$request.path.permit")),
                description = "a second commit of the same permit is a 409")))),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, description = "an unknown (or forged) permit",
            body = tollgate_api::schema::NotFoundError),
        (status = 409, description = "the permit was committed already, or its lease expired",
            body = tollgate_api::schema::ConflictError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn commit(
    _: Data,
    State(state): State<AppState>,
    permit: Result<Path<String>, PathRejection>,
    Body(body): Body<CommitBody>,
) -> ApiResult<Json<CommitAnswer>> {
    let permit = path_name(permit, "permit")?;
    let used = body
        .used
        .ok_or_else(|| ApiError::bad_field("used", "is required: the units used, 0 to cost"))?;
    let committed = state.limiter().commit(&permit, used).await?;
    Ok(Json(CommitAnswer {
        refunded: committed.refunded,
        released: committed.released,
    }))
}

#[utoipa::path(post, path = "/v1/permits/{permit}/renew", tag = "data",
    security(("data" = [])),
    params(("permit" = PermitText, Path, description = "the permit id from /v1/acquire")),
    request_body(content = Option<RenewBody>, description = "none, or `{}`"),
    responses(
        (status = 200, description = "every lease of the permit extended by its TTL",
            body = RenewAnswer,
            links(("Commit" = (operation_id = "commit",
                parameters(("permit" = "$request.path.permit")))))),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 404, description = "an unknown (or forged) permit",
            body = tollgate_api::schema::NotFoundError),
        (status = 409, description = "the permit holds no lease (a rate permit), was \
            committed (its leases released), or its lease expired",
            body = tollgate_api::schema::ConflictError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn renew(
    _: Data,
    State(state): State<AppState>,
    permit: Result<Path<String>, PathRejection>,
    Body(_): Body<RenewBody>,
) -> ApiResult<Json<RenewAnswer>> {
    let permit = path_name(permit, "permit")?;
    let expires_in = state.limiter().renew(&permit).await?;
    Ok(Json(RenewAnswer {
        expires_ms: ms_ceil(expires_in),
    }))
}

#[utoipa::path(post, path = "/v1/pause", tag = "data",
    security(("data" = [])),
    request_body = PauseBody,
    responses((status = 200, description = "the pause in force", body = PauseAnswer),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "the limit is unknown", body = tollgate_api::schema::NotFoundError),
        (status = 503, response = Unavailable)))]
pub(crate) async fn pause(
    Data(grant): Data,
    State(state): State<AppState>,
    Body(body): Body<PauseBody>,
) -> ApiResult<Json<PauseAnswer>> {
    check_limit_name(&body.limit).map_err(|reason| ApiError::bad_field("limit", reason))?;
    grant.pause(&body.limit)?;
    let remaining = state
        .limiter()
        .pause(
            &body.limit,
            body.key.as_deref(),
            Duration::from_millis(body.retry_after_ms),
        )
        .await?;
    tracing::info!(limit = %body.limit, paused_ms = ms_ceil(remaining), "paused");
    Ok(Json(PauseAnswer {
        limit: body.limit,
        key: body.key,
        paused_ms: ms_ceil(remaining),
    }))
}

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

// ---- Operations ----------------------------------------------------------------------------

#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "the process runs", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        rules: None,
        store: None,
        rules_problems: None,
    })
}

/// How long readiness waits on the rules database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "ready: the rules database and the store answer",
            body = Health),
        (status = 503, description = "not ready, and why", body = Health)))]
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    let rules = match tokio::time::timeout(READY_TIMEOUT, state.rules().source().ping()).await {
        Ok(Ok(())) => "ok".to_owned(),
        Ok(Err(error)) => format!("unreachable: {error}"),
        Err(_) => "unreachable: no answer within 2 s".to_owned(),
    };
    // One round trip for a shared store; nothing for the memory store.
    let store = if state.is_shutting_down() {
        "shutting down".to_owned()
    } else {
        match tokio::time::timeout(READY_TIMEOUT, state.limiter().store().ping()).await {
            Ok(Ok(())) => "ok".to_owned(),
            Ok(Err(error)) if error.fails_open() => format!("unreachable: {error}"),
            // It answered, but cannot be relied on (e.g. a Redis that may now evict).
            Ok(Err(error)) => format!("failing: {error}"),
            Err(_) => "unreachable: no answer within 2 s".to_owned(),
        }
    };
    let ready = rules == "ok" && store == "ok";
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Health {
            status: if ready {
                "ok".into()
            } else {
                "not ready".into()
            },
            rules: Some(rules),
            store: Some(store),
            rules_problems: Some(state.rules().problems()).filter(|problems| !problems.is_empty()),
        }),
    )
        .into_response()
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format",
        content_type = "text/plain", body = String)))]
pub(crate) async fn metrics(State(state): State<AppState>) -> ApiResult<Response> {
    let text = state
        .metrics()
        .render()
        .map_err(|error| crate::error::internal(error.to_string()))?;
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint; see /openapi.json")
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        Code::BadRequest,
        "method not allowed on this endpoint; see /openapi.json",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire's reason (its schema's enumeration) is the core's name for it, for every reason.
    #[test]
    fn every_reason_is_written_as_the_core_names_it() {
        for reason in DenyReason::ALL {
            let wire = serde_json::to_value(Reason::from(reason)).expect("serializes");
            assert_eq!(wire, reason.as_str());
        }
    }

    /// The server's guide lists every reason where it lists them: a reason added to the core
    /// fails here until the guide says it.
    #[test]
    fn the_guide_names_every_reason() {
        let guide = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/server.md"),
        )
        .expect("docs/server.md");
        for marker in ["| `tollgate_denials_total` |", "reason is capacity"] {
            let line = guide
                .lines()
                .find(|line| line.contains(marker))
                .unwrap_or_else(|| panic!("no line with {marker:?} in docs/server.md"));
            for reason in DenyReason::ALL {
                assert!(line.contains(reason.as_str()), "{marker}: {line}");
            }
        }
    }
}
