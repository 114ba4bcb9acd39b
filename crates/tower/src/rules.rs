//! Which rules apply to a request. The rules come from the rules crate (a fixed list, or the
//! SQL table reloaded by [`tollgate_rules::Rules`]); matching is the rules crate's
//! [`Match::matches`](tollgate_rules::Match::matches) on its normalized path.
//!
//! Each version of the rules is indexed once: rules with a literal path by that path, rules
//! with path `*` apart, and the `RateLimit-Policy` member of every rule formatted ahead of
//! time, so a request costs a hash lookup rather than a scan of every rule. The index is
//! rebuilt when the rules' version changes, which a request notices by comparing versions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use smallvec::SmallVec;
use tollgate::{COUNTERS_PER_REQUEST_MAX, LimitHandle, Limiter};
use tollgate_rules::{Rule, Rules};

use crate::headers::policy_item;
use crate::metrics::RuleCounters;

/// Where the layer's rules come from.
#[derive(Clone, Debug)]
pub enum ThrottleRules {
    /// A fixed list, put in force on the limiter when the layer is built.
    Fixed(Vec<Arc<Rule>>),
    /// The SQL table, as reloaded by `Rules` (which puts each version in force on its limiter).
    Sql(Rules),
}

impl ThrottleRules {
    pub fn fixed(rules: impl IntoIterator<Item = Rule>) -> ThrottleRules {
        ThrottleRules::Fixed(rules.into_iter().map(Arc::new).collect())
    }
}

/// One indexed rule.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) rule: Arc<Rule>,
    pub(crate) policy_item: String,
    pub(crate) is_lease: bool,
    pub(crate) counters: Arc<RuleCounters>,
    /// The rule's limit on the layer's limiter, looked up when the index was built, so a
    /// request that matches this rule alone is checked without a name lookup. `None` when the
    /// limit was not in force yet (the request then names it, as any chain does).
    pub(crate) handle: Option<LimitHandle>,
}

/// The matched rules of one request, as indexes into `RuleIndex::entries`, in chain order.
pub(crate) type Matched = SmallVec<[u32; COUNTERS_PER_REQUEST_MAX]>;

/// One version of the rules, indexed for matching.
#[derive(Debug)]
pub(crate) struct RuleIndex {
    version: u64,
    /// In chain order (seed 002): concurrency limits, then rules on every path (a user's
    /// overall frequency), then endpoint rules; by name within each.
    pub(crate) entries: Vec<Entry>,
    by_path: HashMap<Box<str>, SmallVec<[u32; 2]>>,
    any_path: SmallVec<[u32; 4]>,
}

/// Rules with no `match` are never applied by the layer (they are for `/v1/acquire`).
fn chain_rank(rule: &Rule) -> u8 {
    let any_path = rule.matcher().is_some_and(|m| m.path() == "*");
    match (rule.limit().policy().is_concurrency(), any_path) {
        (true, _) => 0,
        (false, true) => 1,
        (false, false) => 2,
    }
}

