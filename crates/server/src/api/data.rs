//! The data plane: acquire, commit, renew and pause; and what every decision answers and
//! counts (the 429 and its body, the hottest keys, grants and denials), which `/v1/check`
//! shares.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tollgate::{Denied, DenyReason, Outcome, Priority, Request, check_limit_name};
use tollgate_api::data::{
    AcquireBody, ChargeAnswer, ChargeBody, ChargedView, CommitAnswer, CommitBody, Granted,
    LearnAnswer, LearnBody, LimitView, PauseAnswer, PauseBody, RateLimited, RenewAnswer, RenewBody,
    SENT_AFTER_MS_MAX, Used, WAIT_MS_MAX,
};
use tollgate_api::schema::{BadRequest, Forbidden, PermitText, Unauthorized, Unavailable};
use tollgate_api::{Code, ErrorDetail, Reason};

use super::{ApiResult, ms_ceil, path_name};
use crate::error::ApiError;
use crate::extract::{Body, Data};
use crate::metrics::{DenialLabels, LimitLabels};
use crate::state::AppState;
use crate::tokens::Grant;

/// The `Server-Timing` field of a granted acquire, and its metric's name.
const SERVER_TIMING: header::HeaderName = header::HeaderName::from_static("server-timing");
pub const SERVER_TIMING_METRIC: &str = "acquire";

