//! `GET /v1/stats`: what an operator wants to see at a glance, as one JSON document (for
//! `tollgate status`, dashboards and scripts): every limit with its rule, its usage read from the
//! store now, its waiters, grants and denials; the rules' reload state; the store's.
//!
//! Usage is read from the store and changes nothing (`Limiter::usage`); a limit counted per key
//! has one counter per key, so its usage is shown for the key asked for (`?limit=&key=`).
//! `?history=SECONDS` adds each limit's recent past, which `sample` records every second
//! (`history`). The limits of an Envoy configuration, decided apart from the rules, are listed
//! under `envoy`.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};
use tollgate::{DenyReason, Priority, check_limit_name};
use tollgate_rules::RawRule;
use utoipa::{IntoParams, ToSchema};

use crate::api::{ApiResult, RejectedRow, ms_ceil};
use crate::error::ApiError;
use crate::extract::Data;
use crate::state::AppState;

/// Hottest keys shown per limit counted per key.
const HOT_KEYS_SHOWN: usize = 5;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct StatsQuery {
    /// Only this limit.
    #[param(value_type = Option<crate::openapi::LimitName>)]
    limit: Option<String>,
    /// With `limit`, for a limit counted per key: the key whose usage to show.
    #[param(value_type = Option<crate::openapi::Key>)]
    key: Option<String>,
    /// Add each limit's last this many seconds (1 to 3600): one sample a second up to 300,
    /// else one every ten seconds.
    #[param(minimum = 1, maximum = 3600)]
    history: Option<u64>,
}

/// The server at a glance.
#[derive(Serialize, ToSchema)]
pub(crate) struct Stats {
    /// The limits in force (or the one asked for), by name.
    limits: Vec<LimitStats>,
    rules: RulesView,
    store: StoreView,
    /// The Envoy configuration served over gRPC, when there is one (and the caller's token is
    /// not scoped to some limits).
    #[serde(skip_serializing_if = "Option::is_none")]
    envoy: Option<EnvoyView>,
}

/// Envoy's rate limit service: its configuration, and each entry that has a limit.
#[derive(Serialize, ToSchema)]
pub(crate) struct EnvoyView {
    /// The file or directory the configuration is read from.
    config: String,
    domains: u64,
    reloads_ok: u64,
    reloads_failed: u64,
    /// Why the last edit was refused (the configuration in force stays as it was); absent when
    /// the last read succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_reload_error: Option<String>,
    /// `ShouldRateLimit` answers since the server started, by overall code.
    answered_ok: u64,
    answered_over_limit: u64,
    /// Requests decided without the store, because it could not answer.
    store_failures: u64,
    limits: Vec<EnvoyLimit>,
}

/// One entry of the configuration with a limit.
#[derive(Serialize, ToSchema)]
pub(crate) struct EnvoyLimit {
    /// The entry's place: its domain, then each level's `key` or `key_value`, joined by `.`.
    path: String,
    /// The entry's `name`, if it has one (what `replaces` refers to).
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    /// Requests per unit; absent when unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    requests_per_unit: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<&'static str>,
    unlimited: bool,
    shadow_mode: bool,
    /// The counter it counts in the store (per descriptor value), when it counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    counter: Option<String>,
    /// Descriptors that found this entry, answered `OK` and `OVER_LIMIT`, since the
    /// configuration was read.
    ok: u64,
    over_limit: u64,
}