impl RuleIndex {
    fn build<'a>(
        version: u64,
        rules: impl Iterator<Item = &'a Arc<Rule>>,
        previous: Option<&RuleIndex>,
        limiter: &Limiter,
    ) -> RuleIndex {
        let mut rules: Vec<&Arc<Rule>> = rules.filter(|rule| rule.matcher().is_some()).collect();
        rules.sort_by(|a, b| (chain_rank(a), a.name()).cmp(&(chain_rank(b), b.name())));
        let old_counters: HashMap<&str, &Arc<RuleCounters>> = previous
            .map(|index| {
                index
                    .entries
                    .iter()
                    .map(|entry| (entry.rule.name(), &entry.counters))
                    .collect()
            })
            .unwrap_or_default();
        let mut by_path: HashMap<Box<str>, SmallVec<[u32; 2]>> = HashMap::new();
        let mut any_path = SmallVec::new();
        let mut entries = Vec::with_capacity(rules.len());
        for (position, rule) in rules.into_iter().enumerate() {
            // At most RULES_MAX (10,000) rules: an index always fits in u32.
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            match rule.matcher().map(|m| m.path()) {
                Some("*") | None => any_path.push(position),
                Some(path) => by_path.entry(path.into()).or_default().push(position),
            }
            entries.push(Entry {
                rule: rule.clone(),
                policy_item: policy_item(rule.limit()),
                is_lease: rule.limit().policy().is_concurrency(),
                counters: old_counters
                    .get(rule.name())
                    .map_or_else(Default::default, |counters| Arc::clone(counters)),
                handle: limiter.handle(rule.name()).ok(),
            });
        }
        RuleIndex {
            version,
            entries,
            by_path,
            any_path,
        }
    }

    /// Whether a rule in force matches a path other than `*`.
    pub(crate) fn has_endpoint_rules(&self) -> bool {
        !self.by_path.is_empty()
    }

    /// The rules that apply to `method` on `normalized_path`, in chain order. A request names
    /// at most `COUNTERS_PER_REQUEST_MAX` limits; past that, the later rules in chain order
    /// are not applied (and a warning says so).
    pub(crate) fn matching(&self, method: &str, normalized_path: &str) -> Matched {
        let specific = self
            .by_path
            .get(normalized_path)
            .map_or(&[][..], |positions| positions.as_slice());
        let mut matched = Matched::new();
        let candidates = self.any_path.iter().chain(specific);
        let mut overflow = false;
        for &position in candidates {
            let Some(entry) = self.entries.get(position as usize) else {
                continue;
            };
            let applies = entry
                .rule
                .matcher()
                .is_some_and(|m| m.matches(method, normalized_path));
            if applies {
                if matched.len() == COUNTERS_PER_REQUEST_MAX {
                    overflow = true;
                    continue;
                }
                matched.push(position);
            }
        }
        if overflow {
            tracing::warn!(
                path = normalized_path,
                applied = COUNTERS_PER_REQUEST_MAX,
                "more rules match than one request may name; the later ones are not applied"
            );
        }
        // Positions follow chain order; sorting merges the wildcard and the endpoint lists
        // (each is in order on its own).
        if !specific.is_empty() {
            matched.sort_unstable();
        }
        matched
    }
}

/// The rules source and its current index.
#[derive(Debug)]
pub(crate) struct RuleTracker {
    source: ThrottleRules,
    limiter: Limiter,
    index: RwLock<Arc<RuleIndex>>,
    /// One rebuild at a time; others keep using the index they have.
    rebuilding: Mutex<()>,
}

impl RuleTracker {
    /// For fixed rules, put them in force on `limiter` (replacing any limit of the same name).
    pub(crate) fn new(source: ThrottleRules, limiter: &Limiter) -> RuleTracker {
        let index = match &source {
            ThrottleRules::Fixed(rules) => {
                for rule in rules {
                    limiter.set_limit(rule.limit().clone());
                }
                RuleIndex::build(0, rules.iter(), None, limiter)
            }
            ThrottleRules::Sql(rules) => {
                let snapshot = rules.snapshot();
                RuleIndex::build(snapshot.version(), snapshot.iter(), None, limiter)
            }
        };
        RuleTracker {
            source,
            limiter: limiter.clone(),
            index: RwLock::new(Arc::new(index)),
            rebuilding: Mutex::new(()),
        }
    }

    fn current(&self) -> Arc<RuleIndex> {
        match self.index.read() {
            Ok(index) => index.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The index of the rules in force now.
    pub(crate) fn index(&self) -> Arc<RuleIndex> {
        let current = self.current();
        let ThrottleRules::Sql(rules) = &self.source else {
            return current;
        };
        let snapshot = rules.snapshot();
        if snapshot.version() == current.version {
            return current;
        }
        let Ok(_guard) = self.rebuilding.try_lock() else {
            // Someone is rebuilding: this request uses the previous version, as it would
            // have a moment earlier.
            return current;
        };
        let current = self.current();
        if snapshot.version() == current.version {
            return current;
        }
        let next = Arc::new(RuleIndex::build(
            snapshot.version(),
            snapshot.iter(),
            Some(&current),
            &self.limiter,
        ));
        match self.index.write() {
            Ok(mut slot) => *slot = next.clone(),
            Err(poisoned) => *poisoned.into_inner() = next.clone(),
        }
        next
    }
}
