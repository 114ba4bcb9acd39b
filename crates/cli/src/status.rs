//! `tollgate status [LIMIT]`: a running server at a glance, from `GET /v1/stats`: each limit's
//! usage now, pauses and holds, waiters, grants and denials; the rules' reload state; the store;
//! the limits of an Envoy configuration. Denial reasons are read from the answer, so a reason
//! the server adds shows without a change here.

use std::time::Duration;

use serde_json::Value;
use tollgate_server::human_duration;

fn number(value: &Value, field: &str) -> u64 {
    value.get(field).and_then(Value::as_u64).unwrap_or(0)
}

fn text<'v>(value: &'v Value, field: &str) -> Option<&'v str> {
    value.get(field).and_then(Value::as_str)
}

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
pub fn table(stats: &Value) -> String {
    let mut rows = vec![
        [
            "LIMIT",
            "KIND",
            "USED",
            "RESETS IN",
            "PAUSED FOR",
            "WAITING",
            "GRANTS",
            "DENIED",
        ]
        .map(str::to_owned),
    ];
    let empty = Vec::new();
    let limits = stats
        .get("limits")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    for limit in limits {
        let rule = limit.get("rule").unwrap_or(&Value::Null);
        let kind = match (text(rule, "kind"), text(rule, "per")) {
            (Some(kind), Some(per)) => format!("{kind} per {per}"),
            (Some(kind), None) => kind.to_owned(),
            (None, _) => "-".to_owned(),
        };
        let name = match text(limit, "key") {
            Some(key) => format!("{} [{key}]", text(limit, "name").unwrap_or("-")),
            None => text(limit, "name").unwrap_or("-").to_owned(),
        };
        let (used, resets, paused) = match limit.get("usage") {
            Some(usage) => (
                format!(
                    "{}/{}",
                    number(usage, "used"),
                    number(usage, "used") + number(usage, "remaining")
                ),
                duration_ms(number(usage, "reset_after_ms")),
                duration_ms(number(usage, "paused_ms")),
            ),
            None if limit.get("usage_error").is_some() => {
                ("unknown".to_owned(), "-".to_owned(), "-".to_owned())
            }
            None => ("(per key)".to_owned(), "-".to_owned(), "-".to_owned()),
        };
        let denied: Vec<String> = limit
            .get("denials")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(reason, count)| {
                Some(count.as_u64()?)
                    .filter(|count| *count > 0)
                    .map(|count| format!("{count} {reason}"))
            })
            .collect();
        rows.push([
            name,
            kind,
            used,
            resets,
            paused,
            number(limit, "waiting").to_string(),
            number(limit, "grants").to_string(),
            if denied.is_empty() {
                "0".to_owned()
            } else {
                denied.join(", ")
            },
        ]);
    }
    let mut out = columns(&rows);
    for limit in limits {
        if let (Some(name), Some(error)) = (text(limit, "name"), text(limit, "usage_error")) {
            out.push_str(&format!("{name}: usage unknown: {error}\n"));
        }
    }
    let rules = stats.get("rules").unwrap_or(&Value::Null);
    let rejected = rules
        .get("rejected")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    out.push_str(&format!(
        "\nrules: version {} from {}; last reload {}; {} reloads failed{}\n",
        number(rules, "version"),
        text(rules, "source").unwrap_or("-"),
        if rules.get("last_reload_ok").and_then(Value::as_bool) == Some(true) {
            "ok"
        } else {
            "FAILED"
        },
        number(rules, "reloads_failed"),
        if rejected > 0 {
            format!("; {rejected} rejected (`tollgate limits list` shows why)")
        } else {
            String::new()
        }
    ));
    let store = stats.get("store").unwrap_or(&Value::Null);
    out.push_str(&format!("store: {}", text(store, "kind").unwrap_or("-")));
    if let (Some(tracked), Some(max)) = (
        store.get("keys_tracked").and_then(Value::as_u64),
        store.get("keys_tracked_max").and_then(Value::as_u64),
    ) {
        out.push_str(&format!(", {tracked} counters tracked of at most {max}"));
    }
    out.push('\n');
    if let Some(envoy) = stats.get("envoy") {
        out.push_str(&envoy_table(envoy));
    }
    out
}

/// The Envoy configuration's limits: one line an entry, what it allows and what was answered.
fn envoy_table(envoy: &Value) -> String {
    let mut rows =
        vec![["ENVOY LIMIT", "NAME", "ALLOWS", "MODE", "OK", "OVER LIMIT"].map(str::to_owned)];
    let empty = Vec::new();
    for limit in envoy
        .get("limits")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
    {
        let allows = if limit.get("unlimited").and_then(Value::as_bool) == Some(true) {
            "unlimited".to_owned()
        } else {
            format!(
                "{} per {}",
                number(limit, "requests_per_unit"),
                text(limit, "unit").unwrap_or("-")
            )
        };
        let shadow = limit.get("shadow_mode").and_then(Value::as_bool) == Some(true);
        rows.push([
            text(limit, "path").unwrap_or("-").to_owned(),
            text(limit, "name").unwrap_or("-").to_owned(),
            allows,
            if shadow { "shadow" } else { "enforced" }.to_owned(),
            number(limit, "ok").to_string(),
            number(limit, "over_limit").to_string(),
        ]);
    }
    let mut out = format!(
        "\nenvoy: {} domains from {}; {} answered ok, {} over limit, {} decided without the store\n",
        number(envoy, "domains"),
        text(envoy, "config").unwrap_or("-"),
        number(envoy, "answered_ok"),
        number(envoy, "answered_over_limit"),
        number(envoy, "store_failures"),
    );
    if let Some(error) = text(envoy, "last_reload_error") {
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

    #[test]
    fn the_table_shows_usage_pauses_and_denials() {
        let stats = json!({
            "limits": [
                {"name": "vendor-x", "rule": {"kind": "rate", "limit": 10},
                 "usage": {"used": 3, "remaining": 7, "reset_after_ms": 850, "paused_ms": 15000},
                 "waiting": 2, "grants": 3,
                 "denials": {"capacity": 4, "paused": 1, "queued": 0, "recovering": 0}},
                {"name": "api", "rule": {"kind": "rate", "per": "user"},
                 "waiting": 0, "grants": 0, "denials": {}},
                {"name": "pool", "rule": {"kind": "concurrency"}, "usage_error": "store down",
                 "waiting": 0, "grants": 0, "denials": {}}
            ],
            "rules": {"version": 3, "source": "table tollgate_limits", "last_reload_ok": true,
                      "reloads_failed": 0, "rejected": [{}]},
            "store": {"kind": "memory", "keys_tracked": 5, "keys_tracked_max": 100}
        });
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
    fn envoy_limits_are_listed_with_their_answers_and_a_refused_edit() {
        let stats = json!({
            "limits": [], "rules": {}, "store": {"kind": "memory"},
            "envoy": {"config": "config/", "domains": 1, "answered_ok": 5,
                      "answered_over_limit": 2, "store_failures": 0,
                      "last_reload_error": "config.yaml: bad unit",
                      "limits": [
                          {"path": "edge.remote_address", "requests_per_unit": 10,
                           "unit": "second", "unlimited": false, "shadow_mode": false,
                           "ok": 5, "over_limit": 2},
                          {"path": "edge.internal", "name": "internal", "unlimited": true,
                           "shadow_mode": true, "ok": 1, "over_limit": 0}
                      ]}
        });
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
