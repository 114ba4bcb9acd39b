//! A vendor's rate-limit headers, as `read_advice` reads them from any answer (the rules are
//! the `about` text of `crates/dispatch/tests/vectors/vendor_headers.json`). Any headers: the
//! family read is the first one with a header name present (none: no advice), and the answer
//! does not depend on the others' headers; at most `ADVICE_QUOTAS_MAX` quotas, none 0, a window
//! (only `ietf` has one) in whole seconds, and no time above 2^53 ms; a field longer than
//! `ADVICE_VALUE_BYTES_MAX` reads as an empty one; "now" matters only to the families that send
//! an instant. And numbers written in each family's own format, as a vendor writes them (padded,
//! with leading zeros, on several lines, among other families' headers), read back exactly.
//!
//! Input: 8 bytes of "now" (ms, little-endian), `PARAMS_BYTES` of what to write, then headers
//! as text, one `name:value` a line.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate_dispatch::{
    ADVICE_QUOTAS_MAX, ADVICE_VALUE_BYTES_MAX, Advice, AdvisedQuota, Family, read_advice,
};

/// Any ms value above this is unreadable.
const MS_MAX: u64 = 1 << 53;
/// The largest int: 16 digits.
const INT_MAX: u64 = 9_999_999_999_999_999;
/// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z, in ms since the epoch: the instants an
/// RFC 3339 date-time can name.
const FIRST_MS: i64 = -62_167_219_200_000;
const LAST_MS: i64 = 253_402_300_799_999;
/// What the input gives of the headers to write: a family, a form, four numbers and a mask.
const PARAMS_BYTES: usize = 2 + 4 * 8 + 2;

/// Each family's header names, in the order families are tried (the rules, restated).
const FAMILIES: [(Family, &[&str]); 5] = [
    (Family::Ietf, &["ratelimit-policy", "ratelimit"]),
    (
        Family::OpenAi,
        &[
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ],
    ),
    (
        Family::Anthropic,
        &[
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ],
    ),
    (
        Family::GitHub,
        &[
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ],
    ),
    (
        Family::IetfDraft,
        &["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"],
    ),
];

fn at(epoch_ms: i64) -> SystemTime {
    let magnitude = Duration::from_millis(epoch_ms.unsigned_abs());
    if epoch_ms >= 0 {
        SystemTime::UNIX_EPOCH + magnitude
    } else {
        SystemTime::UNIX_EPOCH - magnitude
    }
}

/// The field's lines joined with `", "`, as the reader counts its length.
fn joined_len(headers: &HeaderMap, name: &str) -> usize {
    let values = headers.get_all(name);
    let lines = values.iter().count();
    values.iter().map(|value| value.len()).sum::<usize>() + 2 * lines.saturating_sub(1)
}

