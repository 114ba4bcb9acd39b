//! Which rules apply to a request. The rules come from the rules crate (a fixed list, or the
//! SQL table reloaded by [`tollgate_rules::Rules`]); matching is the rules crate's: methods by
//! [`method_matches`] (a rule on GET applies to HEAD), paths normalized with the rule set's
//! [`PathMatching`] and compared with rule paths read the same way.
//!
//! Each version of the rules is matched by the rules crate's one inbound matcher
//! ([`InboundIndex`], which `/v1/check` uses too); beside it the layer keeps, per rule, the
//! `RateLimit-Policy` member formatted ahead of time, its counters and its limit's handle, so a
//! request is matched by one lookup and a comparison of methods rather than a scan of every
//! rule. When no rule names a path, the path is not read at all, so an undecodable path is
//! refused only where it could change which rules apply. The layer's index is rebuilt when the
//! rules' version changes, which a request notices by comparing versions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tollgate::{LimitHandle, Limiter};
use tollgate_rules::{
    InboundIndex, Matched, PathError, PathMatching, Rule, RuleError, Rules, check_fanout,
};

use crate::headers::policy_item;
use crate::metrics::RuleCounters;

/// Where the layer's rules come from.
#[derive(Clone, Debug)]
pub enum ThrottleRules {
    /// A fixed list, put in force on the limiter when the layer is built; made by
    /// [`ThrottleRules::fixed`], which checks it.
    Fixed(FixedRules),
    /// The SQL table, as reloaded by `Rules` (which puts each version in force on its limiter,
    /// checked alike at every reload).
    Sql(Rules),
}

/// A fixed list of rules in which no request matches more than `COUNTERS_PER_REQUEST_MAX`:
/// only [`ThrottleRules::fixed`] makes one.
#[derive(Clone, Debug)]
pub struct FixedRules {
    rules: Vec<Arc<Rule>>,
    path_matching: PathMatching,
}

impl FixedRules {
    /// The rules, in the order given.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// How request paths, and rule paths, are read before they are matched.
    pub fn path_matching(&self) -> PathMatching {
        self.path_matching
    }
}

impl ThrottleRules {
    /// A fixed list of rules, paths read as most routers read them
    /// ([`PathMatching::default`]). Refused when one request could match more than
    /// `COUNTERS_PER_REQUEST_MAX` of them (one request is decided all or nothing over at most
    /// that many limits); the error names such a request and its count.
    pub fn fixed(rules: impl IntoIterator<Item = Rule>) -> Result<ThrottleRules, RuleError> {
        ThrottleRules::fixed_with(rules, PathMatching::default())
    }

    /// [`ThrottleRules::fixed`], request and rule paths read with `path_matching`: the reading
    /// of the router behind the layer (case-insensitive, or `;` parameters stripped).
    pub fn fixed_with(
        rules: impl IntoIterator<Item = Rule>,
        path_matching: PathMatching,
    ) -> Result<ThrottleRules, RuleError> {
        let rules: Vec<Arc<Rule>> = rules.into_iter().map(Arc::new).collect();
        check_fanout(rules.iter().map(|rule| &**rule), path_matching)?;
        Ok(ThrottleRules::Fixed(FixedRules {
            rules,
            path_matching,
        }))
    }
}

/// One indexed rule.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) rule: Arc<Rule>,
    pub(crate) policy_item: String,
    pub(crate) is_lease: bool,
    pub(crate) counters: Arc<RuleCounters>,
    /// The rule's limit, looked up when the index was built: a request this rule alone
    /// matches is decided without a name lookup. `None` while the limit is not in force.
    pub(crate) handle: Option<LimitHandle>,
}

/// One version of the rules, indexed for matching.
#[derive(Debug)]
pub(crate) struct RuleIndex {
    version: u64,
    /// The rules crate's matcher for this version; `entries` are in its chain order.
    inbound: Arc<InboundIndex>,
    /// One per rule of `inbound`, at the same position.
    pub(crate) entries: Vec<Entry>,
}

impl RuleIndex {
    fn build(
        version: u64,
        inbound: Arc<InboundIndex>,
        previous: Option<&RuleIndex>,
        limiter: Option<&Limiter>,
    ) -> RuleIndex {
        let old_counters: HashMap<&str, &Arc<RuleCounters>> = previous
            .map(|index| {
                index
                    .entries
                    .iter()
                    .map(|entry| (entry.rule.name(), &entry.counters))
                    .collect()
            })
            .unwrap_or_default();
        let entries = inbound
            .rules()
            .iter()
            .map(|rule| Entry {
                rule: rule.clone(),
                policy_item: policy_item(rule.limit()),
                is_lease: rule.limit().policy().is_concurrency(),
                counters: old_counters
                    .get(rule.name())
                    .map_or_else(Default::default, |counters| Arc::clone(counters)),
                handle: limiter.and_then(|limiter| limiter.handle(rule.name()).ok()),
            })
            .collect();
        RuleIndex {
            version,
            inbound,
            entries,
        }
    }

