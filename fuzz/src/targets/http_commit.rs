//! `POST /v1/permits/{permit}/commit` and `/renew` through the server's router, with ids the
//! server granted, the same ids altered, and ids made up: only a granted id is ever accepted,
//! every refusal names its field, and a granted id is accepted with any body that is valid. A
//! commit's `sent_after_ms` above `SENT_AFTER_MS_MAX` (an hour) is refused naming it.

use crate::{Api, check_answer, read_body, segment, split, uri_with};
use http::Method;
use tollgate_api::data::{CommitBody, SENT_AFTER_MS_MAX, Used};

const DOCUMENTED: &[u16] = &[200, 400, 404, 409];

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(input: &[u8]) {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let api = Api::get();
    let (id, body) = split(rest);
    let renew = mode & 0x80 != 0;
    let action = if renew { "renew" } else { "commit" };
    match mode & 3 {
        // An id the server granted, on a rate limit or a lease.
        0 | 1 => {
            let limit = if mode & 1 == 0 { "rate" } else { "pool" };
            let granted = api.data(
                Method::POST,
                "/v1/acquire",
                format!(r#"{{"limits":["{limit}"]}}"#).as_bytes(),
            );
            assert_eq!(granted.status, 200, "{granted:?}");
            let permit = granted.text("/permit").expect("a permit").to_owned();
            let answer = api.data(
                Method::POST,
                &format!("/v1/permits/{}/{action}", segment(&permit)),
                body,
            );
            check_answer(&answer, DOCUMENTED);
            if !renew {
                check_commit(body, &answer);
            }
            if answer.status == 200 && !renew {
                let refunded = answer.number("/refunded").expect("refunded");
                let released = answer.number("/released").expect("released");
                assert!(refunded <= 1 && released <= 1, "{answer:?}");
                assert_eq!(released, u64::from(limit == "pool"), "{answer:?}");
            } else {
                api.settle(&permit);
            }
        }
        // A granted id with one character changed.
        2 => {
            let granted = api.data(Method::POST, "/v1/acquire", br#"{"limits":["rate"]}"#);
            let permit = granted.text("/permit").expect("a permit").to_owned();
            let mut altered = permit.clone().into_bytes();
            let Some((&at, replacement)) = id.split_first() else {
                api.settle(&permit);
                return;
            };
            let at = usize::from(at) % altered.len();
            let byte = replacement.first().copied().unwrap_or(b'0');
            if byte == altered[at] || !byte.is_ascii_graphic() {
                api.settle(&permit);
                return;
            }
            altered[at] = byte;
            let altered = String::from_utf8(altered).expect("ASCII");
            let answer = api.data(
                Method::POST,
                &uri_with("/v1/permits/", &altered, &format!("/{action}")),
                body,
            );
            check_answer(&answer, DOCUMENTED);
            assert_ne!(answer.status, 200, "an altered id was accepted: {altered}");
            api.settle(&permit);
        }
        // An id made up.
        _ => {
            let Ok(id) = std::str::from_utf8(id) else {
                return;
            };
            let answer = api.data(
                Method::POST,
                &uri_with("/v1/permits/", id, &format!("/{action}")),
                body,
            );
            // An id that is not one path segment finds no endpoint.
            if answer.status == 404
                && answer
                    .text("/error/message")
                    .is_some_and(|m| m.contains("no such endpoint"))
            {
                return;
            }
            check_answer(&answer, DOCUMENTED);
            assert_ne!(answer.status, 200, "a made-up id was accepted: {id:?}");
        }
    }
}

/// What a commit of a granted, unsettled permit of cost 1 answers to a body that reads: a
/// `sent_after_ms` above the bound is refused naming it, and within it, with `used` 0 or 1 (a
/// number: an object by limit must name the permit's limits, which a made-up body rarely does),
/// the commit is accepted.
fn check_commit(body: &[u8], answer: &crate::Answer) {
    let Some(CommitBody {
        used: Some(used),
        sent_after_ms,
    }) = read_body::<CommitBody>(body)
    else {
        return;
    };
    if sent_after_ms.is_some_and(|ms| ms > SENT_AFTER_MS_MAX) {
        assert_eq!(answer.status, 400, "{answer:?}");
        assert_eq!(
            answer.text("/error/field"),
            Some("sent_after_ms"),
            "{answer:?}"
        );
    } else if matches!(used, Used::All(units) if units <= 1) {
        assert_eq!(answer.status, 200, "{answer:?}");
    }
}
