//! The numbers the script (`lua/*.lua`) and this crate exchange or the script gives a meaning,
//! written once: the operation codes, a policy's kind and algorithm, priorities, a counter's
//! outcome and a denial's reason, the bounds of a counter's queue across the fleet
//! (`tollgate_redis_protocol::queue`), the core's bounds the script mirrors, the layout of the
//! script's arguments, replies and values, and its expiries. The script's text names each as
//! `__NAME__`; `script` joins its parts and puts the numbers in before Redis loads it, so the
//! two sides cannot drift apart. Names rather than a prelude of Lua locals: a local of the
//! chunk would be an upvalue of every helper that reads it (Lua 5.1 allows 60 per function),
//! read by an instruction of its own where a literal is an operand, and captured again by every
//! helper made on each call of a script run by `EVALSHA`; put in as numbers, the loaded code is
//! what it would be with the numbers written by hand. The joined script starts with a
//! generated list of every name and its number, for whoever reads it in Redis.

use std::sync::LazyLock;

use tollgate::{DenyReason, Priority};
use tollgate_core::{RESERVATIONS_TRACKED_MAX, SLIDING_BUCKETS_MAX};
use tollgate_redis_protocol::queue;

use crate::tally;

/// The version of the protocol the script speaks: its arguments, replies and stored values.
/// A Redis module deciding the same operations (`tollgate-redis-module`) answers the same
/// version to `TOLLGATE.VERSION`; a change either side must make alike moves it.
pub const PROTOCOL_VERSION: u64 = 1;

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
/// Units spent beyond any grant, counted on one counter (`Adjust::Charge`).
pub(crate) const OP_CHARGE: u64 = 11;
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

/// A counter value's body kind (`words.lua`), numbered as the core's `Counter::to_words`
/// numbers its bodies.
pub(crate) const BODY_EMPTY: u64 = 0;
pub(crate) const BODY_SLIDING: u64 = 1;
pub(crate) const BODY_FIXED: u64 = 2;
pub(crate) const BODY_GCRA: u64 = 3;
pub(crate) const BODY_LEASES: u64 = 4;

/// Every number the script holds is a big-endian double.
pub(crate) const NUMBER_BYTES: u64 = 8;
/// A counter's value starts with this byte ('X'), then its common header of ten numbers.
pub(crate) const COUNTER_TAG: u64 = b'X' as u64;
pub(crate) const COUNTER_HEADER_BYTES: u64 = 1 + 10 * NUMBER_BYTES;
/// A record of a log (a closed sliding bucket: opened, stamp, units; a reservation: seq,
/// units, at) or of a counter's leases (fence, slots, expires_at): three numbers.
pub(crate) const LEASE_NUMBERS: u64 = 3;
pub(crate) const RECORD_BYTES: u64 = LEASE_NUMBERS * NUMBER_BYTES;
/// Where a reservation's `at`, a closed bucket's stamp and its units are in their records.
pub(crate) const RESERVATION_AT: u64 = 2 * NUMBER_BYTES;
pub(crate) const BUCKET_STAMP: u64 = NUMBER_BYTES;
pub(crate) const BUCKET_UNITS: u64 = 2 * NUMBER_BYTES;
/// A limit's key budget: 'K', its generation and hold, then (end, count) records.
pub(crate) const TALLY_HEADER_BYTES: u64 = 1 + 2 * NUMBER_BYTES;
pub(crate) const TALLY_RECORD_BYTES: u64 = 2 * NUMBER_BYTES;
/// The generation: its birth and next renewal, then its owner's identity.
pub(crate) const GENERATION_HEADER_BYTES: u64 = 2 * NUMBER_BYTES;
/// The evictions record: the count seen, when it last moved, its next renewal.
pub(crate) const EVICTIONS_BYTES: u64 = 3 * NUMBER_BYTES;

