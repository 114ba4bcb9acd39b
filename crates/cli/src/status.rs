//! `tollgate status [LIMIT]`: a running server at a glance, from `GET /v1/stats` read as the
//! wire contract's `Stats`: each limit's usage now, pauses and (apart) holds, waiters, grants and
//! denials; the rules' reload state; the store; the limits of an Envoy configuration. Denial
//! reasons come from the answer's `denials`, which lists every reason the core has.

use std::time::Duration;

use tollgate_api::data::LearnedView;
use tollgate_api::stats::{EnvoyView, Stats};
use tollgate_server::human_duration;

fn duration_ms(ms: u64) -> String {
    if ms == 0 {
        "-".to_owned()
    } else {
        human_duration(Duration::from_millis(ms))
    }
}

/// Rows as left-aligned columns two spaces apart, one line each.
pub(crate) fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The stats as a table for people: a line a limit, then the rules and the store.
pub fn table(stats: &Stats) -> String {
    let mut rows = vec![
        [
            "LIMIT",
            "KIND",
            "USED",
            "RESETS IN",
            "PAUSED FOR",
            "HELD FOR",
            "WAITING",
            "GRANTS",
            "DENIED",
        ]
        .map(str::to_owned),
    ];
    for limit in &stats.limits {
        let kind = match (&limit.rule.kind, &limit.rule.per) {
            (Some(kind), Some(per)) => format!("{kind} per {per}"),
            (Some(kind), None) => kind.clone(),
            (None, _) => "-".to_owned(),
        };
        let name = match &limit.key {
            Some(key) => format!("{} [{key}]", limit.name),
            None => limit.name.clone(),
        };
        let (used, resets, paused, held) = match &limit.usage {
            Some(usage) => (
                format!("{}/{}", usage.used, usage.used + usage.remaining),
                duration_ms(usage.reset_after_ms),
                // `paused_ms` counts a hold too: a pause is shown only where it outlasts it.
                duration_ms(if usage.paused_ms > usage.held_ms {
                    usage.paused_ms
                } else {
                    0
                }),
                duration_ms(usage.held_ms),
            ),
            None => (
                if limit.usage_error.is_some() {
                    "unknown"
                } else {
                    "(per key)"
                }
                .to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
            ),
        };
        let denied: Vec<String> = limit
            .denials
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(reason, count)| format!("{count} {reason}"))
            .collect();
        rows.push([
            name,
            kind,
            used,
            resets,
            paused,
            held,
            limit.waiting.to_string(),
            limit.grants.to_string(),
            if denied.is_empty() {
                "0".to_owned()
            } else {
                denied.join(", ")
            },
        ]);
    }
    let mut out = columns(&rows);
    if stats
        .limits
        .iter()
        .any(|limit| limit.usage.as_ref().is_some_and(|usage| usage.held_ms > 0))
    {
        out.push_str(
            "HELD FOR: a hold after the store lost what it counted (an unclean stop, or a Redis \
             that came back empty), until what was granted before can no longer count; not a \
             pause, and `limits resume` does not lift it (setting recover_on_start)\n",
        );
    }
    for limit in &stats.limits {
        if let Some(error) = &limit.usage_error {
            out.push_str(&format!("{}: usage unknown: {error}\n", limit.name));
        }
        if let Some(learned) = &limit.learned {
            let margin_ms = limit.rule.margin_ms.and_then(|ms| u64::try_from(ms).ok());
            out.push_str(&learned_lines(&limit.name, margin_ms, learned));
        }
    }
    let rules = &stats.rules;
    let rejected = rules.rejected.len();
    out.push_str(&format!(
        "\nrules: version {} from {}; last reload {}; {} reloads failed{}\n",
        rules.version,
        rules.source,
        if rules.last_reload_ok { "ok" } else { "FAILED" },
        rules.reloads_failed,
        if rejected > 0 {
            format!("; {rejected} rejected (`tollgate limits list` shows why)")
        } else {
            String::new()
        }
    ));
    out.push_str(&format!("store: {}", stats.store.kind));
    if let (Some(tracked), Some(max)) = (stats.store.keys_tracked, stats.store.keys_tracked_max) {
        out.push_str(&format!(", {tracked} counters tracked of at most {max}"));
    }
    out.push('\n');
    if let Some(envoy) = &stats.envoy {
        out.push_str(&envoy_table(envoy));
    }
    out
}

