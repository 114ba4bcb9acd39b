//! `PUT`, `GET` and `DELETE /v1/limits/{name}` through the server's router, the rules in a SQL
//! table: any name and body get a documented answer, every refusal names its field, and a
//! stored rule reads back as stored and is its own canonical form (stored again, unchanged).

use crate::{Api, BASE_LIMITS, check_answer, split, uri_with};
use http::Method;

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(input: &[u8]) {
    let api = Api::get();
    let (name, body) = split(input);
    let Ok(name) = std::str::from_utf8(name) else {
        return;
    };
    let name = if name.is_empty() { "fuzzed" } else { name };
    let uri = uri_with("/v1/limits/", name, "");
    let answer = api.admin(Method::PUT, &uri, body);
    // A name that is not one path segment finds no endpoint.
    if answer.status == 404 || answer.status == 405 {
        assert!(
            answer
                .text("/error/message")
                .is_some_and(|m| m.contains("no such endpoint") || m.contains("method not allowed")),
            "{answer:?}"
        );
        return;
    }
    check_answer(&answer, &[200, 400]);
    if answer.status != 200 {
        return;
    }
    let stored = answer.json.clone().expect("the stored rule");
    let stored_name = stored
        .get("name")
        .and_then(|name| name.as_str())
        .expect("the stored rule's name")
        .to_owned();
    let uri = format!("/v1/limits/{stored_name}");
    let read = api.admin(Method::GET, &uri, b"");
    check_answer(&read, &[200]);
    assert_eq!(read.json.as_ref(), Some(&stored), "read back");
    let canonical = serde_json::to_vec(&stored).expect("JSON");
    let again = api.admin(Method::PUT, &uri, &canonical);
    check_answer(&again, &[200]);
    assert_eq!(
        again.json.as_ref(),
        Some(&stored),
        "the canonical form stored again"
    );
    let listed = api.admin(Method::GET, "/v1/limits", b"");
    check_answer(&listed, &[200]);
    // Put the limits back as they were.
    match BASE_LIMITS.iter().find(|(base, _)| *base == stored_name) {
        Some((_, base)) => {
            let restored = api.admin(Method::PUT, &uri, base.as_bytes());
            assert_eq!(restored.status, 200, "{restored:?}");
        }
        None => {
            let deleted = api.admin(Method::DELETE, &uri, b"");
            check_answer(&deleted, &[200]);
            let gone = api.admin(Method::GET, &uri, b"");
            check_answer(&gone, &[404]);
        }
    }
}
