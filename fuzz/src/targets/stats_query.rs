//! `GET /v1/stats?QUERY` through the server's router: any query gets a documented answer, every
//! refusal names its field (an unknown parameter by its name), and an answer shows the one limit
//! asked for, or all of them.

use crate::{Api, BASE_LIMITS, check_answer, uri_with};
use http::Method;

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(query: &[u8]) {
    let Ok(query) = std::str::from_utf8(query) else {
        return;
    };
    let api = Api::get();
    let answer = api.data(Method::GET, &uri_with("/v1/stats?", query, ""), b"");
    check_answer(&answer, &[200, 400, 404]);
    if answer.status != 200 {
        return;
    }
    let json = answer.json.as_ref().expect("JSON");
    let limits = json
        .get("limits")
        .and_then(serde_json::Value::as_array)
        .expect("limits");
    assert!(
        limits.len() == 1 || limits.len() == BASE_LIMITS.len(),
        "{} limits shown",
        limits.len()
    );
    for limit in limits {
        let name = limit.get("name").and_then(|n| n.as_str()).expect("a name");
        assert!(BASE_LIMITS.iter().any(|(base, _)| *base == name), "{name}");
        assert_eq!(
            limit.pointer("/rule/name").and_then(|n| n.as_str()),
            Some(name)
        );
    }
    assert!(json.pointer("/rules/version").is_some());
    assert_eq!(
        json.pointer("/store/kind").and_then(|k| k.as_str()),
        Some("memory")
    );
}