/// What vendors taught of a limit, and a warning when callers send later after their grant
/// than the margin covers: a vendor counting arrivals on its own clock may then see more than
/// the limit in one of its windows.
fn learned_lines(name: &str, configured_margin_ms: Option<u64>, learned: &LearnedView) -> String {
    let mut out = String::new();
    if let Some(limit) = &learned.learned {
        let what = match limit.kind.as_str() {
            "rate_limited" => "lowered by rate-limit answers, climbing back a step in",
            _ => "advertised, expires in",
        };
        out.push_str(&format!(
            "{name}: {} of {} in force, from {} ({what} {})\n",
            learned.effective,
            learned.configured,
            limit.source,
            duration_ms(limit.expires_in_ms)
        ));
    }
    if learned.delay_ms > 0 {
        let margin_ms = configured_margin_ms.unwrap_or(0).max(learned.margin_ms);
        out.push_str(&format!(
            "{name}: callers send up to {} after their grant; margin in force {}\n",
            duration_ms(learned.delay_ms),
            duration_ms(margin_ms)
        ));
        if margin_ms < learned.delay_ms {
            out.push_str(&format!(
                "{name}: WARNING: the margin is below the grant-to-send delay seen: a vendor \
                 counting arrivals may see more than the limit in one of its windows; set \
                 margin_ms to at least {}\n",
                learned.delay_ms + tollgate::LEARNED_MARGIN_ALLOWANCE_US / 1_000
            ));
        }
    }
    out
}

