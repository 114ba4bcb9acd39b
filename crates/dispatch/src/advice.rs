//! Advice: what a vendor's rate-limit headers say about its limits, read from any answer.
//!
//! Five header families are read, the first present winning: `ietf` (`RateLimit-Policy` and
//! `RateLimit`, structured lists), `openai` (`x-ratelimit-*-requests`), `anthropic`
//! (`anthropic-ratelimit-requests-*`), `github` (`x-ratelimit-*`) and `ietf-draft`
//! (`RateLimit-Limit`, `-Remaining`, `-Reset`). The rules are shared with the Python and
//! TypeScript clients and pinned by `tests/vectors/vendor_headers.json`, whose `about` text is
//! the full definition.
//!
//! Reading is pure: "now" is an argument and no clock is read. A value that cannot be read makes
//! that field `None`, never an error and never a guess, since advice lowers limits fleet-wide.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

/// Longest field value read, in bytes (all lines of the name joined with `", "`).
pub const ADVICE_VALUE_BYTES_MAX: usize = 256;
/// Most quotas kept from one answer (the first ones).
pub const ADVICE_QUOTAS_MAX: usize = 8;
/// Most digits in an integer field: more cannot be a limit worth reading.
const INT_DIGITS_MAX: usize = 16;
/// Most fraction digits in a duration or a date-time: nanoseconds, and exact in integers.
const FRACTION_DIGITS_MAX: usize = 9;
/// Any millisecond value above this is unreadable: every client holds it exactly (2^53).
const MS_MAX: u64 = 1 << 53;
const NANOS_PER_MS: i128 = 1_000_000;

/// The family of rate-limit headers an answer carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
    Ietf,
    /// `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`,
    /// `x-ratelimit-reset-requests` (a Go duration).
    OpenAi,
    /// `anthropic-ratelimit-requests-limit`, `-remaining`, `-reset` (an RFC 3339 date-time).
    Anthropic,
    /// `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (epoch seconds).
    GitHub,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (delta seconds), of the
    /// older drafts.
    IetfDraft,
}

impl Family {
    /// Every family, in the order they are tried.
    pub const ALL: [Family; 5] = [
        Family::Ietf,
        Family::OpenAi,
        Family::Anthropic,
        Family::GitHub,
        Family::IetfDraft,
    ];

    /// The family's name in the shared vectors and on the wire: `ietf`, `openai`,
    /// `anthropic`, `github`, `ietf-draft`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Ietf => "ietf",
            Family::OpenAi => "openai",
            Family::Anthropic => "anthropic",
            Family::GitHub => "github",
            Family::IetfDraft => "ietf-draft",
        }
    }

    /// The family named `name` (as [`Family::as_str`] spells it).
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|family| family.as_str() == name)
    }

    /// The header names whose presence selects the family (lower case).
    fn header_names(self) -> &'static [&'static str] {
        match self {
            Family::Ietf => &["ratelimit-policy", "ratelimit"],
            Family::OpenAi => &[
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
            Family::Anthropic => &[
                "anthropic-ratelimit-requests-limit",
                "anthropic-ratelimit-requests-remaining",
                "anthropic-ratelimit-requests-reset",
            ],
            Family::GitHub => &[
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
            ],
            Family::IetfDraft => &["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"],
        }
    }
}

/// One quota a vendor advertised: `quota` calls per `window` (`None`: the vendor named no
/// window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdvisedQuota {
    /// At least 1: a quota of 0 is dropped.
    pub quota: u64,
    /// Whole seconds for `ietf`; `None` for the other families.
    pub window: Option<Duration>,
}

/// What one answer's rate-limit headers said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advice {
    /// The family read; the others' headers, if any, were not.
    pub family: Family,
    /// The quotas advertised, at most [`ADVICE_QUOTAS_MAX`], in the vendor's order.
    pub quotas: Vec<AdvisedQuota>,
    /// Calls left, as the vendor counts them.
    pub remaining: Option<u64>,
    /// When calls come back, from `now`, in whole milliseconds rounded up.
    pub reset: Option<Duration>,
}

