//! The numbers `tollgate.lua` and this crate exchange, written once: the operation codes, a
//! policy's kind and algorithm, priorities, a counter's outcome and a denial's reason, and the
//! bounds of a counter's queue across the fleet (`tollgate_redis_protocol::queue`). The
//! script's text names each as `__NAME__`; `script` puts the numbers in before Redis loads it,
//! so the two sides cannot drift apart.

use std::sync::LazyLock;

use tollgate::{DenyReason, Priority};
use tollgate_redis_protocol::queue;

/// The script's operation codes (the first number of its arguments).
pub(crate) const OP_ACQUIRE: u64 = 1;
pub(crate) const OP_COMMIT: u64 = 2;
pub(crate) const OP_RENEW: u64 = 3;
pub(crate) const OP_PAUSE: u64 = 4;
pub(crate) const OP_USAGE: u64 = 5;
pub(crate) const OP_BEGIN: u64 = 6;
pub(crate) const OP_RESUME: u64 = 7;
pub(crate) const OP_ADMIT: u64 = 8;
pub(crate) const OP_LEAVE: u64 = 9;
/// Acquires on one slot, several in one call (`batch.rs`).
pub(crate) const OP_BATCH: u64 = 10;
/// Added to the operation code: the call watches Redis's evictions.
pub(crate) const OP_WATCH_EVICTIONS: u64 = 16;

/// A policy's first number.
pub(crate) const KIND_RATE: u64 = 1;
pub(crate) const KIND_CONCURRENCY: u64 = 2;
/// A rate policy's fifth number (0 for a concurrency policy).
pub(crate) const ALG_SLIDING: u64 = 1;
pub(crate) const ALG_FIXED: u64 = 2;
pub(crate) const ALG_GCRA: u64 = 3;

pub(crate) const PRIORITY_LOW: u64 = 0;
pub(crate) const PRIORITY_NORMAL: u64 = 1;
pub(crate) const PRIORITY_HIGH: u64 = 2;

/// The first of an acquire's five numbers per counter.
pub(crate) const OUTCOME_GRANTED: u64 = 0;
pub(crate) const OUTCOME_ALLOWED: u64 = 1;
pub(crate) const OUTCOME_DENIED: u64 = 2;

pub(crate) const REASON_CAPACITY: u64 = 0;
pub(crate) const REASON_PAUSED: u64 = 1;
pub(crate) const REASON_RECOVERING: u64 = 2;
pub(crate) const REASON_QUEUED: u64 = 3;

/// Every code by the name the script's text gives it.
const CODES: [(&str, u64); 30] = [
    ("OP_ACQUIRE", OP_ACQUIRE),
    ("OP_COMMIT", OP_COMMIT),
    ("OP_RENEW", OP_RENEW),
    ("OP_PAUSE", OP_PAUSE),
    ("OP_USAGE", OP_USAGE),
    ("OP_BEGIN", OP_BEGIN),
    ("OP_RESUME", OP_RESUME),
    ("OP_ADMIT", OP_ADMIT),
    ("OP_LEAVE", OP_LEAVE),
    ("OP_BATCH", OP_BATCH),
    ("OP_WATCH_EVICTIONS", OP_WATCH_EVICTIONS),
    ("KIND_RATE", KIND_RATE),
    ("KIND_CONCURRENCY", KIND_CONCURRENCY),
    ("ALG_SLIDING", ALG_SLIDING),
    ("ALG_FIXED", ALG_FIXED),
    ("ALG_GCRA", ALG_GCRA),
    ("PRIORITY_LOW", PRIORITY_LOW),
    ("PRIORITY_NORMAL", PRIORITY_NORMAL),
    ("PRIORITY_HIGH", PRIORITY_HIGH),
    ("OUTCOME_GRANTED", OUTCOME_GRANTED),
    ("OUTCOME_ALLOWED", OUTCOME_ALLOWED),
    ("OUTCOME_DENIED", OUTCOME_DENIED),
    ("REASON_CAPACITY", REASON_CAPACITY),
    ("REASON_PAUSED", REASON_PAUSED),
    ("REASON_RECOVERING", REASON_RECOVERING),
    ("REASON_QUEUED", REASON_QUEUED),
    ("PLACES_MAX", queue::PLACES_MAX as u64),
    ("PLACE_BYTES", queue::PLACE_BYTES as u64),
    ("NEWCOMER_ID", queue::NEWCOMER_ID),
    ("QUEUED_RETRY_MIN_US", queue::QUEUED_RETRY_MIN_US),
];

/// The script as written, with its codes as names.
const SOURCE: &str = include_str!("tollgate.lua");

/// The script as Redis runs it: every code's name replaced by its number (the function's name,
/// `__TOLLGATE_FUNCTION__`, is put in when it is loaded as a library).
pub(crate) fn script() -> &'static str {
    static SCRIPT: LazyLock<String> = LazyLock::new(|| {
        CODES.iter().fold(SOURCE.to_owned(), |text, (name, code)| {
            text.replace(&format!("__{name}__"), &code.to_string())
        })
    });
    &SCRIPT
}

pub(crate) fn priority_code(priority: Priority) -> u64 {
    match priority {
        Priority::Low => PRIORITY_LOW,
        Priority::Normal => PRIORITY_NORMAL,
        Priority::High => PRIORITY_HIGH,
    }
}

/// A denial's reason from the script's code; an unknown code reads as capacity, the reason
/// that promises the least.
pub(crate) fn reason(code: u64) -> DenyReason {
    match code {
        REASON_PAUSED => DenyReason::Paused,
        REASON_RECOVERING => DenyReason::Recovering,
        REASON_QUEUED => DenyReason::Queued,
        _ => DenyReason::Capacity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_in_the_script_is_a_code_and_every_code_is_distinct_in_its_group() {
        // A name left over would be one the script uses and Rust does not define.
        let text = script();
        let mut left = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("__") {
            let after = &rest[at + 2..];
            let name_len = after
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(after.len());
            let name = after[..name_len].trim_end_matches('_');
            if !name.is_empty() && name != "TOLLGATE_FUNCTION" {
                left.push(name.to_owned());
            }
            rest = &after[name_len..];
        }
        assert!(left.is_empty(), "names left in the script: {left:?}");
        for group in ["OP_", "KIND_", "ALG_", "PRIORITY_", "OUTCOME_", "REASON_"] {
            let mut codes: Vec<u64> = CODES
                .iter()
                .filter(|(name, _)| name.starts_with(group))
                .map(|(_, code)| *code)
                .collect();
            let count = codes.len();
            codes.sort_unstable();
            codes.dedup();
            assert_eq!(codes.len(), count, "{group} codes repeat");
        }
        // Every code but the low priority (the script's default branch) is named in the script.
        for (name, _) in CODES {
            if name != "PRIORITY_LOW" {
                assert!(SOURCE.contains(&format!("__{name}__")), "{name} unused");
            }
        }
    }

    #[test]
    fn every_reason_the_core_has_has_a_code() {
        for reason in DenyReason::ALL {
            let code = match reason {
                DenyReason::Capacity => REASON_CAPACITY,
                DenyReason::Paused => REASON_PAUSED,
                DenyReason::Recovering => REASON_RECOVERING,
                DenyReason::Queued => REASON_QUEUED,
            };
            assert_eq!(super::reason(code), reason);
        }
    }
}