pub(super) fn denial(denied: &Denied) -> RateLimited {
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
            // Not used up: what is left is kept for higher priorities, and `remaining` (open
            // to this priority) would otherwise read as an empty limit.
            DenyReason::Capacity if denied.kept.is_some() => format!(
                "not granted: {}; retry after {retry_after_ms} ms",
                denied.kept.as_ref().map(kept_clause).unwrap_or_default()
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

/// A capacity denial's clause when the limit is not used up: its units left are kept by its
/// `reserve` for higher priorities.
pub(crate) fn kept_clause(kept: &tollgate::Kept) -> String {
    let (units, are) = if kept.left == 1 {
        ("1 unit".to_owned(), "is")
    } else {
        (format!("{} units", kept.left), "are")
    };
    format!(
        "the {units} left of limit {:?} {are} {} (its reserve)",
        kept.limit,
        crate::KEPT_FOR_HIGHER_PRIORITY
    )
}

/// A 429 with `body`, and `Retry-After` in whole seconds, rounded up.
pub(super) fn rate_limited(body: impl Serialize, retry_after_ms: u64) -> Response {
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
pub(super) fn observe_key(state: &AppState, names: &[&str], key: &str) {
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

pub(super) fn count_outcome(state: &AppState, names: &[&str], outcome: &Outcome) {
    let denied = match outcome {
        Outcome::Granted(_) => None,
        Outcome::Denied(denied) => Some(denied),
    };
    count_decision(state, names, denied);
}

/// Count a grant (`denied` is `None`) or a denial on every limit of a request.
pub(super) fn count_decision(state: &AppState, names: &[&str], denied: Option<&Denied>) {
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
            headers(("Server-Timing" = String, description = "`acquire;dur=MS`: how long the \
                server held the request, in milliseconds (fractional). A caller subtracts it \
                from its round trip to know when the grant was made, for `sent_after_ms`")),
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
    let received = Instant::now();
    for (index, name) in body.limits.iter().enumerate() {
        check_limit_name(name)
            .map_err(|reason| ApiError::bad_field(format!("limits[{index}]"), reason))?;
    }
    let asked_priority = grant.priority(priority(body.priority.as_deref())?)?;
    for name in &body.limits {
        grant.limit(name)?;
    }
    let cost = grant.cost(body.cost.unwrap_or(1))?;
    let names: Vec<&str> = body.limits.iter().map(String::as_str).collect();
    let costs = costs_by_limit(&grant, &names, cost, body.costs.as_ref())?;
    if body.wait_ms.is_some_and(|ms| ms > WAIT_MS_MAX) {
        return Err(ApiError::bad_field(
            "wait_ms",
            format!("must be at most {WAIT_MS_MAX} (2^53)"),
        ));
    }
    let mut wait_ms = grant.wait_ms(body.wait_ms.unwrap_or(0).min(state.config().wait_ms_max));
    // One token's waiting requests are bounded, so that it cannot fill the lines of the
    // limits outside its scope; past the bound its request is decided at once.
    let most = state.config().waiters_per_token_max;
    let wait_place = (wait_ms > 0)
        .then(|| grant.wait_place(state.tokens(), most))
        .flatten();
    let token_full = wait_ms > 0 && wait_place.is_none();
    if token_full {
        wait_ms = 0;
    }
    let mut request = Request::all(&names)
        .cost(cost)
        .priority(asked_priority)
        .wait(Duration::from_millis(wait_ms))
        .refundable(body.refundable.unwrap_or(true));
    if let Some(costs) = &costs {
        request = request.costs(costs);
    }
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
            let mut response = Json(Granted {
                permit: id.to_string(),
                limits,
            })
            .into_response();
            // How long the server held the request: the caller subtracts it from its round
            // trip to learn how long the answer took to reach it (docs/outbound.md).
            let held_ms = received.elapsed().as_secs_f64() * 1_000.0;
            if let Ok(value) =
                HeaderValue::from_str(&format!("{SERVER_TIMING_METRIC};dur={held_ms:.3}"))
            {
                response.headers_mut().insert(SERVER_TIMING, value);
            }
            response
        }
        Outcome::Denied(denied) => {
            let mut body = denial(&denied);
            if token_full {
                body.error.message = format!(
                    "not queued to wait: {most} requests of this token already wait, the most \
                     that may (waiters_per_token_max); {}",
                    body.error.message
                );
            }
            let retry_after_ms = body.retry_after_ms;
            rate_limited(body, retry_after_ms)
        }
    })
}

/// `costs` as one cost per limit in `names`' order (a limit not named takes `cost`), each
/// within the token's scope; `None` when no cost differs from `cost`.
fn costs_by_limit(
    grant: &Grant,
    names: &[&str],
    cost: u64,
    costs: Option<&std::collections::BTreeMap<String, u64>>,
) -> ApiResult<Option<Vec<u64>>> {
    let Some(costs) = costs.filter(|costs| !costs.is_empty()) else {
        return Ok(None);
    };
    if let Some(name) = costs.keys().find(|name| !names.contains(&name.as_str())) {
        return Err(ApiError::bad_field(
            format!("costs.{name}"),
            "names a limit that is not among limits",
        ));
    }
    let mut each = Vec::with_capacity(names.len());
    for name in names {
        let asked = costs.get(*name).copied().unwrap_or(cost);
        if asked == 0 || asked > tollgate::core::UNITS_MAX {
            return Err(ApiError::bad_field(
                format!("costs.{name}"),
                format!("must be between 1 and {}", tollgate::core::UNITS_MAX),
            ));
        }
        each.push(grant.cost(asked)?);
    }
    Ok(Some(each))
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
    if body.sent_after_ms.is_some_and(|ms| ms > SENT_AFTER_MS_MAX) {
        return Err(ApiError::bad_field(
            "sent_after_ms",
            format!("must be at most {SENT_AFTER_MS_MAX} (an hour)"),
        ));
    }
    let committed = match &used {
        Used::All(units) => state.limiter().commit(&permit, *units).await?,
        Used::Each(each) => {
            let each: Vec<(&str, u64)> = each
                .iter()
                .map(|(name, units)| (name.as_str(), *units))
                .collect();
            state
                .limiter()
                .commit_used(&permit, tollgate::Used::Each(&each))
                .await?
        }
    };
    if let Some(sent_after_ms) = body.sent_after_ms {
        // The permit was just settled by this id, so it decodes; a failure here changes nothing
        // the commit did.
        let delay = Duration::from_millis(sent_after_ms);
        match state.limiter().note_sent(&permit, delay) {
            Ok(widened) => {
                for limit in widened {
                    state.learning().delay(&limit, delay).await;
                }
            }
            Err(error) => tracing::debug!(%error, "grant-to-send delay not noted"),
        }
    }
    Ok(Json(CommitAnswer {
        refunded: committed.refunded,
        released: committed.released,
    }))
}

#[utoipa::path(post, path = "/v1/charge", tag = "data",
    security(("data" = [])),
    request_body = ChargeBody,
    responses(
        (status = 200, description = "counted, even past the limits: later grants wait it out",
            body = ChargeAnswer),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "a limit named is unknown", body = tollgate_api::schema::NotFoundError),
        (status = 503, response = Unavailable)))]