/// Reads the first family of rate-limit headers present in `headers`, `now` being the wall
/// clock; `None` when no family is.
///
/// A family is present when any of its header names is, whatever the values; each of its
/// fields that cannot be read is `None` (or gives no quota).
pub fn read_advice(headers: &HeaderMap, now: SystemTime) -> Option<Advice> {
    let family = Family::ALL.into_iter().find(|family| {
        family
            .header_names()
            .iter()
            .any(|name| headers.contains_key(*name))
    })?;
    let now_ns = match now.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(since) => i128::try_from(since.as_nanos()).unwrap_or(i128::MAX),
        Err(before) => -i128::try_from(before.duration().as_nanos()).unwrap_or(i128::MAX),
    };
    let names = family.header_names();
    let field = |index: usize| field(headers, names[index]);
    let mut advice = Advice {
        family,
        quotas: Vec::new(),
        remaining: None,
        reset: None,
    };
    if family == Family::Ietf {
        if let Some(policy) = field(0) {
            advice.quotas = read_policy(&policy);
        }
        if let Some(ratelimit) = field(1) {
            (advice.remaining, advice.reset) = read_ratelimit(&ratelimit);
        }
        return Some(advice);
    }
    if let Some(limit) = field(0).as_deref().and_then(int)
        && limit > 0
    {
        advice.quotas.push(AdvisedQuota {
            quota: limit,
            window: None,
        });
    }
    advice.remaining = field(1).as_deref().and_then(int);
    let reset_ms = field(2).as_deref().and_then(|value| match family {
        Family::OpenAi => go_duration_ms(value),
        Family::Anthropic => {
            rfc3339_ns(value).and_then(|at| ceil_ms(at.saturating_sub(now_ns).max(0)))
        }
        Family::GitHub => {
            let at = i128::from(int(value)?) * 1_000_000_000;
            ceil_ms(at.saturating_sub(now_ns).max(0))
        }
        Family::IetfDraft => int(value)?.checked_mul(1000),
        Family::Ietf => None,
    });
    advice.reset = reset_ms
        .filter(|ms| *ms <= MS_MAX)
        .map(Duration::from_millis);
    Some(advice)
}

/// The field's value: all its lines joined with `", "`, trimmed; `None` when absent or longer
/// than [`ADVICE_VALUE_BYTES_MAX`].
fn field(headers: &HeaderMap, name: &str) -> Option<Vec<u8>> {
    let mut joined = Vec::new();
    for (index, value) in headers.get_all(name).iter().enumerate() {
        if index > 0 {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(value.as_bytes());
        if joined.len() > ADVICE_VALUE_BYTES_MAX {
            return None;
        }
    }
    Some(trim(&joined).to_vec())
}

fn trim(bytes: &[u8]) -> &[u8] {
    let blank = |byte: &u8| *byte == b' ' || *byte == b'\t';
    let start = bytes
        .iter()
        .position(|byte| !blank(byte))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|byte| !blank(byte))
        .map_or(start, |last| last + 1);
    &bytes[start..end]
}

/// 1 to 16 ASCII digits, nothing else.
fn int(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > INT_DIGITS_MAX {
        return None;
    }
    value.iter().try_fold(0_u64, |sum, byte| {
        byte.is_ascii_digit()
            .then(|| sum * 10 + u64::from(byte - b'0'))
    })
}

/// Nanoseconds to whole milliseconds, rounded up; `None` above [`MS_MAX`].
fn ceil_ms(nanos: i128) -> Option<u64> {
    let ms = u64::try_from((nanos + NANOS_PER_MS - 1).div_euclid(NANOS_PER_MS)).ok()?;
    (ms <= MS_MAX).then_some(ms)
}

/// `value` split after its leading ASCII digits.
fn digits(value: &[u8]) -> (&[u8], &[u8]) {
    let count = value
        .iter()
        .position(|byte| !byte.is_ascii_digit())
        .unwrap_or(value.len());
    value.split_at(count)
}

/// A fraction's digits as nanoseconds of its unit's billionth: `5` -> 500_000_000.
fn fraction_billionths(fraction: &[u8]) -> Option<u64> {
    if fraction.is_empty() || fraction.len() > FRACTION_DIGITS_MAX {
        return None;
    }
    let read = int(fraction)?;
    let scale = 10_u64.pow(u32::try_from(FRACTION_DIGITS_MAX - fraction.len()).ok()?);
    Some(read * scale)
}