    /// The rules that apply to `request`, in chain order (see [`InboundIndex::matching_raw`]).
    pub(crate) fn matching_request<B>(
        &self,
        request: &http::Request<B>,
    ) -> Result<Matched, PathError> {
        self.inbound
            .matching_raw(request.method().as_str(), request.uri().path())
    }
}

/// The rules source and its current index.
#[derive(Debug)]
pub(crate) struct RuleTracker {
    limiter: Limiter,
    index: Indexed,
    /// One rebuild at a time; others keep using the index they have.
    rebuilding: Mutex<()>,
}

impl RuleTracker {
    /// For fixed rules, put them in force on `limiter` (replacing any limit of the same name).
    pub(crate) fn new(source: ThrottleRules, limiter: &Limiter) -> RuleTracker {
        let index = match source {
            ThrottleRules::Fixed(FixedRules {
                rules,
                path_matching,
            }) => {
                for rule in &rules {
                    limiter.set_limit(rule.limit().clone());
                }
                Indexed::Fixed(Arc::new(RuleIndex::build(
                    0,
                    Arc::new(InboundIndex::build(rules.iter(), path_matching)),
                    None,
                    Some(limiter),
                )))
            }
            ThrottleRules::Sql(rules) => {
                let snapshot = rules.snapshot();
                let index = RuleIndex::build(
                    snapshot.version(),
                    Arc::clone(snapshot.inbound()),
                    None,
                    Some(limiter),
                );
                Indexed::Reloaded {
                    rules,
                    index: ArcSwap::from_pointee(index),
                }
            }
        };
        RuleTracker {
            limiter: limiter.clone(),
            index,
            rebuilding: Mutex::new(()),
        }
    }

    /// The index of the rules in force now.
    pub(crate) fn index(&self) -> Arc<RuleIndex> {
        match &self.index {
            Indexed::Fixed(index) => Arc::clone(index),
            Indexed::Reloaded { rules, index } => {
                let current = index.load_full();
                if rules.version() == current.version {
                    return current;
                }
                self.rebuild(index, rules);
                index.load_full()
            }
        }
    }

    /// Index the rules in force now, unless another request is doing so (this one then uses
    /// the previous version, as it would have a moment earlier).
    fn rebuild(&self, index: &ArcSwap<RuleIndex>, rules: &Rules) {
        let Ok(_guard) = self.rebuilding.try_lock() else {
            return;
        };
        let snapshot = rules.snapshot();
        let current = index.load_full();
        if snapshot.version() == current.version {
            return;
        }
        index.store(Arc::new(RuleIndex::build(
            snapshot.version(),
            Arc::clone(snapshot.inbound()),
            Some(&current),
            Some(&self.limiter),
        )));
    }
}

/// The index in force: built once for fixed rules, rebuilt for each version of SQL ones.
#[derive(Debug)]
enum Indexed {
    Fixed(Arc<RuleIndex>),
    Reloaded {
        rules: Rules,
        index: ArcSwap<RuleIndex>,
    },
}

#[cfg(test)]
mod tests {
    use tollgate::COUNTERS_PER_REQUEST_MAX;
    use tollgate_rules::{PathCase, PathParams, RawRule, Validate, normalize_path};

    use super::*;

    fn index_of(rules: &[Arc<Rule>], path_matching: PathMatching) -> RuleIndex {
        let inbound = InboundIndex::build(rules.iter(), path_matching);
        RuleIndex::build(0, Arc::new(inbound), None, None)
    }

    fn rule(name: &str, method: &str, path: &str) -> Arc<Rule> {
        rule_of(
            name,
            r#""kind":"rate","limit":5,"period_ms":1000,"per":"user""#,
            method,
            path,
        )
    }