/// Units spent beyond any grant: what a vendor counted over a permit's cost (a language model's
/// answer longer than its estimate). Counted on each limit at once, past the limit if need be
/// (at most one capacity past it), so that every later acquire in the fleet waits the debt
/// out. Never denied; rate limits only.
pub(crate) async fn charge(
    Data(grant): Data,
    State(state): State<AppState>,
    Body(body): Body<ChargeBody>,
) -> ApiResult<Json<ChargeAnswer>> {
    for (index, name) in body.limits.iter().enumerate() {
        check_limit_name(name)
            .map_err(|reason| ApiError::bad_field(format!("limits[{index}]"), reason))?;
    }
    for name in &body.limits {
        grant.limit(name)?;
    }
    let cost = grant.cost(body.cost.unwrap_or(1))?;
    let names: Vec<&str> = body.limits.iter().map(String::as_str).collect();
    let costs = costs_by_limit(&grant, &names, cost, body.costs.as_ref())?;
    let mut request = Request::all(&names).cost(cost);
    if let Some(costs) = &costs {
        request = request.costs(costs);
    }
    if let Some(key) = body.key.as_deref() {
        request = request.key(key);
        observe_key(&state, &names, key);
    }
    let charged = state.limiter().charge(&request).await?;
    Ok(Json(ChargeAnswer {
        limits: charged
            .into_iter()
            .map(|charged| ChargedView {
                name: charged.name,
                charged: charged.charged,
                used: charged.usage.used,
                reset_ms: ms_ceil(Duration::from_micros(charged.usage.reset_after_us)),
            })
            .collect(),
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

#[utoipa::path(post, path = "/v1/learn", tag = "data",
    security(("data" = [])),
    request_body = LearnBody,
    responses((status = 200, description = "what the limit decides under now", body = LearnAnswer),
        (status = 400, response = BadRequest), (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, description = "the limit is unknown", body = tollgate_api::schema::NotFoundError),
        (status = 503, response = Unavailable)))]
/// A vendor's answer about a limit, told by an outbound client: its advertised quotas lower
/// the limit in force, `remaining` 0 pauses it until `reset_ms`, and a rate-limit answer that
/// advertised nothing halves it. Lowering a limit is a power like pausing it: a data token
/// needs `may_pause`. Bounded: never above the configured limit nor below the floor, and it
/// runs out (docs/outbound.md).
pub(crate) async fn learn(
    Data(grant): Data,
    State(state): State<AppState>,
    Body(body): Body<LearnBody>,
) -> ApiResult<Json<LearnAnswer>> {
    check_limit_name(&body.limit).map_err(|reason| ApiError::bad_field("limit", reason))?;
    grant.pause(&body.limit)?;
    let mut quotas = Vec::with_capacity(body.quotas.len());
    for (index, quota) in body.quotas.iter().enumerate() {
        let window = match quota.window_ms {
            Some(0) => {
                return Err(ApiError::bad_field(
                    format!("quotas[{index}].window_ms"),
                    "must be at least 1",
                ));
            }
            Some(ms) if ms > tollgate::SPAN_US_MAX / 1_000 => {
                return Err(ApiError::bad_field(
                    format!("quotas[{index}].window_ms"),
                    "must be at most 366 days",
                ));
            }
            other => other.map(Duration::from_millis),
        };
        quotas.push(tollgate::AdvertisedQuota {
            quota: quota.quota,
            window,
        });
    }
    let lesson = tollgate::Lesson {
        source: &body.source,
        quotas: &quotas,
        rate_limited: body.rate_limited,
    };
    let learned = state.limiter().learn(&body.limit, &lesson)?;
    state.learning().lesson(&body.limit, &lesson).await;
    let mut paused_ms = 0;
    if body.remaining == Some(0)
        && let Some(reset_ms) = body.reset_ms.filter(|ms| *ms > 0)
    {
        let left = state
            .limiter()
            .vendor_exhausted(&body.limit, Duration::from_millis(reset_ms))
            .await?;
        paused_ms = ms_ceil(left);
    }
    tracing::info!(limit = %body.limit, source = %body.source, effective = learned.effective,
        configured = learned.configured, paused_ms, "learned");
    Ok(Json(LearnAnswer::new(
        body.limit,
        learned.into(),
        paused_ms,
    )))
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
            tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR"))
                .join("../../docs/server.md"),
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
