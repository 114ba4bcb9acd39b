//! `POST /v1/learn` through the server's router: any sequence of lessons gets documented
//! answers, every refusal names its field, and what is learned stays within its bounds. An
//! answer's `effective` is between the floor (`floor_percent` of the configured limit, and
//! at least one unit) and the configured limit, `paused_ms` is never above the server's
//! `pause_ms_max` (and is at least the vendor's reset, cut to it, when it said none remain);
//! and however the lessons lower and restore the limit, the acquires granted never exceed the
//! configured limit, nor the limit in force at each moment.
//!
//! Input: 3 bytes that make a fresh rate limit (its limit, GCRA or sliding, its burst, its
//! reserve), then bodies separated by `0xff` (never in UTF-8 text), each with `$L` standing for
//! the fresh limit's name; an empty body acquires until refused. Every input ends by acquiring
//! until refused, and deleting the limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::{Api, check_answer, read_body};
use http::Method;
use tollgate_api::data::LearnBody;

/// The fresh limit's period: long beside a run, so no unit comes back during one.
const PERIOD_MS: u64 = 60_000;
/// At most this many bodies of one input are sent.
const BODIES_MAX: usize = 16;

/// A name no earlier input used, so no counter, pause or lesson is left from one.
fn fresh_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("learn-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The fresh limit, as the input makes it.
struct Fresh {
    name: String,
    configured: u64,
    /// A GCRA limit may grant one more, a period over the limit after its burst, during a drain.
    gcra: bool,
}

impl Fresh {
    /// Acquires one unit at a time until refused: how many were granted.
    fn drain(&self, api: &Api) -> (u64, Instant) {
        let body = format!(r#"{{"limits":["{}"]}}"#, self.name);
        let started = Instant::now();
        let mut granted = 0;
        loop {
            let answer = api.data(Method::POST, "/v1/acquire", body.as_bytes());
            check_answer(&answer, &[200, 429]);
            if answer.status != 200 {
                return (granted, started);
            }
            granted += 1;
            assert!(
                granted <= 2 * self.configured + 2,
                "{} granted at once, configured {}",
                granted,
                self.configured
            );
        }
    }

    /// What a GCRA limit may grant beyond its burst in `since`: a unit every period over
    /// the limit, and one more for where the drain fell in that interval.
    fn slack(&self, since: Instant) -> u64 {
        if !self.gcra {
            return 0;
        }
        let elapsed_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
        elapsed_ms.saturating_mul(self.configured) / PERIOD_MS + 1
    }
}

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(input: &[u8]) {
    let [size, shape, reserve, rest @ ..] = input else {
        return;
    };
    let api = Api::get();
    let configured = 1 + u64::from(*size % 32);
    let gcra = shape & 1 == 1;
    let burst = 1 + u64::from(*shape >> 1) % configured;
    let capacity = if gcra { burst } else { configured };
    let reserve = u64::from(*reserve) % capacity;
    let algorithm = if gcra {
        format!(r#""algorithm":"gcra","burst":{burst}"#)
    } else {
        r#""algorithm":"sliding""#.to_owned()
    };
    let fresh = Fresh {
        name: fresh_name(),
        configured,
        gcra,
    };
    let rule = format!(
        r#"{{"kind":"rate","limit":{configured},"period_ms":{PERIOD_MS},{algorithm},"reserve":{{"high":{reserve}}}}}"#
    );
    let uri = format!("/v1/limits/{}", fresh.name);
    let created = api.admin(Method::PUT, &uri, rule.as_bytes());
    assert_eq!(created.status, 200, "{rule}: {created:?}");

    let floor_percent = tollgate::LearnConfig::default().floor_percent;
    let pause_ms_max = tollgate_server::DEFAULT_PAUSE_MS_MAX;
    let mut effective = configured;
    let mut total = 0;
    let mut first: Option<Instant> = None;
    for body in rest.split(|byte| *byte == 0xff).take(BODIES_MAX) {
        if body.is_empty() {
            let (granted, started) = fresh.drain(api);
            let since = *first.get_or_insert(started);
            assert!(
                granted <= effective + fresh.slack(started),
                "{granted} granted at once, {effective} in force"
            );
            total += granted;
            assert!(
                total <= configured + fresh.slack(since),
                "{total} granted in one period, configured {configured}"
            );
            continue;
        }
        let body = replace(body, b"$L", fresh.name.as_bytes());
        let answer = api.data(Method::POST, "/v1/learn", &body);
        check_answer(&answer, &[200, 400, 404]);
        if answer.status != 200 {
            continue;
        }
        let lesson: LearnBody = read_body(&body).expect("an accepted body reads");
        let shown = |field: &str| {
            answer
                .number(&format!("/{field}"))
                .unwrap_or_else(|| panic!("{field} in {answer:?}"))
        };
        let (limit_configured, limit_effective) = (shown("configured"), shown("effective"));
        let floor = (limit_configured * floor_percent / 100).clamp(1, limit_configured);
        assert!(
            (floor..=limit_configured).contains(&limit_effective),
            "effective {limit_effective}, floor {floor}, configured {limit_configured}: {lesson:?}"
        );
        if let Some(learned) = answer.number("/learned/limit") {
            assert_eq!(learned, limit_effective, "{answer:?}");
        }
        let paused_ms = shown("paused_ms");
        assert!(
            paused_ms <= pause_ms_max,
            "paused {paused_ms} ms, over the cap {pause_ms_max} ms"
        );
        match (lesson.remaining, lesson.reset_ms) {
            (Some(0), Some(reset_ms)) if reset_ms > 0 => assert!(
                paused_ms >= reset_ms.min(pause_ms_max),
                "paused {paused_ms} ms for a reset in {reset_ms} ms"
            ),
            _ => assert_eq!(paused_ms, 0, "a pause without remaining 0: {lesson:?}"),
        }
        assert_eq!(answer.text("/limit"), Some(lesson.limit.as_str()));
        if lesson.limit == fresh.name {
            assert_eq!(limit_configured, configured, "{answer:?}");
            effective = limit_effective;
        }
    }
    let (granted, started) = fresh.drain(api);
    let since = first.unwrap_or(started);
    assert!(granted <= effective + fresh.slack(started));
    total += granted;
    assert!(
        total <= configured + fresh.slack(since),
        "{total} granted in one period, configured {configured}"
    );
    let deleted = api.admin(Method::DELETE, &uri, b"");
    assert_eq!(deleted.status, 200, "{deleted:?}");
}

/// `bytes` with every `from` replaced by `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.starts_with(from) {
            out.extend_from_slice(to);
            rest = &rest[from.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}