/// The checks any headers pass.
fn check_any(headers: &HeaderMap, now_ms: i64) {
    let now = at(now_ms);
    let advice = read_advice(headers, now);
    let present = FAMILIES
        .iter()
        .find(|(_, names)| names.iter().any(|name| headers.contains_key(*name)));
    let (Some((family, names)), Some(advice)) = (present, &advice) else {
        assert!(
            present.is_none() && advice.is_none(),
            "{advice:?} from {headers:?}"
        );
        return;
    };
    assert_eq!(advice.family, *family, "{headers:?}");
    assert!(advice.quotas.len() <= ADVICE_QUOTAS_MAX, "{advice:?}");
    for quota in &advice.quotas {
        assert!(quota.quota >= 1, "{advice:?}");
        if let Some(window) = quota.window {
            assert_eq!(*family, Family::Ietf, "{advice:?}");
            assert_eq!(window.subsec_nanos(), 0, "{advice:?}");
            assert!(window >= Duration::from_secs(1), "{advice:?}");
            assert!(window <= Duration::from_millis(MS_MAX), "{advice:?}");
        }
    }
    if *family != Family::Ietf {
        assert!(advice.quotas.len() <= 1, "{advice:?}");
    }
    if let Some(reset) = advice.reset {
        assert_eq!(reset.subsec_nanos() % 1_000_000, 0, "{advice:?}");
        assert!(reset <= Duration::from_millis(MS_MAX), "{advice:?}");
    }
    // The other families' headers are not read.
    let mut own = HeaderMap::new();
    for name in *names {
        for value in headers.get_all(*name) {
            own.append(*name, value.clone());
        }
    }
    assert_eq!(read_advice(&own, now).as_ref(), Some(advice), "{headers:?}");
    // A field too long to read is one that cannot be read.
    let mut blanked = own.clone();
    for name in *names {
        if joined_len(&own, name) > ADVICE_VALUE_BYTES_MAX {
            blanked.insert(*name, HeaderValue::from_static(""));
        }
    }
    assert_eq!(
        read_advice(&blanked, now).as_ref(),
        Some(advice),
        "{headers:?}"
    );
    // Only an instant depends on the clock.
    if !matches!(family, Family::Anthropic | Family::GitHub) {
        let later = now_ms.saturating_add(86_400_000).min(LAST_MS);
        assert_eq!(read_advice(headers, at(later)).as_ref(), Some(advice));
    }
}

/// Reads the input's parameters, one little-endian number at a time.
struct Params<'a>(&'a [u8]);

impl Params<'_> {
    fn byte(&mut self) -> u8 {
        let (&first, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        first
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.byte()))
    }
}

/// Days since 1970-01-01 to its civil (proleptic Gregorian) date.
fn civil(days: i64) -> (i64, i64, i64) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let of_era = shifted - era * 146_097;
    let year_of_era = (of_era - of_era / 1460 + of_era / 36_524 - of_era / 146_096) / 365;
    let of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * of_year + 2) / 153;
    let day = of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// `epoch_ms` as an RFC 3339 date-time at `offset_min` from UTC, in one of a few spellings;
