//! The shared test vectors of `Retry-After` parsing and of the default classification
//! (`tests/vectors/retry_after.json`), which the Python and TypeScript clients read too, so
//! that every implementation reads a vendor's answer alike.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::Value;
use tollgate_dispatch::{Advice, Answer, Classifier, Verdict, parse_retry_after, read_advice};

const VECTORS: &str = include_str!("vectors/retry_after.json");

fn vectors() -> Value {
    serde_json::from_str(VECTORS).expect("the vectors file is JSON")
}

fn now(vectors: &Value) -> SystemTime {
    let seconds = vectors["now"]
        .as_u64()
        .expect("now: seconds since the epoch");
    SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
}

/// A case's header value as bytes: `value` as UTF-8, or `hex`.
fn bytes(case: &Value) -> Vec<u8> {
    if let Some(text) = case["value"].as_str() {
        return text.as_bytes().to_vec();
    }
    let hex = case["hex"].as_str().expect("a case has value or hex");
    (0..hex.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(&hex[index..index + 2], 16).expect("hex"))
        .collect()
}

fn expected_seconds(case: &Value) -> Option<Duration> {
    case["seconds"]
        .as_u64()
        .map(Duration::from_secs)
        .or_else(|| {
            assert!(
                case["seconds"].is_null(),
                "seconds: a whole number or null: {case}"
            );
            None
        })
}

#[test]
fn retry_after_values_read_as_the_vectors_say() {
    let vectors = vectors();
    let now = now(&vectors);
    let cases = vectors["retry_after"]
        .as_array()
        .expect("retry_after cases");
    assert!(cases.len() > 20, "the vectors were read");
    for case in cases {
        let read = parse_retry_after(&bytes(case), now);
        if case["saturates"] == Value::Bool(true) {
            let read = read.unwrap_or_else(|| panic!("{case}: read as a long wait"));
            assert!(read >= Duration::from_secs(1 << 53), "{case}: {read:?}");
            continue;
        }
        assert_eq!(read, expected_seconds(case), "{case}");
    }
}

#[test]
fn default_verdicts_are_as_the_vectors_say() {
    let vectors = vectors();
    let now = now(&vectors);
    let classifier = Classifier::new();
    for case in vectors["verdicts"].as_array().expect("verdict cases") {
        let status = case["status"].as_u64().expect("status");
        let mut headers = HeaderMap::new();
        if let Some(value) = case["retry_after"].as_str() {
            headers.insert(
                http::header::RETRY_AFTER,
                HeaderValue::from_str(value).expect("a header value"),
            );
        }
        let answer = Answer::Http {
            status: StatusCode::from_u16(u16::try_from(status).expect("u16")).expect("status"),
            headers: &headers,
        };
        let expected = match case["verdict"].as_str().expect("verdict") {
            "done" => Verdict::Done,
            "retry" => Verdict::Retry,
            "rate_limited" => Verdict::RateLimited {
                retry_after: expected_seconds(case),
            },
            other => panic!("unknown verdict {other:?}"),
        };
        assert_eq!(classifier.classify(&answer, now), expected, "{case}");
    }
}

// The shared vectors of reading a vendor's rate-limit headers (`tests/vectors/vendor_headers.json`).

const VENDOR_HEADERS: &str = include_str!("vectors/vendor_headers.json");

/// An advice as the vectors spell it.
fn advice_json(advice: &Advice) -> Value {
    let ms = |duration: Duration| u64::try_from(duration.as_millis()).expect("ms in u64");
    serde_json::json!({
        "family": advice.family.as_str(),
        "quotas": advice.quotas.iter().map(|quota| serde_json::json!({
            "quota": quota.quota,
            "window_ms": quota.window.map(ms),
        })).collect::<Vec<_>>(),
        "remaining": advice.remaining,
        "reset_ms": advice.reset.map(ms),
    })
}

#[test]
fn vendor_headers_read_as_the_vectors_say() {
    let vectors: Value = serde_json::from_str(VENDOR_HEADERS).expect("the vectors file is JSON");
    let cases = vectors["cases"].as_array().expect("cases");
    assert!(cases.len() > 40, "the vectors were read");
    let mut failures = Vec::new();
    for case in cases {
        let mut headers = HeaderMap::new();
        for pair in case["headers"].as_array().expect("headers") {
            let name = pair[0].as_str().expect("a header name");
            let value = pair[1].as_str().expect("a header value");
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
                HeaderValue::from_bytes(value.as_bytes()).expect("a header value"),
            );
        }
        let now = SystemTime::UNIX_EPOCH
            + Duration::from_millis(case["now_ms"].as_u64().expect("now_ms"));
        let read = read_advice(&headers, now)
            .as_ref()
            .map_or(Value::Null, advice_json);
        if read != case["advice"] {
            failures.push(format!(
                "{}: read {read}, expected {}",
                case["name"], case["advice"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
