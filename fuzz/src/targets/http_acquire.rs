//! `POST /v1/acquire` through the server's router: any body gets a documented answer, every
//! refusal names its field, and a grant is a permit the server then accepts.

use crate::{Api, check_answer};
use http::Method;

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(body: &[u8]) {
    let api = Api::get();
    let answer = api.data(Method::POST, "/v1/acquire", body);
    check_answer(&answer, &[200, 400, 404, 429]);
    let asked = serde_json::from_slice::<serde_json::Value>(body).ok();
    let names = asked
        .as_ref()
        .and_then(|asked| asked.get("limits"))
        .and_then(|limits| limits.as_array())
        .map(Vec::len);
    match answer.status {
        200 => {
            let permit = answer.text("/permit").expect("a permit");
            assert!(!permit.is_empty());
            let limits = answer
                .json
                .as_ref()
                .and_then(|json| json.get("limits"))
                .and_then(|limits| limits.as_array())
                .expect("limits");
            assert_eq!(Some(limits.len()), names, "one status per limit asked");
            api.settle(permit);
        }
        429 => {
            let limits = answer
                .json
                .as_ref()
                .and_then(|json| json.get("limits"))
                .and_then(|limits| limits.as_array())
                .expect("limits");
            assert!(limits.len() <= names.unwrap_or(0));
        }
        _ => {}
    }
}