/// The Envoy configuration's limits: one line an entry, what it allows and what was answered.
fn envoy_table(envoy: &EnvoyView) -> String {
    let mut rows =
        vec![["ENVOY LIMIT", "NAME", "ALLOWS", "MODE", "OK", "OVER LIMIT"].map(str::to_owned)];
    for limit in &envoy.limits {
        let allows = if limit.unlimited {
            "unlimited".to_owned()
        } else {
            format!(
                "{} per {}",
                limit.requests_per_unit.unwrap_or(0),
                limit.unit.as_deref().unwrap_or("-")
            )
        };
        rows.push([
            limit.path.clone(),
            if limit.name.is_empty() {
                "-"
            } else {
                &limit.name
            }
            .to_owned(),
            allows,
            if limit.shadow_mode {
                "shadow"
            } else {
                "enforced"
            }
            .to_owned(),
            limit.ok.to_string(),
            limit.over_limit.to_string(),
        ]);
    }
    let mut out = format!(
        "\nenvoy: {} domains from {}; {} answered ok, {} over limit, {} decided without the store\n",
        envoy.domains,
        envoy.config,
        envoy.answered_ok,
        envoy.answered_over_limit,
        envoy.store_failures,
    );
    if let Some(error) = &envoy.last_reload_error {
        out.push_str(&format!(
            "envoy: the last edit was REFUSED (the configuration before it stays in force): {error}\n"
        ));
    }
    out.push_str(&columns(&rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The stats a server answers, read as the commands read them.
    fn stats(json: serde_json::Value) -> Stats {
        serde_json::from_value(json).expect("stats as the server answers them")
    }

    fn limit(name: &str, rule: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "rule": rule, "waiting": 0,
               "waiting_by_priority": {"high": 0, "normal": 0, "low": 0},
               "grants": 0, "denials": {}})
    }

    fn rules() -> serde_json::Value {
        json!({"version": 3, "source": "table tollgate_limits", "writable": true,
               "last_reload_ok": true, "reloads_ok": 1, "reloads_failed": 0, "rejected": []})
    }

    #[test]
    fn the_table_shows_usage_pauses_and_denials() {
        let mut vendor = limit("vendor-x", json!({"kind": "rate", "limit": 10}));
        vendor["usage"] = json!({"used": 3, "capacity": 10, "remaining": 7,
            "reset_after_ms": 850, "paused_ms": 15000});
        vendor["waiting"] = json!(2);
        vendor["grants"] = json!(3);
        vendor["denials"] = json!({"capacity": 4, "paused": 1, "queued": 0, "recovering": 0});
        let mut pool = limit("pool", json!({"kind": "concurrency"}));
        pool["usage_error"] = json!("store down");
        let mut rules = rules();
        rules["rejected"] = json!([{"name": "bad", "column": "limit", "reason": "must be at \
            least 1", "previous_in_force": false}]);
        let stats = stats(json!({
            "limits": [vendor, limit("api", json!({"kind": "rate", "per": "user"})), pool],
            "rules": rules,
            "store": {"kind": "memory", "keys_tracked": 5, "keys_tracked_max": 100}
        }));
        let shown = table(&stats);
        let lines: Vec<&str> = shown.lines().collect();
        assert!(lines[0].starts_with("LIMIT"), "{shown}");
        assert!(lines[1].starts_with("vendor-x"), "{shown}");
        for part in ["3/10", "850 ms", "15 s", "4 capacity, 1 paused"] {
            assert!(lines[1].contains(part), "{part}: {shown}");
        }
        assert!(lines[2].contains("rate per user") && lines[2].contains("(per key)"));
        assert!(lines[3].contains("unknown"), "{shown}");
        assert!(shown.contains("pool: usage unknown: store down"), "{shown}");
        assert!(shown.contains("rules: version 3 from table tollgate_limits; last reload ok"));
        assert!(shown.contains("1 rejected"), "{shown}");
        assert!(shown.contains("store: memory, 5 counters tracked of at most 100"));
        assert!(!shown.contains("envoy"), "{shown}");
    }

    #[test]
    fn what_was_learned_is_shown_and_a_margin_below_the_delay_is_warned_of() {
        let mut vendor = limit(
            "vendor-x",
            json!({"kind": "rate", "limit": 20, "margin_ms": 0}),
        );
        vendor["learned"] = json!({"configured": 20, "effective": 10, "delay_ms": 12,
            "margin_ms": 25, "learned": {"limit": 10, "kind": "advertised",
            "source": "x-ratelimit-limit", "expires_in_ms": 540000}});
        let mut slow = limit("slow", json!({"kind": "rate", "limit": 5}));
        slow["learned"] = json!({"configured": 5, "effective": 5, "delay_ms": 300,
            "margin_ms": 100, "learned": null});
        let shown = table(&stats(json!({
            "limits": [vendor, slow], "rules": rules(), "store": {"kind": "memory"}
        })));
        assert!(
            shown.contains(
                "vendor-x: 10 of 20 in force, from x-ratelimit-limit (advertised, expires in 9 min)"
            ),
            "{shown}"
        );
        assert!(
            shown.contains(
                "vendor-x: callers send up to 12 ms after their grant; margin in force 25 ms"
            ),
            "{shown}"
        );
        assert!(!shown.contains("vendor-x: WARNING"), "{shown}");
        assert!(
            shown.contains("slow: WARNING: the margin is below"),
            "{shown}"
        );
        assert!(shown.contains("set margin_ms to at least 310"), "{shown}");
    }

    #[test]
    fn envoy_limits_are_listed_with_their_answers_and_a_refused_edit() {
        let stats = stats(json!({
            "limits": [], "rules": rules(), "store": {"kind": "memory"},
            "envoy": {"config": "config/", "domains": 1, "reloads_ok": 1, "reloads_failed": 1,
                      "answered_ok": 5, "answered_over_limit": 2, "store_failures": 0,
                      "last_reload_error": "config.yaml: bad unit",
                      "limits": [
                          {"path": "edge.remote_address", "requests_per_unit": 10,
                           "unit": "second", "unlimited": false, "shadow_mode": false,
                           "ok": 5, "over_limit": 2},
                          {"path": "edge.internal", "name": "internal", "unlimited": true,
                           "shadow_mode": true, "ok": 1, "over_limit": 0}
                      ]}
        }));
        let shown = table(&stats);
        assert!(shown.contains("envoy: 1 domains from config/; 5 answered ok, 2 over limit"));
        assert!(
            shown.contains("REFUSED") && shown.contains("bad unit"),
            "{shown}"
        );
        let line = shown
            .lines()
            .find(|line| line.starts_with("edge.remote_address"))
            .expect("listed");
        for part in ["10 per second", "enforced", "5", "2"] {
            assert!(line.contains(part), "{part}: {shown}");
        }
        let line = shown
            .lines()
            .find(|line| line.starts_with("edge.internal"))
            .expect("listed");
        assert!(line.contains("internal") && line.contains("unlimited") && line.contains("shadow"));
    }
}
