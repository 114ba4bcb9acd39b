//! The hottest keys of each limit counted per key, as the server sees them asked for: a small
//! space-saving count per limit (a key not among the kept ones takes the place of the least
//! asked, inheriting its count, so a key asked for often enough always surfaces), bounded in
//! memory whatever the number of distinct keys. For `/v1/stats` and the dashboard; never an input
//! to a decision.

use std::collections::HashMap;
use std::sync::Mutex;

/// Keys kept per limit.
const KEPT_PER_LIMIT: usize = 8;

#[derive(Debug, Default)]
pub(crate) struct HotKeys {
    limits: Mutex<HashMap<String, Vec<(String, u64)>>>,
}

impl HotKeys {
    /// One request for `key` on `limit`.
    pub(crate) fn observe(&self, limit: &str, key: &str) {
        let mut limits = match self.limits.lock() {
            Ok(limits) => limits,
            Err(poisoned) => poisoned.into_inner(),
        };
        let kept = match limits.get_mut(limit) {
            Some(kept) => kept,
            None => limits.entry(limit.to_owned()).or_default(),
        };
        if let Some(entry) = kept.iter_mut().find(|(kept, _)| kept == key) {
            entry.1 += 1;
        } else if kept.len() < KEPT_PER_LIMIT {
            kept.push((key.to_owned(), 1));
        } else if let Some(least) = kept.iter_mut().min_by_key(|(_, count)| *count) {
            *least = (key.to_owned(), least.1 + 1);
        }
    }

    /// The most asked-for keys of `limit`, most first, at most `most`.
    pub(crate) fn top(&self, limit: &str, most: usize) -> Vec<(String, u64)> {
        let limits = match self.limits.lock() {
            Ok(limits) => limits,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut kept = limits.get(limit).cloned().unwrap_or_default();
        kept.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        kept.truncate(most);
        kept
    }

    /// Forget limits no longer in force.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut limits = match self.limits.lock() {
            Ok(limits) => limits,
            Err(poisoned) => poisoned.into_inner(),
        };
        limits.retain(|limit, _| keep(limit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frequent_key_surfaces_among_many_rare_ones() {
        let hot = HotKeys::default();
        for round in 0..1_000 {
            hot.observe("api", &format!("rare-{round}"));
            if round % 4 == 0 {
                hot.observe("api", "frequent");
            }
        }
        let top = hot.top("api", 3);
        assert_eq!(top[0].0, "frequent", "{top:?}");
        assert!(top.len() <= 3);
        assert!(hot.top("other", 3).is_empty());
        hot.retain(|limit| limit != "api");
        assert!(hot.top("api", 3).is_empty());
    }
}