/// One limit: its rule, what its counter holds now, and what the server has decided on it.
#[derive(Serialize, ToSchema)]
pub(crate) struct LimitStats {
    name: String,
    /// The rule in force, as `GET /v1/limits/{name}` shows it.
    rule: RawRule,
    /// The key whose usage is shown, for a limit counted per key.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// The counter now; absent for a limit counted per key when no key was asked for, or when
    /// the store did not answer (then `usage_error` says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage_error: Option<String>,
    /// A limit counted per key, when no key was asked for: the keys asked for most since the
    /// server started (an estimate that never misses a key asked for often), with their usage.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    hot_keys: Vec<HotKey>,
    /// Acquires waiting for room on this limit now.
    waiting: u64,
    /// The same, by priority.
    waiting_by_priority: ByPriority,
    /// Acquires granted since the server started.
    grants: u64,
    /// Acquires not granted within their wait since the server started, by reason.
    denials: Denials,
    /// With `?history=`: the limit's recent past; absent when the server keeps none for it
    /// (it keeps the first 1,000 limits by name).
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<crate::history::Series>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct UsageView {
    /// Units (rate) or lease slots (concurrency) counted now.
    used: u64,
    /// What the counter can hold at once: the limit, or a GCRA limit's burst.
    capacity: u64,
    /// What could be held at once (the limit, or a GCRA limit's burst) less what is used: what
    /// the highest priority could still take.
    remaining: u64,
    /// Milliseconds until every unit counted now stops counting.
    reset_after_ms: u64,
    /// Milliseconds until a pause (or a hold after a loss of state) ends; 0 when none is on.
    paused_ms: u64,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct HotKey {
    key: String,
    /// Requests for this key (acquires and checks), counted since the server started; an upper
    /// bound for a key that entered the count late.
    requests: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageView>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct ByPriority {
    high: u64,
    normal: u64,
    low: u64,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct Denials {
    capacity: u64,
    paused: u64,
    queued: u64,
    recovering: u64,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct RulesView {
    /// Grows with every change of the rules in force.
    version: u64,
    /// Where the rules come from: `table NAME` or `file PATH`.
    source: String,
    /// Whether the admin API can change the limits (false when they come from a file).
    writable: bool,
    /// Whether the last reload read the source.
    last_reload_ok: bool,
    /// Why the last reload failed (the rules in force stay as they were); absent when it read.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_reload_error: Option<String>,
    reloads_ok: u64,
    reloads_failed: u64,
    /// Rows (or file entries) not in force as written.
    rejected: Vec<RejectedRow>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct StoreView {
    /// `memory` or `redis`.
    kind: &'static str,
    /// Memory store: counters tracked now, and at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    keys_tracked: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    keys_tracked_max: Option<u64>,
}

fn usage_view(rule: &tollgate_rules::Rule, usage: tollgate::store::Usage) -> UsageView {
    let capacity = rule.limit().policy().capacity();
    UsageView {
        used: usage.used,
        capacity,
        remaining: capacity.saturating_sub(usage.used),
        reset_after_ms: ms_ceil(std::time::Duration::from_micros(usage.reset_after_us)),
        paused_ms: ms_ceil(std::time::Duration::from_micros(usage.paused_for_us)),
    }
}

/// A query string refused, naming the parameter at fault; `parameters` lists the known ones.
/// serde names an unknown or repeated parameter in back-quotes, and the name may hold
/// back-quotes itself: it ends where serde's own words begin. One with no name (`?=x`) cannot
/// be named: the query string as a whole is, as `query`.
pub(crate) fn query_error(text: &str, parameters: &str) -> ApiError {
    let after = |prefix: &str| text.split_once(prefix).map(|(_, rest)| rest);
    let unknown = after("unknown field `").and_then(|rest| {
        let end = rest
            .rfind("`, expected")
            .or_else(|| rest.rfind("`, there are no fields"))?;
        Some(&rest[..end]).filter(|name| !name.is_empty())
    });
    if let Some(name) = unknown {
        return ApiError::bad_field(
            name,
            format!("unknown parameter; the parameters are {parameters}"),
        );
    }
    let repeated = after("duplicate field `")
        .and_then(|rest| rest.strip_suffix('`'))
        .filter(|name| !name.is_empty());
    if let Some(name) = repeated {
        return ApiError::bad_field(name, "is given more than once");
    }
    let reason = text.trim_start_matches("Failed to deserialize query string: ");
    // A value of the wrong type is reported as `name: reason`: the parameter is named.
    if let Some((name, why)) = reason.split_once(": ")
        && !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        && parameters.split([' ', ',']).any(|known| known == name)
    {
        return ApiError::bad_field(name, why);
    }
    ApiError::bad_field("query", reason)
}

#[utoipa::path(get, path = "/v1/stats", tag = "data",
    security(("data" = [])),
    params(StatsQuery),
    responses((status = 200, description = "the server at a glance", body = Stats),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 403, response = crate::openapi::Forbidden),
        (status = 404, description = "the limit asked for is unknown",
            body = crate::openapi::NotFoundError)))]
pub(crate) async fn stats(
    Data(grant): Data,
    State(state): State<AppState>,
    query: Result<Query<StatsQuery>, QueryRejection>,
) -> ApiResult<Json<Stats>> {
    let Query(query) =
        query.map_err(|rejection| query_error(&rejection.body_text(), "limit, key and history"))?;
    if let Some(seconds) = query.history
        && !(1..=crate::history::SPAN_S_MAX).contains(&seconds)
    {
        return Err(ApiError::bad_field(
            "history",
            format!("must be from 1 to {} (seconds)", crate::history::SPAN_S_MAX),
        ));
    }
    let asked_at = std::time::Instant::now();
    if let Some(limit) = &query.limit {
        check_limit_name(limit).map_err(|reason| ApiError::bad_field("limit", reason))?;
        grant.limit(limit)?;
    } else if query.key.is_some() {
        return Err(ApiError::bad_field(
            "key",
            "needs `limit`: a key names one counter of one limit",
        ));
    }
    let snapshot = state.rules().snapshot();
    let rules: Vec<_> = match &query.limit {
        Some(name) => vec![
            snapshot
                .get(name)
                .cloned()
                .ok_or_else(|| ApiError::not_found(format!("unknown limit {name:?}")))?,
        ],
        // A scoped token sees its own limits only.
        None => snapshot
            .iter()
            .filter(|rule| grant.covers(rule.name()))
            .cloned()
            .collect(),
    };
    let metrics = state.metrics();
    state
        .hot_keys()
        .retain(|limit| snapshot.get(limit).is_some());
    let mut limits = Vec::with_capacity(rules.len());
    for rule in rules {
        let name = rule.name().to_owned();
        let per_key = rule.limit().per().is_some();
        let key = query.key.clone().filter(|_| per_key);
        if query.key.is_some() && !per_key {
            return Err(ApiError::bad_field(
                "key",
                format!("limit {name:?} is not counted per key"),
            ));
        }
        let (usage, usage_error) = if per_key && key.is_none() {
            (None, None)
        } else {
            match state.limiter().usage(&name, key.as_deref()).await {
                Ok(usage) => (Some(usage_view(&rule, usage)), None),
                Err(error) => (None, Some(error.to_string())),
            }
        };
        let mut hot_keys = Vec::new();
        if per_key && key.is_none() {
            for (hot, requests) in state.hot_keys().top(&name, HOT_KEYS_SHOWN) {
                let usage = state
                    .limiter()
                    .usage(&name, Some(&hot))
                    .await
                    .ok()
                    .map(|usage| usage_view(&rule, usage));
                hot_keys.push(HotKey {
                    key: hot,
                    requests,
                    usage,
                });
            }
        }
        let denied = |reason| metrics.denials_of(&name, reason);
        let denials = Denials {
            capacity: denied(DenyReason::Capacity),
            paused: denied(DenyReason::Paused),
            queued: denied(DenyReason::Queued),
            recovering: denied(DenyReason::Recovering),
        };
        let history = query
            .history
            .and_then(|seconds| state.history().series(&name, seconds, asked_at));
        limits.push(LimitStats {
            rule: rule.canonical().clone(),
            key,
            usage,
            usage_error,
            hot_keys,
            waiting: metrics.waiting_on(&name),
            waiting_by_priority: ByPriority {
                high: metrics.waiting_at(&name, Priority::High),
                normal: metrics.waiting_at(&name, Priority::Normal),
                low: metrics.waiting_at(&name, Priority::Low),
            },
            grants: metrics.grants_of(&name),
            denials,
            history,
            name,
        });
    }
    let rules_stats = state.rules().stats();
    use std::sync::atomic::Ordering::Relaxed;
    let memory = metrics.memory();
    Ok(Json(Stats {
        limits,
        rules: RulesView {
            version: snapshot.version(),
            source: state.rules().source().describe(),
            writable: matches!(state.rules().source(), tollgate_rules::RulesSource::Sql(_)),
            last_reload_ok: rules_stats.last_reload_ok.load(Relaxed),
            last_reload_error: rules_stats.last_error(),
            reloads_ok: rules_stats.reloads_ok.load(Relaxed),
            reloads_failed: rules_stats.reloads_failed.load(Relaxed),
            rejected: snapshot
                .rejected()
                .iter()
                .filter(|row| grant.covers(&row.name))
                .map(RejectedRow::from)
                .collect(),
        },
        store: StoreView {
            kind: if memory.is_some() { "memory" } else { "redis" },
            keys_tracked: memory.map(|memory| memory.len() as u64),
            keys_tracked_max: memory.map(|_| state.config().keys_tracked_max),
        },
        envoy: match grant {
            crate::tokens::Grant::Full => metrics.envoy().map(|watch| envoy_view(watch)),
            // Envoy's entries are not limits a scoped token can name.
            crate::tokens::Grant::Scoped(_) => None,
        },
    }))
}

fn envoy_view(watch: &tollgate_envoy::ConfigWatch) -> EnvoyView {
    use std::sync::atomic::Ordering::Relaxed;
    let config = watch.current();
    let stats = watch.stats();
    EnvoyView {
        config: watch.path().display().to_string(),
        domains: config.domains().count() as u64,
        reloads_ok: stats.reloads_ok.load(Relaxed),
        reloads_failed: stats.reloads_failed.load(Relaxed),
        last_reload_error: watch.last_error(),
        answered_ok: stats.answered_ok.load(Relaxed),
        answered_over_limit: stats.answered_over_limit.load(Relaxed),
        store_failures: stats.store_failures.load(Relaxed),
        limits: config
            .limits()
            .into_iter()
            .map(|spec| EnvoyLimit {
                path: spec.path.clone(),
                name: spec.name.clone(),
                requests_per_unit: (!spec.unlimited).then_some(spec.requests_per_unit),
                unit: spec.unit.map(tollgate_envoy::Unit::as_str),
                unlimited: spec.unlimited,
                shadow_mode: spec.shadow_mode,
                counter: spec.policy.as_ref().map(|_| spec.counter.clone()),
                ok: spec.answers.ok.load(Relaxed),
                over_limit: spec.answers.over_limit.load(Relaxed),
            })
            .collect(),
    }
}

/// Take one sample of every limit in force for the history (`history`): its counter (when it
/// has one counter), its grants and denials so far, its waiters.
pub(crate) async fn sample(state: &AppState) {
    let snapshot = state.rules().snapshot();
    let metrics = state.metrics();
    let mut rules: Vec<_> = snapshot.iter().collect();
    rules.sort_by(|a, b| a.name().cmp(b.name()));
    let mut readings = Vec::with_capacity(rules.len().min(crate::history::LIMITS_MAX));
    // A store found unreachable is not asked again in this sample: an unreachable Redis would
    // otherwise hold the sample for a timeout per limit.
    let mut store_answers = true;
    for rule in rules.into_iter().take(crate::history::LIMITS_MAX) {
        let name = rule.name();
        let used = match rule.limit().per() {
            Some(_) => None,
            None if store_answers => match state.limiter().usage(name, None).await {
                Ok(usage) => Some(usage.used),
                Err(error) => {
                    // Unreachable, not merely a limit gone since the snapshot.
                    store_answers = !error.fails_open();
                    None
                }
            },
            None => None,
        };
        readings.push(crate::history::Reading {
            name: name.to_owned(),
            used,
            grants: metrics.grants_of(name),
            denials: DenyReason::ALL
                .into_iter()
                .map(|reason| metrics.denials_of(name, reason))
                .sum(),
            waiting: metrics.waiting_on(name),
        });
    }
    state.history().record(std::time::Instant::now(), readings);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(query: &str) -> Option<String> {
        let uri: axum::http::Uri = format!("/v1/stats?{query}").parse().expect("a URI");
        let rejection = Query::<StatsQuery>::try_from_uri(&uri).expect_err("refused");
        query_error(&rejection.body_text(), "limit, key and history").field
    }

    #[test]
    fn a_refused_query_names_its_parameter() {
        assert_eq!(field("bogus=1").as_deref(), Some("bogus"));
        assert_eq!(field("limit=a&limit=b").as_deref(), Some("limit"));
        assert_eq!(field("limit=a&=x").as_deref(), Some("query"));
        // A name holding back-quotes is named whole (a fuzzed case: `%C3%AF%C3%B6%60`).
        assert_eq!(field("%C3%AF%C3%B6%60=1").as_deref(), Some("ïö`"));
        assert_eq!(field("a%60%2C%20b=1").as_deref(), Some("a`, b"));
        // A known parameter with a value of the wrong type is named too.
        assert_eq!(field("history=an-hour").as_deref(), Some("history"));
        assert_eq!(field("history=-1").as_deref(), Some("history"));
    }
}
