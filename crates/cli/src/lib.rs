//! The library half of the `tollgate` binary: a small HTTP/1 client for a running server's API
//! (used by `limits` and `acquire`, and by the end-to-end tests), the admin token a local
//! server keeps and the rules for sending it (`kept_token`), the `simulate` command's
//! workloads and runs, and the parsing of durations given on the command line. `anyhow` where
//! an error only ends in a message for people (a workload, a limits file), precise types
//! elsewhere.

pub mod client;
pub mod kept_token;
pub mod simulate;

use std::time::Duration;

/// Longest duration accepted on the command line: one day.
pub const DURATION_MS_MAX: u64 = 24 * 3600 * 1000;

/// Parse `250ms`, `2s`, `1.5s`, `3m`, `1h`, or `0`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} needs a unit: ms, s, m or h (e.g. 500ms, 2s)"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 2s, 1m)"))?;
    let unit_ms = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?}; use ms, s, m or h"
            ));
        }
    };
    let ms = (value * unit_ms).ceil();
    if !ms.is_finite() || ms < 0.0 || ms > DURATION_MS_MAX as f64 {
        return Err(format!("{text:?} must be between 0 and 24h"));
    }
    Ok(Duration::from_millis(ms as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        for bad in ["", "5", "s", "1d", "-1s", "25h", "1..2s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
