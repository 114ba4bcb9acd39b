//! Named limits: a policy under a validated name, optionally counted per key. The limiter holds
//! them in an immutable table swapped as a whole, so every request sees one consistent version.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_core::Policy;

use crate::error::{Error, Result};

/// Longest limit name, in bytes (SPEC: `[a-z0-9][a-z0-9._:-]{0,127}`).
pub const LIMIT_NAME_BYTES_MAX: usize = 128;
/// Longest key (`per` value) and `per` label, in bytes.
pub const KEY_BYTES_MAX: usize = 256;

/// Why `name` is not a valid limit name, if it is not.
pub fn check_limit_name(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err("must not be empty".into());
    }
    if bytes.len() > LIMIT_NAME_BYTES_MAX {
        return Err(format!("must be at most {LIMIT_NAME_BYTES_MAX} bytes"));
    }
    let lead_ok = bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit();
    let rest_ok = bytes[1..].iter().all(|&b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b':' | b'-')
    });
    if !lead_ok || !rest_ok {
        return Err(
            "must match [a-z0-9][a-z0-9._:-]* (lower-case letters, digits, '.', '_', ':', '-')"
                .into(),
        );
    }
    Ok(())
}

/// Why `key` is not a valid counter key, if it is not.
#[inline]
pub fn check_key(key: &str) -> Result<(), String> {
    // Most keys are short and printable: settled by two word tests, inline.
    if short_printable_ascii(key.as_bytes()) {
        return Ok(());
    }
    check_key_slow(key)
}

#[inline(never)]
fn check_key_slow(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("must not be empty".into());
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(format!("must be at most {KEY_BYTES_MAX} bytes"));
    }
    // Most keys are printable ASCII, which a scan of the bytes settles without decoding
    // characters.
    if !printable_ascii(key.as_bytes()) && key.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// Whether `bytes` is 8 to 16 bytes of printable ASCII: the first eight and the last eight
/// (which may overlap) tested as two words. `false` says only "not settled here".
#[inline]
fn short_printable_ascii(bytes: &[u8]) -> bool {
    match (bytes.first_chunk::<8>(), bytes.last_chunk::<8>()) {
        (Some(first), Some(last)) if bytes.len() <= 16 => {
            printable_word(u64::from_ne_bytes(*first)) && printable_word(u64::from_ne_bytes(*last))
        }
        _ => false,
    }
}

/// Whether every byte is printable ASCII (0x20 to 0x7e), eight bytes at a time.
fn printable_ascii(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let Ok(word) = <[u8; 8]>::try_from(chunk).map(u64::from_ne_bytes) else {
            return false;
        };
        if !printable_word(word) {
            return false;
        }
    }
    chunks
        .remainder()
        .iter()
        .all(|byte| (0x20..0x7f).contains(byte))
}

/// Whether all eight bytes of `word` are printable ASCII.
#[inline]
fn printable_word(word: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // A byte below 0x20: subtracting 0x20 borrows into its high bit while the byte's own high
    // bit is clear (exact for a bound of at most 0x80).
    let below = word.wrapping_sub(0x20 * ONES) & !word & HIGHS;
    // A byte of 0x7f or more: adding 1 sets its high bit, or the high bit is set already (a
    // carry out of 0xff lands in the next byte only when this one is flagged anyway).
    let above = (word.wrapping_add(ONES) | word) & HIGHS;
    below | above == 0
}

/// A named policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    name: Arc<str>,
    policy: Policy,
    per: Option<Arc<str>>,
}

impl Limit {
    /// `per` names what the key identifies (`"user"`, `"account"`); with it, every key gets its
    /// own counter under this policy.
    pub fn new(name: &str, policy: Policy, per: Option<&str>) -> Result<Limit> {
        check_limit_name(name).map_err(|reason| Error::invalid("name", reason))?;
        if let Some(label) = per {
            check_key(label).map_err(|reason| Error::invalid("per", reason))?;
        }
        Ok(Limit {
            name: name.into(),
            policy,
            per: per.map(Into::into),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn per(&self) -> Option<&str> {
        self.per.as_deref()
    }
}

/// One version of the limits in force.
#[derive(Clone, Debug, Default)]
pub struct LimitTable {
    version: u64,
    by_name: HashMap<Arc<str>, Arc<Limit>, foldhash::fast::RandomState>,
}

impl LimitTable {
    pub fn new(version: u64, limits: impl IntoIterator<Item = Limit>) -> LimitTable {
        LimitTable {
            version,
            by_name: limits
                .into_iter()
                .map(|limit| (limit.name.clone(), Arc::new(limit)))
                .collect(),
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Limit>> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Limit>> {
        self.by_name.values()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub(crate) fn with(&self, limit: Limit) -> LimitTable {
        let mut next = self.clone();
        next.version += 1;
        next.by_name.insert(limit.name.clone(), Arc::new(limit));
        next
    }

    pub(crate) fn without(&self, name: &str) -> Option<LimitTable> {
        let mut next = self.clone();
        next.by_name.remove(name)?;
        next.version += 1;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time scan agrees with the byte-at-a-time one, at every length and
        /// offset (bytes near both bounds are drawn often).
        #[test]
        fn printable_ascii_matches_a_plain_scan(
            bytes in proptest::collection::vec(
                prop_oneof![
                    Just(0x1f_u8), Just(0x20), Just(0x7e), Just(0x7f), Just(0x80), Just(0xff),
                    Just(0x00), any::<u8>()
                ],
                0..40,
            )
        ) {
            let plain = bytes.iter().all(|byte| (0x20..0x7f).contains(byte));
            prop_assert_eq!(printable_ascii(&bytes), plain);
            // The inline test settles 8 to 16 printable bytes, and never passes a bad one.
            let short = (8..=16).contains(&bytes.len());
            prop_assert_eq!(short_printable_ascii(&bytes), short && plain);
        }
    }

    #[test]
    fn keys_with_control_characters_are_refused() {
        assert!(check_key("user-42 with spaces ~").is_ok());
        assert!(check_key("naïve-ключ").is_ok());
        assert!(check_key("abcdefgh\u{7f}").is_err());
        assert!(check_key("abcdefg\u{7f}").is_err());
        assert!(check_key("\tbcdefghijklmnop").is_err());
        assert!(check_key("abcdefghijklmnop\n").is_err());
        assert!(check_key("\u{85}abc").is_err());
    }
}
