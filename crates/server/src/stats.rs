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
use serde::Deserialize;
use tollgate::{DenyReason, Priority, check_limit_name};
use tollgate_api::admin::RejectedRow;
use tollgate_api::stats::{
    ByPriority, Denials, EnvoyLimit, EnvoyView, HotKey, LimitStats, RulesView, Stats, StoreView,
    UsageView,
};
use utoipa::IntoParams;

use crate::api::{ApiResult, ms_ceil};
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
    #[param(value_type = Option<tollgate_api::schema::LimitName>)]
    limit: Option<String>,
    /// With `limit`, for a limit counted per key: the key whose usage to show.
    #[param(value_type = Option<tollgate_api::schema::Key>)]
    key: Option<String>,
    /// Add each limit's last this many seconds (1 to 3600): one sample a second up to 300,
    /// else one every ten seconds.
    #[param(minimum = 1, maximum = 3600)]
    history: Option<u64>,
}

fn usage_view(rule: &tollgate_rules::Rule, usage: tollgate::store::Usage) -> UsageView {
    let capacity = rule.limit().policy().capacity();
    UsageView {
        used: usage.used,
        capacity,
        remaining: capacity.saturating_sub(usage.used),
        reset_after_ms: ms_ceil(std::time::Duration::from_micros(usage.reset_after_us)),
        paused_ms: ms_ceil(std::time::Duration::from_micros(usage.paused_for_us)),
        held_ms: ms_ceil(std::time::Duration::from_micros(usage.held_for_us)),
    }
}

/// A query string refused, naming the parameter at fault (unknown, repeated, missing or of the
/// wrong type); `parameters` lists the known ones.
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
    let missing = after("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
        .filter(|name| !name.is_empty());
    if let Some(name) = missing {
        return ApiError::bad_field(name, "is required");
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
        (status = 400, response = tollgate_api::schema::BadRequest),
        (status = 401, response = tollgate_api::schema::Unauthorized),
        (status = 403, response = tollgate_api::schema::Forbidden),
        (status = 404, description = "the limit asked for is unknown",
            body = tollgate_api::schema::NotFoundError)))]
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
        let mut denials = Denials::default();
        for reason in DenyReason::ALL {
            denials.count(reason, metrics.denials_of(&name, reason));
        }
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
            learned: state.limiter().learned(&name).map(Into::into),
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
            kind: if memory.is_some() { "memory" } else { "redis" }.to_owned(),
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
                unit: spec.unit.map(|unit| unit.as_str().to_owned()),
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
