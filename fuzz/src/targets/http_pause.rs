//! `POST /v1/pause` through the server's router: any body gets a documented answer, every
//! refusal names its field, and a pause in force lasts at least what was asked and at most
//! `PAUSE_MS_MAX`.

use http::Method;
use crate::{Api, check_answer};

/// One input of the target, as libFuzzer hands it over.
pub fn run(body: &[u8]) {
    let api = Api::get();
    let answer = api.data(Method::POST, "/v1/pause", body);
    check_answer(&answer, &[200, 400, 404]);
    if answer.status != 200 {
        return;
    }
    let asked: serde_json::Value = serde_json::from_slice(body).expect("an accepted body is JSON");
    let asked_ms = asked
        .get("retry_after_ms")
        .and_then(serde_json::Value::as_u64)
        .expect("retry_after_ms");
    let paused_ms = answer.number("/paused_ms").expect("paused_ms");
    assert!(
        (1..=tollgate::PAUSE_MS_MAX).contains(&asked_ms),
        "a pause of {asked_ms} ms was accepted"
    );
    assert!(
        paused_ms >= asked_ms,
        "asked {asked_ms} ms, paused {paused_ms} ms"
    );
    assert!(paused_ms <= tollgate::PAUSE_MS_MAX, "paused {paused_ms} ms");
    assert_eq!(
        answer.text("/limit"),
        asked.get("limit").and_then(|l| l.as_str())
    );
}
