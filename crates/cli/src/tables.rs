//! `limits` and `tokens` records as tables for people, one a line, in `status`'s columns.

use crate::status;

/// Tokens as a table, one a line.
pub(crate) fn tokens_table(json: &serde_json::Value) -> String {
    use serde_json::Value;
    let mut rows = vec![["NAME", "LIMITS", "PRIORITY_MAX", "MAY_PAUSE"].map(str::to_owned)];
    let tokens = json.get("tokens").and_then(Value::as_array);
    for token in tokens.into_iter().flatten() {
        let text = |field: &str| token.get(field).and_then(Value::as_str).unwrap_or("-");
        let limits: Vec<&str> = token
            .get("limits")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let may_pause = token.get("may_pause").and_then(Value::as_bool) == Some(true);
        rows.push([
            text("name").to_owned(),
            limits.join(","),
            text("priority_max").to_owned(),
            if may_pause { "yes" } else { "no" }.to_owned(),
        ]);
    }
    status::columns(&rows)
}

/// Limits as a table, one a line, and the rows of the rules table that are not in force.
pub(crate) fn limits_table(json: &serde_json::Value) -> String {
    use serde_json::Value;
    let text = |value: Option<&Value>| match value {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => "-".to_owned(),
        Some(other) => other.to_string(),
    };
    let limits: Vec<&Value> = match json.get("limits") {
        Some(Value::Array(limits)) => limits.iter().collect(),
        _ => vec![json],
    };
    let mut rows = vec![
        [
            "NAME",
            "KIND",
            "LIMIT",
            "PERIOD_MS",
            "LEASE_TTL_MS",
            "ALGORITHM",
            "PER",
            "MATCH",
        ]
        .map(str::to_owned),
    ];
    for limit in limits {
        let matched = limit
            .get("match")
            .map(|m| format!("{} {}", text(m.get("method")), text(m.get("path"))));
        rows.push([
            text(limit.get("name")),
            text(limit.get("kind")),
            text(limit.get("limit")),
            text(limit.get("period_ms")),
            text(limit.get("lease_ttl_ms")),
            text(limit.get("algorithm")),
            text(limit.get("per")),
            matched.unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    let mut table = status::columns(&rows);
    if let Some(Value::Array(rejected)) = json.get("rejected")
        && !rejected.is_empty()
    {
        table.push_str("\nrejected rows (not in force as written):\n");
        for row in rejected {
            let line = format!(
                "{} {}: {}\n",
                text(row.get("name")),
                text(row.get("column")),
                text(row.get("reason"))
            );
            table.push_str(&line);
        }
    }
    table
}