/// `None` when the local date is not in years 0000 to 9999.
fn rfc3339(epoch_ms: i64, offset_min: i64, form: u8) -> Option<String> {
    let local = epoch_ms.checked_add(offset_min * 60_000)?;
    if !(FIRST_MS..=LAST_MS).contains(&local) {
        return None;
    }
    let seconds = local.div_euclid(1000);
    let (year, month, day) = civil(seconds.div_euclid(86_400));
    let of_day = seconds.rem_euclid(86_400);
    let ms = local.rem_euclid(1000);
    let fraction = match form % 3 {
        0 if ms == 0 => String::new(),
        0 | 1 => format!(".{ms:03}"),
        _ => format!(".{:09}", ms * 1_000_000),
    };
    let (t, z) = if form & 4 == 0 {
        ('T', 'Z')
    } else {
        ('t', 'z')
    };
    let zone = if offset_min == 0 && form & 8 == 0 {
        z.to_string()
    } else {
        let sign = if offset_min < 0 { '-' } else { '+' };
        let magnitude = offset_min.abs();
        format!("{sign}{:02}:{:02}", magnitude / 60, magnitude % 60)
    };
    Some(format!(
        "{year:04}-{month:02}-{day:02}{t}{:02}:{:02}:{:02}{fraction}{zone}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    ))
}

/// `ms` as a Go duration, in one of a few spellings (`850ms`, `1h2m3.5s`, `3.000000001s`),
/// and the whole ms it reads as (rounded up).
fn go_duration(ms: u64, extra_ns: u64, form: u8) -> (String, u64) {
    match form % 3 {
        0 => (format!("{ms}ms"), ms),
        1 => {
            let (hours, minutes, rest) = (ms / 3_600_000, ms / 60_000 % 60, ms % 60_000);
            let mut text = String::new();
            if hours > 0 {
                text.push_str(&format!("{hours}h"));
            }
            if hours > 0 || minutes > 0 {
                text.push_str(&format!("{minutes}m"));
            }
            text.push_str(&format!("{}", rest / 1000));
            if rest % 1000 > 0 {
                text.push_str(&format!(".{:03}", rest % 1000));
            }
            text.push('s');
            (text, ms)
        }
        _ => {
            // Nanoseconds beyond the ms round the value up to the next ms.
            let extra = extra_ns % 1_000_000;
            let text = format!("{}.{:09}s", ms / 1000, ms % 1000 * 1_000_000 + extra);
            (text, ms + u64::from(extra > 0))
        }
    }
}

/// An int as a vendor may write it: with leading zeros (up to 16 digits), or not.
fn int(value: u64, zeros: bool) -> String {
    if zeros {
        format!("{value:016}")
    } else {
        value.to_string()
    }
}

/// Headers of one family written from the input's numbers, and the advice they must read as.
fn written(params: &[u8], now_ms: i64) -> (Family, Vec<(&'static str, String)>, Advice) {
    let mut params = Params(params);
    let family = FAMILIES[usize::from(params.byte() % 5)].0;
    let form = params.byte();
    let (limit, remaining) = (params.u64() % (INT_MAX + 1), params.u64() % (INT_MAX + 1));
    let (reset, extra) = (params.u64(), params.u64());
    let zeros = params.byte();
    let lines = params.byte();
    let names = FAMILIES
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, names)| *names)
        .unwrap_or_default();
    let mut expected = Advice {
        family,
        quotas: Vec::new(),
        remaining: Some(remaining),
        reset: None,
    };
    let mut headers = Vec::new();
    if family == Family::Ietf {
        // Up to 12 members, some of quota 0, some in other units: the first 8 of requests kept.
        let mut members = Vec::new();
        for index in 0..u32::from(lines % 13) {
            // Small numbers, so that more than 8 members fit in a field that can be read.
            let (quota_max, window_max) = if form & 0x40 == 0 {
                (INT_MAX, MS_MAX / 1000)
            } else {
                (99, 9)
            };
            let quota = limit.rotate_left(index * 7) % (quota_max + 1)
                * u64::from((zeros >> (index % 8)) & 1);
            let window_s = 1 + extra.rotate_left(index * 5) % window_max;
            let name = if index % 2 == 0 {
                format!("\"q{index}\"")
            } else {
                format!("p{index}")
            };
            // Small members without a unit fit more than 8 in one field.
            let unit = match (form >> 4).wrapping_add(index as u8) % 4 {
                _ if form & 0x60 == 0x40 => "",
                0 => "",
                1 => ";qu=\"requests\"",
                2 => ";qu=requests",
                _ => ";qu=\"content-bytes\"",
            };
            members.push(format!("{name};q={quota};w={window_s}{unit}"));
            if quota > 0 && !unit.contains("bytes") && expected.quotas.len() < ADVICE_QUOTAS_MAX {
                expected.quotas.push(AdvisedQuota {
                    quota,
                    window: Some(Duration::from_secs(window_s)),
                });
            }
        }
        if form & 1 == 0 {
            headers.extend(members.into_iter().map(|member| (names[0], member)));
        } else if !members.is_empty() {
            headers.push((names[0], members.join(", ")));
        }
        let reset_s = reset % (MS_MAX / 1000 + 1);
        headers.push((
            names[1],
            format!("\"q0\";r={};t={reset_s}", int(remaining, zeros & 1 == 1)),
        ));
        expected.reset = Some(Duration::from_secs(reset_s));
    } else {
        headers.push((names[0], int(limit, zeros & 1 == 1)));
        headers.push((names[1], int(remaining, zeros & 2 == 2)));
        if limit > 0 {
            expected.quotas.push(AdvisedQuota {
                quota: limit,
                window: None,
            });
        }
        let (value, reset_ms) = match family {
            Family::OpenAi => go_duration(reset % (MS_MAX + 1), extra, form),
            Family::Anthropic => {
                let ahead = i64::try_from(reset % (1 << 40)).unwrap_or(0);
                let past = form & 16 != 0;
                let when = if past { now_ms - ahead } else { now_ms + ahead };
                let when = when.clamp(FIRST_MS, LAST_MS);
                let offset_min =
                    i64::from(zeros) * 11 % (24 * 60) * if lines & 1 == 0 { 1 } else { -1 };
                let text = rfc3339(when, offset_min, form >> 1)
                    .or_else(|| rfc3339(when, 0, form >> 1))
                    .unwrap_or_default();
                let reset_ms = u64::try_from(when.saturating_sub(now_ms)).unwrap_or(0);
                (text, reset_ms)
            }
            Family::GitHub => {
                // Near now (as vendors send it), or any int.
                let seconds = if form & 2 == 0 {
                    u64::try_from(now_ms.div_euclid(1000).max(0)).unwrap_or(0) + reset % (1 << 24)
                } else {
                    reset % (INT_MAX + 1)
                };
                let reset_ms = i128::from(seconds) * 1000 - i128::from(now_ms);
                (
                    int(seconds, false),
                    u64::try_from(reset_ms.max(0)).unwrap_or(u64::MAX),
                )
            }
            _ => {
                let seconds = reset % (INT_MAX + 1);
                (int(seconds, zeros & 4 == 4), seconds.saturating_mul(1000))
            }
        };
        headers.push((names[2], value));
        expected.reset = (reset_ms <= MS_MAX).then(|| Duration::from_millis(reset_ms));
    }
    // Spaces and tabs around a value are not part of it.
    if form & 0x80 != 0 {
        for (_, value) in &mut headers {
            *value = format!(" \t{value}\t ");
        }
    }
    // A list too long to read gives no quota (its lines joined as the reader joins them).
    let policy: Vec<&str> = headers
        .iter()
        .filter(|(name, _)| *name == "ratelimit-policy")
        .map(|(_, value)| value.as_str())
        .collect();
    if policy.join(", ").len() > ADVICE_VALUE_BYTES_MAX {
        expected.quotas.clear();
    }
    (family, headers, expected)
}

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(data: &[u8]) {
    if data.len() < 8 + PARAMS_BYTES {
        return;
    }
    let (head, rest) = data.split_at(8);
    let (params, text) = rest.split_at(PARAMS_BYTES);
    let now_raw = i64::from_le_bytes(head.try_into().expect("8 bytes"));
    let now_ms = FIRST_MS + now_raw.rem_euclid(LAST_MS - FIRST_MS + 1);
    let mut raw = HeaderMap::new();
    for line in text.split(|byte| *byte == b'\n').take(64) {
        let Some(colon) = line.iter().position(|byte| *byte == b':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(&line[colon + 1..]),
        ) {
            raw.append(name, value);
        }
    }
    check_any(&raw, now_ms);

    let (family, written, expected) = written(params, now_ms);
    let mut headers = HeaderMap::new();
    for (name, value) in &written {
        headers.append(
            *name,
            HeaderValue::from_str(value).expect("a header value written"),
        );
    }
    // Headers of the families tried after this one, or of none, change nothing.
    let tried_first: Vec<&str> = FAMILIES
        .iter()
        .take_while(|(f, _)| *f != family)
        .chain(FAMILIES.iter().filter(|(f, _)| *f == family))
        .flat_map(|(_, names)| names.iter().copied())
        .collect();
    for (name, value) in &raw {
        if !tried_first.contains(&name.as_str()) {
            headers.append(name, value.clone());
        }
    }
    assert_eq!(
        read_advice(&headers, at(now_ms)).as_ref(),
        Some(&expected),
        "written {written:?} at {now_ms} ms"
    );
    check_any(&headers, now_ms);
}
