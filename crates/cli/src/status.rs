//! `tollgate status [LIMIT]`: a running server at a glance, from `GET /v1/stats`: each limit's
//! usage now, pauses and holds, waiters, grants and denials; the rules' reload state; the store.

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
        let denials = limit.get("denials").unwrap_or(&Value::Null);
        let denied: Vec<String> = ["capacity", "paused", "queued", "recovering"]
            .iter()
            .filter(|reason| number(denials, reason) > 0)
            .map(|reason| format!("{} {reason}", number(denials, reason)))
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
    }
}
