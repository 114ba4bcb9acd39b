//! `Retry-After`, as the dispatcher reads it from a vendor's 429 or 503, and the pause it
//! becomes. A value is read only when it is at most `RETRY_AFTER_BYTES_MAX` bytes of delta
//! seconds (exactly that many, saturating) or an HTTP-date (the whole seconds until then, zero
//! once past); what the classifier reads is what the parser reads; the pause is the value cut to
//! `retry_after_ms_max` (the default when none was read) plus at most the resumption jitter,
//! never more than the engine accepts, and none for `Retry-After: 0`. Values written from a
//! number of seconds, or as an HTTP-date, read back as that many seconds.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};
use tollgate::{
    Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, MonotonicClock, PermitSecret,
};
use tollgate_dispatch::{
    Answer, Classifier, Gate, GateConfig, HostLimits, Quota, RETRY_AFTER_BYTES_MAX, Verdict,
    parse_retry_after,
};

/// The last second an HTTP-date can name: 9999-12-31T23:59:59Z.
const LAST_DATE_S: u64 = 253_402_300_799;

fn gate() -> &'static Gate {
    static GATE: OnceLock<Gate> = OnceLock::new();
    GATE.get_or_init(|| {
        let store = Arc::new(MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 16,
                keys_per_limit_max: 16,
            },
            Arc::new(MonotonicClock::new()),
        ));
        let limiter = Limiter::new(
            store,
            LimiterConfig {
                wait_max: Duration::from_secs(1),
                permit_secret: PermitSecret::random(),
                pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
                ..LimiterConfig::default()
            },
        );
        let policy = tollgate::Policy::rate(
            10,
            1_000_000,
            0,
            tollgate::Algorithm::Sliding,
            tollgate::Reserve::default(),
        )
        .expect("a policy");
        limiter.set_limit(tollgate::Limit::new("vendor", policy, None).expect("a limit"));
        let quota = Quota::limiter(
            limiter,
            HostLimits {
                rate: Some("vendor".into()),
                concurrency: None,
            },
        )
        .expect("a quota");
        Gate::new(quota, Classifier::new(), GateConfig::conservative()).expect("a gate")
    })
}

fn check_pause(read: Option<Duration>) {
    let config = GateConfig::conservative();
    let asked = read
        .unwrap_or(Duration::from_millis(config.retry_after_ms_default))
        .min(Duration::from_millis(config.retry_after_ms_max));
    match gate().pause_for(read) {
        None => assert!(asked.is_zero(), "no pause for {read:?}"),
        Some(pause) => {
            assert!(!asked.is_zero(), "a pause of {pause:?} for Retry-After 0");
            assert!(pause >= asked, "{pause:?} < {asked:?}");
            assert!(pause <= asked + Duration::from_millis(config.resume_jitter_ms_max));
            assert!(pause.as_millis() <= u128::from(tollgate::PAUSE_MS_MAX));
        }
    }
}

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(data: &[u8]) {
    if data.len() < 9 {
        return;
    }
    let (head, value) = data.split_at(9);
    let now_s = u64::from_le_bytes(head[..8].try_into().expect("8 bytes")) % (LAST_DATE_S + 1);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now_s);
    let read = parse_retry_after(value, now);
    if let Some(wait) = read {
        assert!(value.len() <= RETRY_AFTER_BYTES_MAX);
        let text = std::str::from_utf8(value)
            .expect("read values are text")
            .trim();
        assert_eq!(wait.subsec_nanos(), 0, "whole seconds");
        if text.bytes().all(|b| b.is_ascii_digit()) {
            let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
            assert_eq!(wait.as_secs(), seconds);
        } else {
            assert!(
                wait.as_secs() <= LAST_DATE_S - now_s,
                "{text:?} is {wait:?} away"
            );
            if !wait.is_zero() {
                let date = httpdate::fmt_http_date(now + wait);
                assert_eq!(
                    parse_retry_after(date.as_bytes(), now),
                    Some(wait),
                    "{date}"
                );
            }
        }
    }
    // The classifier reads the header as the parser does.
    if let Ok(header) = HeaderValue::from_bytes(value) {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, header);
        let status = match head[8] % 3 {
            0 => StatusCode::TOO_MANY_REQUESTS,
            1 => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::OK,
        };
        let verdict = Classifier::new().classify(
            &Answer::Http {
                status,
                headers: &headers,
            },
            now,
        );
        let expected = if status == StatusCode::OK {
            Verdict::Done
        } else {
            Verdict::RateLimited { retry_after: read }
        };
        assert_eq!(verdict, expected);
    }
    check_pause(read);
    // A number of seconds written by a vendor reads back as itself, and so does a date.
    let seconds = u64::from_le_bytes(head[..8].try_into().expect("8 bytes")) >> (head[8] % 64);
    assert_eq!(
        parse_retry_after(seconds.to_string().as_bytes(), now),
        Some(Duration::from_secs(seconds))
    );
    let ahead = seconds % (LAST_DATE_S - now_s + 1);
    let date = httpdate::fmt_http_date(now + Duration::from_secs(ahead));
    assert_eq!(
        parse_retry_after(date.as_bytes(), now),
        Some(Duration::from_secs(ahead)),
        "{date}"
    );
    check_pause(Some(Duration::from_secs(seconds)));
}