pub(crate) const US_PER_MS: u64 = 1_000;
pub(crate) const US_PER_S: u64 = 1_000_000;
/// The generation and the evictions record are written again (their expiry pushed back) once
/// a day, and expire after 30 days: a namespace idle longer starts over and waits one period,
/// as after a loss.
pub(crate) const RENEW_EVERY_US: u64 = 86_400 * US_PER_S;
pub(crate) const GENERATION_TTL_MS: u64 = 30 * 86_400 * 1_000;

/// The policies and generations a function library keeps read from call to call, each.
pub(crate) const CACHE_MAX: u64 = 1_024;
/// Numbers unpacked at once: a C function returns its results on Lua's bounded stack.
pub(crate) const UNPACK_CHUNK: u64 = 256;

/// A policy's numbers in the script's arguments (`call::policy_args`).
pub(crate) const POLICY_NUMBERS: usize = 9;
/// An admission's numbers (`call::Numbers::admission`).
pub(crate) const ADMISSION_NUMBERS: u64 = 4;
/// An acquire's numbers before its counters' (cost, priority, record, how many), and each
/// counter's: its policy, its limit's pause, its admission and its queue. A cost below 0 says
/// the counters' costs differ: one per counter follows the waiter and the place's lifetime, so
/// a request with one cost for all sends what it always did.
pub(crate) const ACQUIRE_HEAD: u64 = 4;
pub(crate) const ACQUIRE_PER_COUNTER: u64 = POLICY_NUMBERS as u64 + 1 + ADMISSION_NUMBERS + 1;
/// A counter's keys: its state, its reservations log and its bucket log (`keys::counter_keys`).
pub(crate) const KEYS_PER_COUNTER: usize = 3;
/// Where a one-counter operation's admission and its own numbers start.
pub(crate) const ARG_ADMISSION: u64 = 2 + POLICY_NUMBERS as u64;
pub(crate) const ARG_OWN: u64 = ARG_ADMISSION + ADMISSION_NUMBERS;
/// Where a batch's first acquire starts (after the operation and how many).
pub(crate) const BATCH_AT: u64 = 3;
/// A reply's head (status, now, born, lost), then what the operation answers, from
/// `REPLY_AT`; an acquire answers `OUTCOME_NUMBERS` per counter.
pub(crate) const REPLY_HEAD: u64 = 4;
pub(crate) const REPLY_AT: u64 = REPLY_HEAD + 1;
pub(crate) const OUTCOME_NUMBERS: usize = 5;

