//! Which rules apply to an inbound request: the one matcher behind `/v1/check`,
//! `/v1/forward-auth` and the tower layer, so that no request is matched by one and missed by
//! another.
//!
//! A rule set's rules with a `match` are indexed once, in chain order (the throttle-table
//! scenario: concurrency limits, then rules on every path, a user's overall frequency, then
//! endpoint rules; by name within each): for every path a rule names, the rules a request on
//! it can match (the path's own merged with those on `*`); for any other path, the rules on
//! `*`. A request is matched by one lookup and a comparison of methods, not a scan.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;
use tollgate::COUNTERS_PER_REQUEST_MAX;

use crate::path::{PathError, PathMatching, method_matches};
use crate::rule::Rule;

/// The rules a request matched, as positions in [`InboundIndex::rules`], in chain order.
pub type Positions = SmallVec<[u32; COUNTERS_PER_REQUEST_MAX]>;

/// The rules one request matches, and what they need of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Matched {
    pub positions: Positions,
    /// One of them counts per key, so the request's user must be told.
    pub per_user: bool,
    /// One of them is a concurrency limit, whose lease the request holds.
    pub leases: bool,
}

/// How a matched request is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Nothing to hand back: a decision without a permit (`Limiter::check`).
    Check,
    /// A lease is held while the request runs: a permit to release (`Limiter::try_acquire`).
    Acquire,
}

impl Matched {
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// A request that holds a lease must be acquired, to release it when done; any other is
    /// only checked, since there is nothing to settle.
    pub fn ask(&self) -> Ask {
        if self.leases {
            Ask::Acquire
        } else {
            Ask::Check
        }
    }
}

/// The rules with a `match`, indexed for matching requests.
#[derive(Debug, Default)]
pub struct InboundIndex {
    /// In chain order.
    rules: Vec<Arc<Rule>>,
    /// Per rule: the one method it matches, as it names it; `None` for every method.
    methods: Vec<Option<Box<str>>>,
    /// The rules a request on each path a rule names can match, in chain order.
    by_path: HashMap<Box<str>, Vec<u32>>,
    /// The rules a request on any other path can match: those on `*`.
    elsewhere: Vec<u32>,
    path_matching: PathMatching,
}

/// Rules with no `match` are never matched (they are for `/v1/acquire`).
fn chain_rank(rule: &Rule) -> u8 {
    let any_path = rule.matcher().is_some_and(|m| m.path() == "*");
    match (rule.limit().policy().is_concurrency(), any_path) {
        (true, _) => 0,
        (false, true) => 1,
        (false, false) => 2,
    }
}