/// A Go duration (`1h2m3.5s`, `850ms`): one or more `<number><unit>`, units `h`, `m`, `s`,
/// `ms`; the exact value in whole milliseconds, rounded up.
fn go_duration_ms(value: &[u8]) -> Option<u64> {
    // In billionths of a millisecond, so fractions of up to 9 digits stay exact.
    let mut total: u128 = 0;
    let mut rest = value;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let (whole, after) = digits(rest);
        let whole = int(whole)?;
        let (fraction, after) = match after.strip_prefix(b".") {
            Some(after) => {
                let (fraction, after) = digits(after);
                (fraction_billionths(fraction)?, after)
            }
            None => (0, after),
        };
        let (unit_ms, after) = if let Some(after) = after.strip_prefix(b"ms") {
            (1, after)
        } else if let Some(after) = after.strip_prefix(b"h") {
            (3_600_000, after)
        } else if let Some(after) = after.strip_prefix(b"m") {
            (60_000, after)
        } else if let Some(after) = after.strip_prefix(b"s") {
            (1000, after)
        } else {
            return None;
        };
        let scaled = (u128::from(whole) * 1_000_000_000 + u128::from(fraction)) * unit_ms;
        total = total.checked_add(scaled)?;
        rest = after;
    }
    let ms = u64::try_from(total.div_ceil(1_000_000_000)).ok()?;
    (ms <= MS_MAX).then_some(ms)
}

/// Days from 1970-01-01 to the given civil (proleptic Gregorian) date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// An RFC 3339 date-time (`2026-11-28T23:59:00.5+02:00`) as nanoseconds since the epoch.
fn rfc3339_ns(value: &[u8]) -> Option<i128> {
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let bytes = value.get(range)?;
        bytes
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| int(bytes))
            .flatten()
            .and_then(|read| i64::try_from(read).ok())
    };
    let at = |index: usize, expected: &[u8]| value.get(index).is_some_and(|b| expected.contains(b));
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let mut rest = &value[19..];
    let mut fraction = 0;
    if let Some(after) = rest.strip_prefix(b".") {
        let (digits, after) = digits(after);
        fraction = fraction_billionths(digits)?;
        rest = after;
    }
    let offset_seconds = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hours = int(&[*h1, *h2])?;
            let minutes = int(&[*m1, *m2])?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = i64::try_from(hours * 3600 + minutes * 60).ok()?;
            if *sign == b'-' { -offset } else { offset }
        }
        _ => return None,
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        - offset_seconds;
    Some(i128::from(seconds) * 1_000_000_000 + i128::from(fraction))
}

/// One member of an `ietf` list: its parameters (the last of a repeated key), once its name
/// was found to be a string or a token.
struct Member<'a> {
    parameters: Vec<(&'a [u8], &'a [u8])>,
}

impl<'a> Member<'a> {
    fn get(&self, key: &str) -> Option<&'a [u8]> {
        self.parameters
            .iter()
            .rev()
            .find(|(name, _)| *name == key.as_bytes())
            .map(|(_, value)| *value)
    }
}

/// Splits at `separator` outside quoted strings; `None` when a quoted string is unterminated.
fn split_outside_quotes(value: &[u8], separator: u8) -> Option<Vec<&[u8]>> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (index, byte) in value.iter().enumerate() {
        if quoted {
            if escaped {
                escaped = false;
            } else if *byte == b'\\' {
                escaped = true;
            } else if *byte == b'"' {
                quoted = false;
            }
        } else if *byte == b'"' {
            quoted = true;
        } else if *byte == separator {
            parts.push(&value[start..index]);
            start = index + 1;
        }
    }
    if quoted {
        return None;
    }
    parts.push(&value[start..]);
    Some(parts)
}