/// Every number by the name the script's text gives it.
const CODES: [(&str, u64); 72] = [
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
    ("OP_CHARGE", OP_CHARGE),
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
    ("SLIDING_BUCKETS_MAX", SLIDING_BUCKETS_MAX),
    ("RESERVATIONS_TRACKED_MAX", RESERVATIONS_TRACKED_MAX as u64),
    ("BODY_EMPTY", BODY_EMPTY),
    ("BODY_SLIDING", BODY_SLIDING),
    ("BODY_FIXED", BODY_FIXED),
    ("BODY_GCRA", BODY_GCRA),
    ("BODY_LEASES", BODY_LEASES),
    ("NUMBER_BYTES", NUMBER_BYTES),
    ("COUNTER_TAG", COUNTER_TAG),
    ("COUNTER_HEADER_BYTES", COUNTER_HEADER_BYTES),
    ("LEASE_NUMBERS", LEASE_NUMBERS),
    ("RECORD_BYTES", RECORD_BYTES),
    ("RESERVATION_AT", RESERVATION_AT),
    ("BUCKET_STAMP", BUCKET_STAMP),
    ("BUCKET_UNITS", BUCKET_UNITS),
    ("TALLY_HEADER_BYTES", TALLY_HEADER_BYTES),
    ("TALLY_RECORD_BYTES", TALLY_RECORD_BYTES),
    ("GENERATION_HEADER_BYTES", GENERATION_HEADER_BYTES),
    ("EVICTIONS_BYTES", EVICTIONS_BYTES),
    ("US_PER_MS", US_PER_MS),
    ("US_PER_S", US_PER_S),
    ("RENEW_EVERY_US", RENEW_EVERY_US),
    ("GENERATION_TTL_MS", GENERATION_TTL_MS),
    ("LOG_SLACK_PER_WINDOW", tally::LOG_SLACK_PER_WINDOW),
    ("EXPIRY_SLACK_US", tally::EXPIRY_SLACK_US),
    ("COVER_SPANS", tally::COVER_SPANS),
    ("HOLD_SPANS", tally::HOLD_SPANS),
    ("GRID_PER_DISTANCE", tally::GRID_PER_DISTANCE),
    ("CACHE_MAX", CACHE_MAX),
    ("UNPACK_CHUNK", UNPACK_CHUNK),
    ("POLICY_NUMBERS", POLICY_NUMBERS as u64),
    ("ADMISSION_NUMBERS", ADMISSION_NUMBERS),
    ("ACQUIRE_HEAD", ACQUIRE_HEAD),
    ("ACQUIRE_PER_COUNTER", ACQUIRE_PER_COUNTER),
    ("KEYS_PER_COUNTER", KEYS_PER_COUNTER as u64),
    ("ARG_ADMISSION", ARG_ADMISSION),
    ("ARG_OWN", ARG_OWN),
    ("BATCH_AT", BATCH_AT),
    ("REPLY_HEAD", REPLY_HEAD),
    ("REPLY_AT", REPLY_AT),
    ("OUTCOME_NUMBERS", OUTCOME_NUMBERS as u64),
];

/// The script's parts, in the order they are joined: `common.lua` first (it makes `T`, which
/// every other part fills), `entry.lua` last (it registers the function, or decides, once
/// every helper is made). Between them the order only groups what belongs together: every
/// helper is a field of `T`, looked up when called.
pub(crate) const PARTS: [(&str, &str); 16] = [
    ("common.lua", include_str!("lua/common.lua")),
    ("words.lua", include_str!("lua/words.lua")),
    ("logs.lua", include_str!("lua/logs.lua")),
    ("reservations.lua", include_str!("lua/reservations.lua")),
    ("sliding.lua", include_str!("lua/sliding.lua")),
    ("fixed.lua", include_str!("lua/fixed.lua")),
    ("gcra.lua", include_str!("lua/gcra.lua")),
    ("leases.lua", include_str!("lua/leases.lua")),
    ("counter.lua", include_str!("lua/counter.lua")),
    ("keys.lua", include_str!("lua/keys.lua")),
    ("loss.lua", include_str!("lua/loss.lua")),
    ("pauses.lua", include_str!("lua/pauses.lua")),
    ("queue.lua", include_str!("lua/queue.lua")),
    ("acquire.lua", include_str!("lua/acquire.lua")),
    ("operations.lua", include_str!("lua/operations.lua")),
    ("entry.lua", include_str!("lua/entry.lua")),
];

