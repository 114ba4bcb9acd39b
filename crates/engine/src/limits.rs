//! Named limits: a policy under a validated name, optionally counted per key. The limiter holds
//! them in an immutable table swapped as a whole, so every request sees one consistent version.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_core::Policy;

use crate::error::{Error, Result};

/// Longest limit name, in bytes (`[a-z0-9][a-z0-9._:-]{0,127}`).
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
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("must not be empty".into());
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(format!("must be at most {KEY_BYTES_MAX} bytes"));
    }
    if key.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// A named policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    name: Arc<str>,
    /// The policy decided under: the configured one, or what a vendor taught of it
    /// (`Limiter::learn`).
    policy: Policy,
    /// The policy as configured.
    configured: Policy,
    per: Option<Arc<str>>,
    /// Keys this limit may have counted at once (`with_keys_max`); `None`: the store's own
    /// per-limit budget.
    keys_max: Option<u64>,
}

impl Limit {
    /// This limit's counter for `key` (none for a limit not counted per key), as a store takes
    /// it.
    pub(crate) fn take<'a>(&'a self, key: Option<&'a str>) -> crate::store::Take<'a> {
        crate::store::Take {
            counter: crate::store::CounterId {
                limit: self.name(),
                key,
            },
            policy: self.policy(),
        }
    }

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
            configured: policy,
            per: per.map(Into::into),
            keys_max: None,
        })
    }

    /// At most `keys_max` keys of this limit counted at once, in place of the store's
    /// per-limit budget (a store that bounds keys per limit reads it through
    /// `News::Limits`). Meaningful for a limit counted per key; at least 1.
    pub fn with_keys_max(mut self, keys_max: Option<u64>) -> Result<Limit> {
        if keys_max == Some(0) {
            return Err(Error::invalid("keys_max", "must be at least 1"));
        }
        self.keys_max = keys_max;
        Ok(self)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy in force: as configured, unless a vendor taught a lower limit or a wider
    /// margin (`Limiter::learn`, `Limiter::note_sent`).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The policy as configured.
    pub fn configured(&self) -> &Policy {
        &self.configured
    }

    /// This limit deciding under `policy`, learned from its configured one.
    pub(crate) fn learned(&self, policy: Policy) -> Limit {
        Limit {
            policy,
            ..self.clone()
        }
    }

    pub fn per(&self) -> Option<&str> {
        self.per.as_deref()
    }

    pub fn keys_max(&self) -> Option<u64> {
        self.keys_max
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

    /// Put `limit` in place of the limit of its name, in this same version.
    pub(crate) fn set(&mut self, limit: Limit) {
        self.by_name.insert(limit.name.clone(), Arc::new(limit));
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
