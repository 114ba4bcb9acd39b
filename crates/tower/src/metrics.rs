//! The layer's counters, labelled by rule name only: never by user or raw path, whose number
//! is unbounded (the throttle table's M users x N endpoints would become M x N series).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Decisions taken on one rule.
#[derive(Debug, Default)]
pub(crate) struct RuleCounters {
    pub(crate) allowed: AtomicU64,
    pub(crate) denied: AtomicU64,
}

/// Counts that belong to no rule.
#[derive(Debug, Default)]
pub(crate) struct LayerCounters {
    pub(crate) unmatched: AtomicU64,
    pub(crate) unidentified: AtomicU64,
    pub(crate) bad_path: AtomicU64,
    pub(crate) too_many_keys: AtomicU64,
    pub(crate) store_errors: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One rule's counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleMetrics {
    pub rule: String,
    /// Requests this rule applied to that were granted (on every matched rule).
    pub allowed: u64,
    /// Requests refused because this rule had no room (a refusal may name several rules).
    pub denied: u64,
}

/// A reading of the layer's counters, for export to a metrics system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThrottleMetrics {
    /// Per rule in force, by name.
    pub rules: Vec<RuleMetrics>,
    /// Requests that matched no rule and passed through untouched.
    pub unmatched: u64,
    /// Requests that matched a rule counted per user but named no user.
    pub unidentified: u64,
    /// Requests refused with `400 Bad Request` because their path could not be percent-decoded
    /// (read only while a rule names a path).
    pub bad_path: u64,
    /// Requests refused because the store's `keys_tracked_max` was reached.
    pub too_many_keys: u64,
    /// Requests during which the store failed (answered per `OnStoreError`).
    pub store_errors: u64,
}

pub(crate) fn read(
    rules: impl Iterator<Item = (String, Arc<RuleCounters>)>,
    layer: &LayerCounters,
) -> ThrottleMetrics {
    ThrottleMetrics {
        rules: rules
            .map(|(rule, counters)| RuleMetrics {
                rule,
                allowed: counters.allowed.load(Ordering::Relaxed),
                denied: counters.denied.load(Ordering::Relaxed),
            })
            .collect(),
        unmatched: layer.unmatched.load(Ordering::Relaxed),
        unidentified: layer.unidentified.load(Ordering::Relaxed),
        bad_path: layer.bad_path.load(Ordering::Relaxed),
        too_many_keys: layer.too_many_keys.load(Ordering::Relaxed),
        store_errors: layer.store_errors.load(Ordering::Relaxed),
    }
}