/// The script as Redis runs it: a list of every name and its number, then the parts in order,
/// every name replaced by its number (the function's name, `__TOLLGATE_FUNCTION__`, is put in
/// when it is loaded as a library). Made once.
pub(crate) fn script() -> &'static str {
    static SCRIPT: LazyLock<String> = LazyLock::new(|| {
        let mut text = String::from("-- The numbers this script's names stand for (src/abi.rs):\n");
        for (name, code) in CODES {
            text.push_str(&format!("--   {name} = {code}\n"));
        }
        for (_, part) in PARTS {
            text.push('\n');
            text.push_str(part);
        }
        CODES.iter().fold(text, |text, (name, code)| {
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
pub(crate) mod tests {
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
        let source: String = PARTS.iter().map(|(_, part)| *part).collect();
        for (name, _) in CODES {
            if name != "PRIORITY_LOW" {
                assert!(source.contains(&format!("__{name}__")), "{name} unused");
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

    /// The text of a part with its comments and strings blanked (a space each), so that what is
    /// left is code.
    pub(crate) fn code_of(part: &str) -> String {
        let mut code = String::with_capacity(part.len());
        let mut chars = part.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '-' if chars.peek() == Some(&'-') => {
                    for c in chars.by_ref() {
                        if c == '\n' {
                            code.push('\n');
                            break;
                        }
                    }
                }
                '\'' | '"' => {
                    code.push(' ');
                    while let Some(inner) = chars.next() {
                        if inner == '\\' {
                            chars.next();
                        } else if inner == c {
                            break;
                        }
                    }
                }
                _ => code.push(c),
            }
        }
        code
    }

    /// Bare numbers in `code` other than 0, 1 and 2 and a place in a table (`t[5]`,
    /// `t[at + 4]`: a field of a record whose layout the code beside it documents), with
    /// their lines.
    fn bare_numbers(code: &str) -> Vec<(usize, String)> {
        let mut found = Vec::new();
        for (line, text) in code.lines().enumerate() {
            let bytes = text.as_bytes();
            let mut at = 0;
            while at < bytes.len() {
                let starts_word =
                    at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
                if !(bytes[at].is_ascii_digit() && starts_word) {
                    at += 1;
                    continue;
                }
                let end = (at..bytes.len())
                    .find(|&i| {
                        !(bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.' || bytes[i] == b'_')
                    })
                    .unwrap_or(bytes.len());
                let number = &text[at..end];
                let before = text[..at].trim_end();
                let place = text[end..].trim_start().starts_with(']')
                    && (before.ends_with('[') || before.ends_with('+') || before.ends_with('-'));
                if !matches!(number, "0" | "1" | "2") && !place {
                    found.push((line + 1, number.to_owned()));
                }
                at = end;
            }
        }
        found
    }

    #[test]
    fn the_script_names_every_number_it_gives_a_meaning() {
        let mut bare = Vec::new();
        for (name, part) in PARTS {
            for (line, number) in bare_numbers(&code_of(part)) {
                bare.push(format!("{name}:{line}: {number}"));
            }
        }
        assert!(
            bare.is_empty(),
            "numbers to name in src/abi.rs and put in as __NAME__: {bare:#?}"
        );
        // The rule itself: what it must find, and what it leaves.
        assert_eq!(
            bare_numbers(&code_of(
                "if c.k == 3 then x = y * 24 -- 64\n  s = 'a 256' end"
            )),
            [(1, "3".to_owned()), (1, "24".to_owned())]
        );
        assert!(bare_numbers("b[i + 2], reply[5], a[at + 8], x = 0, 1, 2").is_empty());
    }

    #[test]
    fn the_script_is_its_parts_joined_in_order_with_every_name_put_in() {
        let text = script();
        let mut rest = text;
        for (name, part) in PARTS {
            // Each part's first line (a comment, untouched by the names) comes after the last.
            let first = part.lines().next().unwrap_or_default();
            assert!(first.starts_with("-- "), "{name} starts with what it owns");
            let at = rest
                .find(first)
                .unwrap_or_else(|| panic!("{name} out of order"));
            rest = &rest[at + first.len()..];
        }
        assert!(
            PARTS[0].1.contains("local T = {}"),
            "common.lua makes T first"
        );
        assert!(
            PARTS[PARTS.len() - 1].1.contains("redis.register_function"),
            "entry.lua registers the function last"
        );
        let listed: std::collections::BTreeSet<&str> =
            PARTS.iter().map(|(name, _)| *name).collect();
        let on_disk: std::collections::BTreeSet<String> = std::fs::read_dir(
            tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR")).join("src/lua"),
        )
        .expect("src/lua")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".lua"))
        .collect();
        assert_eq!(
            on_disk
                .iter()
                .map(String::as_str)
                .collect::<std::collections::BTreeSet<_>>(),
            listed,
            "every part under src/lua is joined, once"
        );
    }
}
