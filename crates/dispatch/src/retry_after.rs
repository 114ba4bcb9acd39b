//! `Retry-After`: reading the header a vendor sends with 429 and 503 answers (RFC 9110 §10.2.3:
//! whole seconds, or an HTTP-date), and the bounds the dispatcher puts on what it reads.
//!
//! Parsing takes "now" as an argument and reads no clock, so an HTTP-date is tested without
//! waiting. A value that cannot be read yields `None`, never a guess: the caller falls back to
//! its configured default, so a garbage header neither invents a long pause nor drops one.

use std::time::{Duration, SystemTime};

/// Longest header value read, in bytes. An HTTP-date is 29 bytes; anything much longer is not
/// a `Retry-After` worth reading.
pub const RETRY_AFTER_BYTES_MAX: usize = 64;

/// The wait a `Retry-After` value asks for, measured from `now`.
///
/// - delta-seconds (`"120"`): that many seconds. Values beyond `u64` seconds saturate (the
///   caller caps them anyway).
/// - an HTTP-date in any of the three forms RFC 9110 accepts: the time until then, zero if it is
///   already past (the vendor asks for no wait, and none is invented).
/// - anything else (empty, negative, fractional, a malformed date, non-ASCII): `None`.
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    if value.len() > RETRY_AFTER_BYTES_MAX {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|byte| byte.is_ascii_digit()) {
        // All digits, so the only failure is overflow: saturate rather than refuse, since the
        // vendor clearly asked for a long wait.
        let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

// The cases every implementation shares (Rust, Python, TypeScript) are in
// `tests/vectors/retry_after.json`, read by `tests/vectors.rs`; here only what is Rust's own.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_saturates_at_u64_seconds() {
        assert_eq!(
            parse_retry_after(b"99999999999999999999999", SystemTime::UNIX_EPOCH),
            Some(Duration::from_secs(u64::MAX)),
            "the caller's retry_after_ms_max caps it"
        );
    }
}
