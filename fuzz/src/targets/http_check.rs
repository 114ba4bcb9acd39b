//! `POST /v1/check` through the server's router: any body gets a documented answer, every
//! refusal names its field, the path matched is the body's path normalized (a normal form:
//! normalizing it again changes nothing), and a lease handed out is accepted back.

use crate::{Api, check_answer};
use http::Method;

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(body: &[u8]) {
    let api = Api::get();
    let answer = api.data(Method::POST, "/v1/check", body);
    check_answer(&answer, &[200, 400, 404, 429]);
    if answer.status != 200 && answer.status != 429 {
        return;
    }
    let asked: serde_json::Value = serde_json::from_slice(body).expect("an accepted body is JSON");
    let path = asked.get("path").and_then(|p| p.as_str()).expect("a path");
    let normal = tollgate_rules::normalize_path(path).expect("an accepted path normalizes");
    assert_eq!(answer.text("/path"), Some(&*normal), "the path matched");
    assert_eq!(
        tollgate_rules::normalize_path(&normal).ok().as_deref(),
        Some(&*normal),
        "a normal form normalizes to itself"
    );
    let allowed = answer
        .json
        .as_ref()
        .and_then(|json| json.get("allowed"))
        .and_then(serde_json::Value::as_bool);
    assert_eq!(allowed, Some(answer.status == 200));
    if let Some(permit) = answer.text("/permit") {
        api.settle(permit);
    }
}