    fn rule_of(name: &str, policy: &str, method: &str, path: &str) -> Arc<Rule> {
        let json = format!(r#"{{{policy},"match":{{"method":"{method}","path":"{path}"}}}}"#);
        let raw: RawRule = serde_json::from_str(&json).expect("rule parses");
        Arc::new(raw.validate(name).expect("rule is valid"))
    }

    /// What `matching` must answer: every entry whose rule matches, in chain order.
    fn by_scan(index: &RuleIndex, method: &str, path: &str) -> Vec<u32> {
        (0..index.entries.len() as u32)
            .filter(|&p| {
                index.entries[p as usize]
                    .rule
                    .matcher()
                    .is_some_and(|m| m.matches(method, path))
            })
            .collect()
    }

    const GLOBAL: &str = r#""kind":"rate","limit":5,"period_ms":1000"#;
    const CONCURRENCY: &str = r#""kind":"concurrency","limit":2,"lease_ttl_ms":1000,"per":"user""#;

    /// Sets in which one request matches more rules than one request may name.
    fn too_wide() -> Vec<Vec<Arc<Rule>>> {
        vec![
            (0..COUNTERS_PER_REQUEST_MAX + 1)
                .map(|n| rule(&format!("r{n}"), "*", "*"))
                .collect(),
            // An endpoint rule first in the chain, and every broad rule after it.
            std::iter::once(rule_of("item-conc", CONCURRENCY, "*", "/items/1"))
                .chain((0..COUNTERS_PER_REQUEST_MAX).map(|n| rule(&format!("r{n}"), "*", "*")))
                .collect(),
            // Rules on GET everywhere and on /items/1 for any method meet on GET /items/1.
            (0..4)
                .map(|n| rule(&format!("g{n}"), "get", "*"))
                .chain((0..5).map(|n| rule(&format!("i{n}"), "*", "/items/1")))
                .collect(),
        ]
    }

    #[test]
    fn fixed_refuses_a_set_one_request_could_match_too_much_of() {
        for rules in too_wide() {
            let error = ThrottleRules::fixed(rules.iter().map(|rule| (**rule).clone()))
                .expect_err("refused");
            assert_eq!(error.field, "match");
            assert!(error.reason.contains("would match 9 rules"), "{error}");
            // Built unchecked, the index still drops none of them: the limiter refuses a
            // request naming too many limits with its own error.
            let index = index_of(&rules, PathMatching::default());
            for (method, path) in [("GET", "/items/#"), ("GET", "/")] {
                assert_eq!(
                    index.inbound.matching(method, path).positions.to_vec(),
                    by_scan(&index, method, path)
                );
            }
            assert_eq!(index.inbound.matching("GET", "/items/#").positions.len(), 9);
        }
        let fits =
            (0..COUNTERS_PER_REQUEST_MAX).map(|n| (*rule(&format!("r{n}"), "*", "*")).clone());
        assert!(ThrottleRules::fixed(fits).is_ok());
    }

    #[test]
    fn matching_agrees_with_a_scan_of_every_rule() {
        let sets: Vec<Vec<Arc<Rule>>> = vec![
            vec![rule("freq", "*", "*")],
            vec![rule("a", "*", "*"), rule("b", "*", "*")],
            // A method narrows a rule on every path.
            vec![rule("a", "*", "*"), rule("gets", "GET", "*")],
            vec![rule("a", "*", "*"), rule("item", "GET", "/items/1")],
            Vec::new(),
            vec![rule("a", "*", "*"), rule("item-any", "*", "/items/1")],
            vec![
                rule("a", "*", "*"),
                rule("item-any", "*", "/items/1"),
                rule("item-get", "GET", "/items/1"),
                rule("root-post", "POST", "/"),
            ],
            vec![rule_of("all", GLOBAL, "*", "*")],
            vec![
                rule_of("conc", CONCURRENCY, "*", "*"),
                rule_of("all", GLOBAL, "*", "*"),
            ],
            vec![
                rule_of("all", GLOBAL, "*", "*"),
                rule_of("item-conc", CONCURRENCY, "GET", "/items/1"),
            ],
            // As many as a request may name, an endpoint rule first in the chain.
            std::iter::once(rule_of("item-conc", CONCURRENCY, "*", "/items/1"))
                .chain((0..COUNTERS_PER_REQUEST_MAX - 1).map(|n| rule(&format!("r{n}"), "*", "*")))
                .collect(),
            // As many as a request may name on every path.
            (0..COUNTERS_PER_REQUEST_MAX)
                .map(|n| rule(&format!("r{n}"), "*", "*"))
                .collect(),
        ];
        for rules in sets {
            let index = index_of(&rules, PathMatching::default());
            let requests = [
                ("GET", "/items/7"),
                ("HEAD", "/items/7"),
                ("head", "/"),
                ("POST", "/items/7?q=1"),
                ("GET", "/"),
                ("post", "/"),
                ("get", "/items/3"),
                ("DELETE", "/other"),
            ];
            for (method, path) in requests {
                let request = http::Request::builder()
                    .method(method)
                    .uri(path)
                    .body(())
                    .expect("request");
                let normalized = normalize_path(request.uri().path()).expect("decodable");
                let expected = by_scan(&index, method, &normalized);
                let matching = index.matching_request(&request).expect("decodable");
                assert_eq!(
                    matching.positions.to_vec(),
                    expected,
                    "{method} {path} on {} rules",
                    rules.len()
                );
                let entries = || expected.iter().map(|&p| &index.entries[p as usize]);
                assert_eq!(
                    matching.per_user,
                    entries().any(|e| e.rule.limit().per().is_some())
                );
                assert_eq!(matching.leases, entries().any(|e| e.is_lease));
            }
        }
    }

    #[test]
    fn an_undecodable_path_is_an_error_only_where_a_rule_names_a_path() {
        let request = http::Request::builder()
            .uri("/items/%ZZ")
            .body(())
            .expect("request");
        let everywhere = [rule("a", "*", "*")];
        let index = index_of(&everywhere, PathMatching::default());
        assert!(index.matching_request(&request).is_ok());
        let endpoint = [rule("a", "*", "*"), rule("item", "GET", "/items/#")];
        let index = index_of(&endpoint, PathMatching::default());
        assert!(matches!(
            index.matching_request(&request),
            Err(PathError::BadEscape { offset: 7 })
        ));
        let spelled = http::Request::builder()
            .uri("/items/%2B07")
            .body(())
            .expect("request");
        let matching = index.matching_request(&spelled).expect("decodable");
        assert_eq!(matching.positions.len(), 2);
    }

    fn names(index: &RuleIndex, method: &str, uri: &str) -> Vec<String> {
        let request = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .expect("request");
        let matching = index.matching_request(&request).expect("decodable");
        matching
            .positions
            .iter()
            .map(|&p| index.entries[p as usize].rule.name().to_owned())
            .collect()
    }

    /// The index reads request paths and rule paths as the rule set says.
    #[test]
    fn the_index_reads_paths_as_the_rule_set_does() {
        let rules = [
            (*rule("bundle", "GET", "/Repo/Entity/#/Bundle")).clone(),
            (*rule("any", "*", "*")).clone(),
        ];
        let index = |path_matching| {
            let ThrottleRules::Fixed(fixed) =
                ThrottleRules::fixed_with(rules.clone(), path_matching).expect("fits")
            else {
                unreachable!("fixed rules")
            };
            index_of(&fixed.rules, fixed.path_matching)
        };
        let default = index(PathMatching::default());
        let lower = index(PathMatching {
            case: PathCase::Insensitive,
            params: PathParams::Keep,
        });
        let strip = index(PathMatching {
            case: PathCase::Sensitive,
            params: PathParams::Strip,
        });
        let both = index(PathMatching {
            case: PathCase::Insensitive,
            params: PathParams::Strip,
        });
        let spellings = [
            "/Repo/Entity/12/Bundle",
            "/repo/entity/12/bundle",
            "/REPO/Entity/12;jsessionid=1/Bundle",
            "/Repo/Entity/12;v=2/Bundle;x",
        ];
        let matched = |index: &RuleIndex| {
            spellings
                .iter()
                .map(|uri| names(index, "HEAD", uri).len() == 2)
                .collect::<Vec<_>>()
        };
        assert_eq!(matched(&default), [true, false, false, false]);
        assert_eq!(matched(&lower), [true, true, false, false]);
        assert_eq!(matched(&strip), [true, false, false, true]);
        assert_eq!(matched(&both), [true, true, true, true]);
        assert_eq!(names(&both, "POST", "/repo/entity/1/bundle"), ["any"]);
    }

    #[test]
    fn fixed_rules_are_counted_with_their_reading() {
        // Eight rules that are one path to a case-insensitive router: one more on that path
        // is refused there, and fits where case tells them apart.
        let rules: Vec<Rule> = (0..9)
            .map(|n| {
                let path = if n % 2 == 0 { "/Items" } else { "/items" };
                (*rule(&format!("r{n}"), "GET", path)).clone()
            })
            .collect();
        let insensitive = PathMatching {
            case: PathCase::Insensitive,
            params: PathParams::Keep,
        };
        let error =
            ThrottleRules::fixed_with(rules.clone(), insensitive).expect_err("9 on one path");
        assert!(
            error
                .reason
                .contains("a GET request on /items would match 9"),
            "{error}"
        );
        assert!(ThrottleRules::fixed(rules).is_ok());
    }
}