/// A quoted string's content, unescaped; `None` if `value` is not exactly one quoted string.
fn quoted_string(value: &[u8]) -> Option<Vec<u8>> {
    let inner = value.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let mut content = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(byte) = bytes.next() {
        match byte {
            b'\\' => match bytes.next() {
                Some(escaped @ (b'"' | b'\\')) => content.push(*escaped),
                _ => return None,
            },
            b'"' => return None,
            0x20..=0x7e => content.push(*byte),
            _ => return None,
        }
    }
    Some(content)
}

fn is_token(value: &[u8]) -> bool {
    let Some((first, rest)) = value.split_first() else {
        return false;
    };
    (first.is_ascii_alphabetic() || *first == b'*')
        && rest
            .iter()
            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(byte))
}

/// The members of an `ietf` list whose name is a string or a token; `None` when the field
/// cannot be split.
fn members(value: &[u8]) -> Option<Vec<Member<'_>>> {
    let mut members = Vec::new();
    for member in split_outside_quotes(value, b',')? {
        let member = trim(member);
        if member.is_empty() {
            continue;
        }
        // Balanced: the whole field split without an open quote.
        let parts = split_outside_quotes(member, b';')?;
        let name = trim(parts[0]);
        if !is_token(name) && quoted_string(name).is_none() {
            continue;
        }
        let parameters = parts[1..]
            .iter()
            .filter_map(|part| {
                let part = trim(part);
                let equals = part.iter().position(|byte| *byte == b'=')?;
                Some((trim(&part[..equals]), trim(&part[equals + 1..])))
            })
            .collect();
        members.push(Member { parameters });
    }
    Some(members)
}

/// `RateLimit-Policy`: the quotas of its members counted in requests.
fn read_policy(value: &[u8]) -> Vec<AdvisedQuota> {
    let Some(members) = members(value) else {
        return Vec::new();
    };
    let mut quotas = Vec::new();
    for member in members {
        if let Some(unit) = member.get("qu") {
            let unit = quoted_string(unit).or_else(|| is_token(unit).then(|| unit.to_vec()));
            if unit.as_deref() != Some(b"requests") {
                continue;
            }
        }
        let Some(quota) = member.get("q").and_then(int) else {
            continue;
        };
        let window = match member.get("w") {
            None => None,
            Some(w) => match int(w)
                .filter(|seconds| *seconds >= 1)
                .and_then(|seconds| seconds.checked_mul(1000))
                .filter(|ms| *ms <= MS_MAX)
            {
                Some(ms) => Some(Duration::from_millis(ms)),
                // A window that cannot be read is not guessed as absent.
                None => continue,
            },
        };
        if quota == 0 {
            continue;
        }
        quotas.push(AdvisedQuota { quota, window });
        if quotas.len() == ADVICE_QUOTAS_MAX {
            break;
        }
    }
    quotas
}

/// `RateLimit`: the least `r`, and when calls come back (the last of the exhausted quotas to
/// reset, else the first to).
fn read_ratelimit(value: &[u8]) -> (Option<u64>, Option<Duration>) {
    let Some(members) = members(value) else {
        return (None, None);
    };
    let read: Vec<(Option<u64>, Option<u64>)> = members
        .iter()
        .map(|member| {
            let reset_ms = member
                .get("t")
                .and_then(int)
                .and_then(|seconds| seconds.checked_mul(1000))
                .filter(|ms| *ms <= MS_MAX);
            (member.get("r").and_then(int), reset_ms)
        })
        .collect();
    let remaining = read.iter().filter_map(|(r, _)| *r).min();
    let reset_ms = if remaining == Some(0) {
        read.iter()
            .filter(|(r, _)| *r == Some(0))
            .filter_map(|(_, t)| *t)
            .max()
    } else {
        read.iter().filter_map(|(_, t)| *t).min()
    };
    (remaining, reset_ms.map(Duration::from_millis))
}

// The cases every implementation shares are in `tests/vectors/vendor_headers.json`, read by
// `tests/vectors.rs`; here only what is Rust's own.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_from_civil_matches_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2026, 11, 28), 20_785);
    }

    #[test]
    fn family_names_round_trip() {
        for family in Family::ALL {
            assert_eq!(Family::from_name(family.as_str()), Some(family));
        }
        assert_eq!(Family::from_name("none"), None);
    }
}