impl InboundIndex {
    /// The index of `rules`' rules with a `match`, rule paths read with `path_matching`.
    pub fn build<'a>(
        rules: impl Iterator<Item = &'a Arc<Rule>>,
        path_matching: PathMatching,
    ) -> InboundIndex {
        let mut rules: Vec<Arc<Rule>> = rules
            .filter(|rule| rule.matcher().is_some())
            .cloned()
            .collect();
        rules.sort_by(|a, b| (chain_rank(a), a.name()).cmp(&(chain_rank(b), b.name())));
        let mut own_paths: HashMap<Box<str>, Vec<u32>> = HashMap::new();
        let mut any_path = Vec::new();
        let mut methods = Vec::with_capacity(rules.len());
        for (position, rule) in rules.iter().enumerate() {
            // At most RULES_MAX (10,000) rules: a position always fits in u32.
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            match rule.matcher().and_then(|m| m.path_key(path_matching)) {
                None => any_path.push(position),
                Some(path) => own_paths.entry(path.into()).or_default().push(position),
            }
            methods.push(
                rule.matcher()
                    .map(|m| m.method())
                    .filter(|&method| method != "*")
                    .map(Box::from),
            );
        }
        // Positions are in chain order within each list: merged, the chain's order holds.
        let by_path = own_paths
            .into_iter()
            .map(|(path, own)| {
                let mut positions: Vec<u32> = any_path.iter().chain(&own).copied().collect();
                positions.sort_unstable();
                (path, positions)
            })
            .collect();
        InboundIndex {
            rules,
            methods,
            by_path,
            elsewhere: any_path,
            path_matching,
        }
    }

    /// The rules with a `match`, in chain order: what [`Matched::positions`] point into.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// How request paths, and rule paths, are read before they are compared.
    pub fn path_matching(&self) -> PathMatching {
        self.path_matching
    }

    /// The rules that apply to `method` on `normalized_path` (read with
    /// [`InboundIndex::path_matching`]), in chain order: every one of them. A rule set in force
    /// never lets one request match more than `COUNTERS_PER_REQUEST_MAX` (`check_fanout`);
    /// none is left out here if one did, so the limiter's own error answers for it.
    pub fn matching(&self, method: &str, normalized_path: &str) -> Matched {
        // The path's candidates already match it: only methods are left to compare.
        let candidates = self.by_path.get(normalized_path).unwrap_or(&self.elsewhere);
        let mut matched = Matched::default();
        for &position in candidates {
            let index = position as usize;
            let wanted = self.methods.get(index).and_then(Option::as_deref);
            if !wanted.is_none_or(|wanted| method_matches(wanted, method)) {
                continue;
            }
            let Some(rule) = self.rules.get(index) else {
                continue;
            };
            matched.positions.push(position);
            matched.per_user |= rule.limit().per().is_some();
            matched.leases |= rule.limit().policy().is_concurrency();
        }
        matched
    }

    /// [`InboundIndex::matching`] for a path as received. It is normalized only when a rule
    /// names a path: an undecodable path is refused only where it could change which rules
    /// apply.
    pub fn matching_raw(&self, method: &str, path: &str) -> Result<Matched, PathError> {
        let path = if self.by_path.is_empty() {
            Cow::Borrowed(path)
        } else {
            self.path_matching.normalize(path)?
        };
        Ok(self.matching(method, &path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{RawRule, Validate};

    fn rule(name: &str, kind: &str, method: &str, path: &str) -> Arc<Rule> {
        let json = if kind == "concurrency" {
            format!(
                r#"{{"kind":"concurrency","limit":1,"lease_ttl_ms":1000,"match":{{"method":"{method}","path":"{path}"}}}}"#
            )
        } else {
            format!(
                r#"{{"kind":"rate","limit":1,"period_ms":1000,"per":"user","match":{{"method":"{method}","path":"{path}"}}}}"#
            )
        };
        let raw: RawRule = serde_json::from_str(&json).expect("rule parses");
        Arc::new(raw.validate(name).expect("rule is valid"))
    }

    fn names(index: &InboundIndex, matched: &Matched) -> Vec<String> {
        matched
            .positions
            .iter()
            .map(|&position| index.rules()[position as usize].name().to_owned())
            .collect()
    }

    #[test]
    fn matching_agrees_with_a_scan_of_every_rule_in_chain_order() {
        let rules = [
            rule("b-endpoint", "rate", "GET", "/entity/#"),
            rule("a-endpoint", "rate", "*", "/entity/#"),
            rule("freq", "rate", "*", "*"),
            rule("pool", "concurrency", "POST", "*"),
            rule("other", "rate", "DELETE", "/other"),
        ];
        let index = InboundIndex::build(rules.iter(), PathMatching::default());
        for (method, path) in [
            ("GET", "/entity/#"),
            ("HEAD", "/entity/#"),
            ("POST", "/entity/#"),
            ("DELETE", "/other"),
            ("GET", "/nowhere"),
        ] {
            let scanned: Vec<String> = index
                .rules()
                .iter()
                .filter(|rule| rule.matcher().is_some_and(|m| m.matches(method, path)))
                .map(|rule| rule.name().to_owned())
                .collect();
            let matched = index.matching(method, path);
            assert_eq!(names(&index, &matched), scanned, "{method} {path}");
        }
        let matched = index.matching("POST", "/entity/#");
        assert_eq!(
            names(&index, &matched),
            ["pool", "freq", "a-endpoint"],
            "concurrency first, then every path, then the endpoint's, by name within each"
        );
        assert_eq!((matched.per_user, matched.leases), (true, true));
        assert_eq!(matched.ask(), Ask::Acquire);
        let matched = index.matching("GET", "/nowhere");
        assert_eq!(names(&index, &matched), ["freq"]);
        assert_eq!(matched.ask(), Ask::Check);
    }

    #[test]
    fn a_path_is_read_only_when_a_rule_names_one() {
        let anywhere = [rule("freq", "rate", "*", "*")];
        let index = InboundIndex::build(anywhere.iter(), PathMatching::default());
        let matched = index.matching_raw("GET", "/bad%zz").expect("never read");
        assert_eq!(names(&index, &matched), ["freq"]);
        let somewhere = [rule("endpoint", "rate", "GET", "/entity/#")];
        let index = InboundIndex::build(somewhere.iter(), PathMatching::default());
        assert!(index.matching_raw("GET", "/bad%zz").is_err());
        let matched = index.matching_raw("GET", "/entity/42").expect("decodes");
        assert_eq!(names(&index, &matched), ["endpoint"]);
    }
}
