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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds_since_epoch: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds_since_epoch)
    }

    // Sun, 06 Nov 1994 08:49:37 GMT, RFC 9110's example date.
    const EXAMPLE_EPOCH_S: u64 = 784_111_777;

    #[test]
    fn delta_seconds() {
        let now = at(EXAMPLE_EPOCH_S);
        assert_eq!(parse_retry_after(b"0", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(b"15", now), Some(Duration::from_secs(15)));
        assert_eq!(
            parse_retry_after(b" 15 ", now),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            parse_retry_after(b"99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX)),
            "overflow saturates: the caller's retry_after_ms_max caps it"
        );
    }

    #[test]
    fn http_dates_in_all_three_forms() {
        let now = at(EXAMPLE_EPOCH_S - 30);
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(
                parse_retry_after(form.as_bytes(), now),
                Some(Duration::from_secs(30)),
                "{form}"
            );
        }
        assert_eq!(
            parse_retry_after(b"Sun, 06 Nov 1994 08:49:37 GMT", at(EXAMPLE_EPOCH_S + 5)),
            Some(Duration::ZERO),
            "a date in the past asks for no wait"
        );
    }

    #[test]
    fn garbage_is_none() {
        let now = at(EXAMPLE_EPOCH_S);
        for garbage in [
            &b""[..],
            b"   ",
            b"-5",
            b"1.5",
            b"soon",
            b"15s",
            b"Sun, 32 Nov 1994 08:49:37 GMT",
            b"\xff\xfe",
            &[b'1'; RETRY_AFTER_BYTES_MAX + 1],
        ] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
    }
}
