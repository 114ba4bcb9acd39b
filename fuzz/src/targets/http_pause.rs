//! `POST /v1/pause` through the server's router: any body gets a documented answer, every
//! refusal names its field, and a pause in force lasts at least what was asked, cut to the
//! server's `pause_ms_max`, and never longer than that.

use crate::{Api, check_answer};
use http::Method;

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(body: &[u8]) {
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
    // A longer pause is cut to the server's `pause_ms_max` (docs/server.md, "Pause"); pauses
    // only extend, so one in force may end later than this one, never past the cap.
    let cap = tollgate_server::DEFAULT_PAUSE_MS_MAX;
    assert!(asked_ms >= 1, "a pause of {asked_ms} ms was accepted");
    assert!(
        paused_ms >= asked_ms.min(cap),
        "asked {asked_ms} ms, paused {paused_ms} ms"
    );
    assert!(
        paused_ms <= cap,
        "paused {paused_ms} ms, over the cap {cap} ms"
    );
    assert_eq!(
        answer.text("/limit"),
        asked.get("limit").and_then(|l| l.as_str())
    );
}
