//! How many rules one request can match. One request is decided all or nothing over at most
//! [`tollgate::COUNTERS_PER_REQUEST_MAX`] limits, so a rule set in force never lets a request
//! match more than that: a set (or a rule added to one) that would is refused, naming a request
//! that would match too many.
//!
//! Matching is exact (see [`Match::matches`](crate::Match::matches)): a request matches a rule
//! when its method equals the rule's (ignoring case) or the rule's is `*`, and its normalized
//! path equals the rule's (read with the set's [`PathMatching`]) or the rule's is `*`. A rule
//! on GET also matches HEAD requests: it is counted under both methods, so a HEAD request
//! counts the rules on HEAD and those on GET. A request's count is therefore
//! `any + by_method[m] + by_path[p] + by_pair[(m, p)]`, counting rules on (`*`, `*`), (m, `*`),
//! (`*`, p) and (m, p), and the widest request is found from those four counts without
//! enumerating every method and path together. A method or path no rule names counts as zero
//! in the maps: "any other" is a candidate too.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

use tollgate::COUNTERS_PER_REQUEST_MAX;

use crate::path::PathMatching;
use crate::rule::{Rule, RuleError};

/// A request that matches the most rules (of a set, or of those a rule added to a set
/// matches), and how many it matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Widest {
    /// The request's method, upper case; `None` when the count is the same for every method.
    pub method: Option<String>,
    /// The request's normalized path; `None` when the count is the same for every path.
    pub path: Option<String>,
    /// How many rules it matches.
    pub rules: usize,
}

impl Widest {
    /// The refusal of a rule (or set) that lets this request match more than `cap` rules: the
    /// field is `match`, and the reason names the request, the count and the cap.
    pub fn refusal(&self, cap: usize) -> RuleError {
        RuleError {
            field: "match".into(),
            reason: format!(
                "{self} would match {} rules; one request may be decided on at most {cap}",
                self.rules
            ),
        }
    }
}

impl fmt::Display for Widest {
    /// The request, as words: `a GET request on /entity/#/bundle`, `any request`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.method, &self.path) {
            (Some(method), Some(path)) => write!(f, "a {method} request on {path}"),
            (Some(method), None) => write!(f, "a {method} request on any path"),
            (None, Some(path)) => write!(f, "a request of any method on {path}"),
            (None, None) => f.write_str("any request"),
        }
    }
}

/// A rule's `match` as the counts see it: `None` for `*`, the methods of the requests it
/// matches, upper case (a rule on GET is counted under HEAD too, see `method_matches`), and
/// its path as `matching` reads it.
type Shape<'r> = (MethodsOf, Option<Cow<'r, str>>);

/// The methods a rule is counted under: `[None]` for `*`, one method, or GET and HEAD.
type MethodsOf = Vec<Option<String>>;

fn shape(rule: &Rule, matching: PathMatching) -> Option<Shape<'_>> {
    let matcher = rule.matcher()?;
    let mut methods = MethodsOf::with_capacity(2);
    match matcher.method() {
        "*" => methods.push(None),
        method => {
            let method = method.to_ascii_uppercase();
            let head = method == "GET";
            methods.push(Some(method));
            if head {
                methods.push(Some("HEAD".to_owned()));
            }
        }
    }
    Some((methods, matcher.path_key(matching)))
}

/// The request that matches the most of `rules` (paths read with `matching`), with its count;
/// `None` when no rule has a `match` (rules without one are never matched by a request).
/// Linear in the number of rules.
pub(crate) fn widest<'a>(
    rules: impl IntoIterator<Item = &'a Rule>,
    matching: PathMatching,
) -> Option<Widest> {
    // With no cap, every rule is added; the widest request is then the one a further rule on
    // every request would meet, less that rule.
    let mut fanout = Fanout::new(usize::MAX, matching);
    let mut matched = false;
    for rule in rules {
        matched |= rule.matcher().is_some();
        let _ = fanout.try_add(rule);
    }
    matched.then(|| {
        let rules = fanout.widest_with(None, None) - 1;
        Widest {
            rules,
            ..fanout.example(None, None, rules + 1)
        }
    })
}

/// Refuse `rules` if one request could match more than
/// [`COUNTERS_PER_REQUEST_MAX`](tollgate::COUNTERS_PER_REQUEST_MAX) of them, paths read with
/// `matching`.
pub fn check_fanout<'a>(
    rules: impl IntoIterator<Item = &'a Rule>,
    matching: PathMatching,
) -> Result<(), RuleError> {
    match widest(rules, matching) {
        Some(widest) if widest.rules > COUNTERS_PER_REQUEST_MAX => {
            Err(widest.refusal(COUNTERS_PER_REQUEST_MAX))
        }
        _ => Ok(()),
    }
}

/// A multiset of small counts, answering its largest.
#[derive(Debug, Default)]
struct Tally {
    /// How many members have each value; no trailing zeros, so the largest is the last.
    by_value: Vec<u32>,
}

impl Tally {
    /// Zero is not recorded: the largest of an empty tally is zero anyway.
    fn add(&mut self, value: usize) {
        if value == 0 {
            return;
        }
        if self.by_value.len() <= value {
            self.by_value.resize(value + 1, 0);
        }
        self.by_value[value] += 1;
    }

    fn remove(&mut self, value: usize) {
        if let Some(members) = self.by_value.get_mut(value).filter(|_| value > 0) {
            *members = members.saturating_sub(1);
        }
        while self.by_value.last() == Some(&0) {
            self.by_value.pop();
        }
    }

    fn replace(&mut self, old: usize, new: usize) {
        self.remove(old);
        self.add(new);
    }

    fn max(&self) -> usize {
        self.by_value.len().saturating_sub(1)
    }
}

/// A method named by rules: its rules on every path, and the paths it is named with.
#[derive(Debug, Default)]
struct MethodCounts {
    any_path: usize,
    /// The rules on (this method, path), by path; none counted zero.
    paths: HashMap<String, usize>,
    /// `by_path[q] + pair[(m, q)]` for each of `paths`: what a request with this method counts
    /// besides `any + any_path` on that path.
    on_paths: Tally,
}

/// A path named by rules: its rules on every method, and the methods it is named with.
#[derive(Debug, Default)]
struct PathCounts {
    any_method: usize,
    methods: HashSet<String>,
    /// `by_method[m] + pair[(m, p)]` for each of `methods`.
    on_methods: Tally,
}

/// A rule set as it is assembled, refusing each rule that would let one request match more
/// than the cap. Checking a rule costs a few map lookups; adding or removing one on every path
/// (or every method) also visits the paths (methods) it is named with beside a method (path).
#[derive(Debug)]
pub(crate) struct Fanout {
    cap: usize,
    /// How the set's paths are read: two rule paths that read alike are one path.
    matching: PathMatching,
    any: usize,
    methods: HashMap<String, MethodCounts>,
    paths: HashMap<String, PathCounts>,
    /// `by_method[m]` for every method.
    method_counts: Tally,
    /// `by_path[p]` for every path.
    path_counts: Tally,
    /// `by_method[m] + by_path[p] + pair[(m, p)]` for every pair named by a rule.
    pair_counts: Tally,
}

impl Default for Fanout {
    fn default() -> Fanout {
        Fanout::new(COUNTERS_PER_REQUEST_MAX, PathMatching::default())
    }
}

impl Fanout {
    /// An empty set whose requests may match at most `cap` rules, paths read with `matching`.
    pub fn new(cap: usize, matching: PathMatching) -> Fanout {
        Fanout {
            cap,
            matching,
            any: 0,
            methods: HashMap::new(),
            paths: HashMap::new(),
            method_counts: Tally::default(),
            path_counts: Tally::default(),
            pair_counts: Tally::default(),
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    fn by_method(&self, method: &str) -> usize {
        self.methods.get(method).map_or(0, |counts| counts.any_path)
    }

    fn by_path(&self, path: &str) -> usize {
        self.paths.get(path).map_or(0, |counts| counts.any_method)
    }

    fn pair(&self, method: &str, path: &str) -> usize {
        self.methods
            .get(method)
            .and_then(|counts| counts.paths.get(path))
            .copied()
            .unwrap_or(0)
    }

    /// Add `rule` if every request it matches would still match at most the cap; otherwise
    /// leave the set unchanged and answer the widest such request, counting `rule`. A rule
    /// without a `match` is always added (it counts for no request).
    pub fn try_add(&mut self, rule: &Rule) -> Result<(), Widest> {
        let Some((methods, path)) = shape(rule, self.matching) else {
            return Ok(());
        };
        let path = path.as_deref();
        // The widest request over every method the rule is counted under; of equals, the
        // rule's own method (the first) is named.
        let widest = methods
            .iter()
            .rev()
            .map(|method| (method.as_deref(), self.widest_with(method.as_deref(), path)))
            .max_by_key(|&(_, widest)| widest);
        if let Some((method, widest)) = widest.filter(|&(_, widest)| widest > self.cap) {
            return Err(self.example(method, path, widest));
        }
        for method in &methods {
            self.change(method.as_deref(), path, true);
        }
        Ok(())
    }

    /// Remove a rule added before (by `try_add`), making room for others.
    pub fn remove(&mut self, rule: &Rule) {
        if let Some((methods, path)) = shape(rule, self.matching) {
            for method in &methods {
                self.change(method.as_deref(), path.as_deref(), false);
            }
        }
    }

    /// The count of the widest request a rule on (`method`, `path`) matches, counting it.
    fn widest_with(&self, method: Option<&str>, path: Option<&str>) -> usize {
        let rest = match (method, path) {
            (None, None) => {
                (self.method_counts.max() + self.path_counts.max()).max(self.pair_counts.max())
            }
            (Some(method), None) => {
                let on_paths = self
                    .methods
                    .get(method)
                    .map_or(0, |counts| counts.on_paths.max());
                self.by_method(method) + self.path_counts.max().max(on_paths)
            }
            (None, Some(path)) => {
                let on_methods = self
                    .paths
                    .get(path)
                    .map_or(0, |counts| counts.on_methods.max());
                self.by_path(path) + self.method_counts.max().max(on_methods)
            }
            (Some(method), Some(path)) => {
                self.by_method(method) + self.by_path(path) + self.pair(method, path)
            }
        };
        self.any + rest + 1
    }

    /// A request that a rule on (`method`, `path`) matches and that would match `rules` rules
    /// with it: found only for a refusal, so it may visit every method or path.
    fn example(&self, method: Option<&str>, path: Option<&str>, rules: usize) -> Widest {
        // The request's count besides `any` and the rule itself.
        let needed = rules - self.any - 1;
        let best_method = || {
            self.methods
                .iter()
                .filter(|(_, counts)| counts.any_path == self.method_counts.max())
                .map(|(method, _)| method.as_str())
                .min()
                .filter(|_| self.method_counts.max() > 0)
        };
        let best_path = || {
            self.paths
                .iter()
                .filter(|(_, counts)| counts.any_method == self.path_counts.max())
                .map(|(path, _)| path.as_str())
                .min()
                .filter(|_| self.path_counts.max() > 0)
        };
        let (method, path) = match (method, path) {
            (None, None) if self.method_counts.max() + self.path_counts.max() == needed => {
                (best_method(), best_path())
            }
            (None, None) => self
                .methods
                .iter()
                .flat_map(|(method, counts)| {
                    counts.paths.iter().map(move |(path, &pair)| {
                        (method.as_str(), path.as_str(), counts.any_path + pair)
                    })
                })
                .filter(|&(_, path, count)| count + self.by_path(path) == needed)
                .map(|(method, path, _)| (method, path))
                .min()
                .map_or((None, None), |(method, path)| (Some(method), Some(path))),
            (Some(method), None) if self.by_method(method) + self.path_counts.max() == needed => {
                (Some(method), best_path())
            }
            (Some(method), None) => {
                let path = self.methods.get(method).and_then(|counts| {
                    counts
                        .paths
                        .iter()
                        .filter(|&(path, &pair)| {
                            counts.any_path + self.by_path(path) + pair == needed
                        })
                        .map(|(path, _)| path.as_str())
                        .min()
                });
                (Some(method), path)
            }
            (None, Some(path)) if self.by_path(path) + self.method_counts.max() == needed => {
                (best_method(), Some(path))
            }
            (None, Some(path)) => {
                let method = self.paths.get(path).and_then(|counts| {
                    counts
                        .methods
                        .iter()
                        .filter(|method| {
                            self.by_method(method) + self.by_path(path) + self.pair(method, path)
                                == needed
                        })
                        .min()
                });
                (method.map(String::as_str), Some(path))
            }
            (Some(method), Some(path)) => (Some(method), Some(path)),
        };
        Widest {
            method: method.map(str::to_owned),
            path: path.map(str::to_owned),
            rules,
        }
    }

    /// Count a rule on (`method`, `path`) in or out, keeping every tally in step.
    fn change(&mut self, method: Option<&str>, path: Option<&str>, add: bool) {
        let step = |count: usize| {
            if add {
                count + 1
            } else {
                count.saturating_sub(1)
            }
        };
        match (method, path) {
            (None, None) => self.any = step(self.any),
            (Some(method), None) => {
                let entry = self.methods.entry(method.to_owned()).or_default();
                let old = entry.any_path;
                let new = step(old);
                entry.any_path = new;
                self.method_counts.replace(old, new);
                // Every pair named with this method counts it: visited only when a rule on
                // (method, *) comes or goes, of which at most the cap are ever in a set.
                for (path, &pair) in &entry.paths {
                    let by_path = self.paths.get_mut(path.as_str());
                    let by_path = match by_path {
                        Some(counts) => {
                            counts.on_methods.replace(old + pair, new + pair);
                            counts.any_method
                        }
                        None => 0,
                    };
                    self.pair_counts
                        .replace(old + by_path + pair, new + by_path + pair);
                }
                self.forget_method(method);
            }
            (None, Some(path)) => {
                let entry = self.paths.entry(path.to_owned()).or_default();
                let old = entry.any_method;
                let new = step(old);
                entry.any_method = new;
                self.path_counts.replace(old, new);
                for method in &entry.methods {
                    let Some(counts) = self.methods.get_mut(method.as_str()) else {
                        continue;
                    };
                    let pair = counts.paths.get(path).copied().unwrap_or(0);
                    counts.on_paths.replace(old + pair, new + pair);
                    let by_method = counts.any_path;
                    self.pair_counts
                        .replace(by_method + old + pair, by_method + new + pair);
                }
                self.forget_path(path);
            }
            (Some(method), Some(path)) => {
                let by_method = self.by_method(method);
                let by_path = self.by_path(path);
                let old = self.pair(method, path);
                let new = step(old);
                // A pair counted zero is not a member of the tallies (nor of the name sets).
                let member = |count: usize, base: usize| (count > 0).then_some(base + count);
                let method_counts = self.methods.entry(method.to_owned()).or_default();
                if let Some(value) = member(old, by_path) {
                    method_counts.on_paths.remove(value);
                }
                if let Some(value) = member(new, by_path) {
                    method_counts.on_paths.add(value);
                    method_counts.paths.insert(path.to_owned(), new);
                } else {
                    method_counts.paths.remove(path);
                }
                let path_counts = self.paths.entry(path.to_owned()).or_default();
                if let Some(value) = member(old, by_method) {
                    path_counts.on_methods.remove(value);
                }
                if let Some(value) = member(new, by_method) {
                    path_counts.on_methods.add(value);
                    path_counts.methods.insert(method.to_owned());
                } else {
                    path_counts.methods.remove(method);
                }
                if let Some(value) = member(old, by_method + by_path) {
                    self.pair_counts.remove(value);
                }
                if let Some(value) = member(new, by_method + by_path) {
                    self.pair_counts.add(value);
                }
                self.forget_method(method);
                self.forget_path(path);
            }
        }
    }

    /// Drop a method's entry once no rule names it, so memory follows the set.
    fn forget_method(&mut self, method: &str) {
        if self
            .methods
            .get(method)
            .is_some_and(|counts| counts.any_path == 0 && counts.paths.is_empty())
        {
            self.methods.remove(method);
        }
    }

    fn forget_path(&mut self, path: &str) {
        if self
            .paths
            .get(path)
            .is_some_and(|counts| counts.any_method == 0 && counts.methods.is_empty())
        {
            self.paths.remove(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{RawRule, Validate};

    fn rule(name: &str, method: &str, path: &str) -> Rule {
        let json = format!(
            r#"{{"kind":"rate","limit":5,"period_ms":1000,"match":{{"method":"{method}","path":"{path}"}}}}"#
        );
        let raw: RawRule = serde_json::from_str(&json).expect("rule parses");
        raw.validate(name).expect("rule is valid")
    }

    fn unmatched(name: &str) -> Rule {
        let raw: RawRule =
            serde_json::from_str(r#"{"kind":"rate","limit":5,"period_ms":1000}"#).expect("parses");
        raw.validate(name).expect("valid")
    }

    fn widest_of(rules: &[Rule]) -> Option<Widest> {
        widest(rules.iter(), PathMatching::default())
    }

    const OTHER_METHOD: &str = "NOBODYSMETHOD";
    /// Requested whether or not a rule names it: rules on GET match it.
    const HEAD: &str = "HEAD";
    const OTHER_PATH: &str = "/nobodys/path";

    /// How many of `rules` a request matches, by `Match::matches` itself.
    fn count(rules: &[&Rule], method: &str, path: &str) -> usize {
        rules
            .iter()
            .filter(|rule| rule.matcher().is_some_and(|m| m.matches(method, path)))
            .count()
    }

    /// The largest count over every method and path the rules name, and one of each they do
    /// not: the reference `widest` and `Fanout` must agree with.
    fn by_every_request(rules: &[&Rule]) -> usize {
        let matchers = || rules.iter().filter_map(|rule| rule.matcher());
        let methods: Vec<&str> = matchers()
            .map(|m| m.method())
            .chain([OTHER_METHOD, HEAD])
            .collect();
        let paths: Vec<&str> = matchers().map(|m| m.path()).chain([OTHER_PATH]).collect();
        let mut most = 0;
        for method in &methods {
            for path in &paths {
                most = most.max(count(rules, method, path));
            }
        }
        most
    }

    /// The concrete request a `Widest` stands for (an unnamed method or path: one no rule names).
    fn request_of(widest: &Widest) -> (&str, &str) {
        (
            widest.method.as_deref().unwrap_or(OTHER_METHOD),
            widest.path.as_deref().unwrap_or(OTHER_PATH),
        )
    }

    #[test]
    fn a_set_without_matches_has_no_widest_request() {
        assert_eq!(widest_of(&[]), None);
        assert_eq!(widest_of(&[unmatched("a"), unmatched("b")]), None);
        assert_eq!(
            check_fanout(&[unmatched("a")], PathMatching::default()),
            Ok(())
        );
    }

    #[test]
    fn broad_rules_count_for_every_request() {
        let rules: Vec<Rule> = (0..9).map(|n| rule(&format!("b{n}"), "*", "*")).collect();
        let widest = widest_of(&rules).expect("some rule matches");
        assert_eq!(
            widest,
            Widest {
                method: None,
                path: None,
                rules: 9
            }
        );
        let refusal = check_fanout(&rules, PathMatching::default()).expect_err("9 is over the cap");
        assert_eq!(refusal.field, "match");
        assert_eq!(
            refusal.reason,
            "any request would match 9 rules; one request may be decided on at most 8"
        );
        assert_eq!(check_fanout(&rules[..8], PathMatching::default()), Ok(()));
    }

    #[test]
    fn method_and_path_rules_combine_on_the_request_they_share() {
        // 2 on everything, 2 on GET anywhere, 2 on any method of /a, 1 on GET /a, and some on
        // other requests: GET /a matches 7.
        let rules = vec![
            rule("all-1", "*", "*"),
            rule("all-2", "*", "*"),
            rule("get-1", "GET", "*"),
            rule("get-2", "get", "*"),
            rule("a-1", "*", "/a"),
            rule("a-2", "*", "/a/"),
            rule("get-a", "GET", "/a"),
            rule("post-b-1", "POST", "/b"),
            rule("post-b-2", "POST", "/b"),
            rule("post-b-3", "POST", "/b"),
            rule("b", "*", "/b"),
            unmatched("no-match"),
        ];
        let widest = widest_of(&rules).expect("some rule matches");
        assert_eq!(
            widest,
            Widest {
                method: Some("GET".into()),
                path: Some("/a".into()),
                rules: 7
            }
        );
        assert_eq!(widest.to_string(), "a GET request on /a");
        let all: Vec<&Rule> = rules.iter().collect();
        assert_eq!(by_every_request(&all), 7);
        // Two more POST /b rules make POST /b the widest: 2 + 1 + 5.
        let mut more = rules.clone();
        more.push(rule("post-b-4", "post", "/b"));
        more.push(rule("post-b-5", "POST", "/b"));
        assert_eq!(
            widest_of(&more),
            Some(Widest {
                method: Some("POST".into()),
                path: Some("/b".into()),
                rules: 8
            })
        );
    }

    #[test]
    fn a_method_on_every_path_and_a_path_on_every_method_meet() {
        // No rule names GET on /a, yet a GET on /a matches both kinds.
        let rules = vec![
            rule("gets", "GET", "*"),
            rule("a-1", "*", "/a"),
            rule("a-2", "*", "/a"),
            rule("posts", "POST", "*"),
        ];
        let widest = widest_of(&rules).expect("some rule matches");
        assert_eq!(widest.rules, 3);
        assert_eq!(widest.path.as_deref(), Some("/a"));
        let (method, path) = request_of(&widest);
        let all: Vec<&Rule> = rules.iter().collect();
        assert_eq!(count(&all, method, path), 3);
        // Paths on every method alone: the method does not matter.
        let paths = [rule("a-1", "*", "/a"), rule("a-2", "*", "/a")];
        assert_eq!(
            widest_of(&paths).map(|w| w.to_string()),
            Some("a request of any method on /a".to_owned())
        );
        let methods = [rule("g", "get", "*")];
        assert_eq!(
            widest_of(&methods).map(|w| w.to_string()),
            Some("a GET request on any path".to_owned())
        );
    }

    #[test]
    fn methods_are_compared_ignoring_case() {
        let mut fanout = Fanout::new(2, PathMatching::default());
        fanout.try_add(&rule("a", "get", "*")).expect("fits");
        fanout.try_add(&rule("b", "GET", "/x")).expect("fits");
        let refused = fanout
            .try_add(&rule("c", "Get", "/x"))
            .expect_err("a GET on /x would match 3");
        assert_eq!(
            refused,
            Widest {
                method: Some("GET".into()),
                path: Some("/x".into()),
                rules: 3
            }
        );
        fanout.try_add(&rule("d", "post", "/x")).expect("fits");
    }

    #[test]
    fn a_head_request_counts_the_rules_on_get() {
        let mut fanout = Fanout::new(3, PathMatching::default());
        fanout.try_add(&rule("get-any", "GET", "*")).expect("fits");
        fanout.try_add(&rule("head-x", "HEAD", "/x")).expect("fits");
        fanout.try_add(&rule("get-x", "GET", "/x")).expect("fits");
        // A GET on /x matches 2, a HEAD on /x 3: a fourth on HEAD is refused, naming HEAD.
        let refused = fanout
            .try_add(&rule("head-x-2", "head", "/x"))
            .expect_err("a HEAD on /x would match 4");
        assert_eq!(refused.to_string(), "a HEAD request on /x");
        assert_eq!(refused.rules, 4);
        fanout.try_add(&rule("post-x", "POST", "/x")).expect("fits");
        let refused = fanout
            .try_add(&rule("get-x-2", "GET", "/x"))
            .expect_err("a HEAD on /x would match 4");
        assert_eq!(refused.to_string(), "a HEAD request on /x");
        fanout.remove(&rule("head-x", "HEAD", "/x"));
        fanout
            .try_add(&rule("get-x-2", "GET", "/x"))
            .expect("fits now");
    }

    #[test]
    fn paths_that_read_alike_are_one_path() {
        let matching = PathMatching {
            case: crate::path::PathCase::Insensitive,
            params: crate::path::PathParams::Strip,
        };
        let rules = [
            rule("a", "POST", "/Items/1"),
            rule("b", "POST", "/items/2;v=1"),
            rule("c", "POST", "/ITEMS/3"),
        ];
        assert_eq!(widest_of(&rules).map(|w| w.rules), Some(1));
        assert_eq!(
            widest(rules.iter(), matching),
            Some(Widest {
                method: Some("POST".into()),
                path: Some("/items/#".into()),
                rules: 3
            })
        );
        let mut fanout = Fanout::new(2, matching);
        fanout.try_add(&rules[0]).expect("fits");
        fanout.try_add(&rules[1]).expect("fits");
        assert!(fanout.try_add(&rules[2]).is_err());
    }

    #[test]
    fn rules_without_a_match_never_count() {
        let mut fanout = Fanout::new(1, PathMatching::default());
        fanout.try_add(&rule("a", "*", "*")).expect("fits");
        for n in 0..5 {
            fanout
                .try_add(&unmatched(&format!("u{n}")))
                .expect("counts for no request");
        }
        assert!(fanout.try_add(&rule("b", "GET", "/x")).is_err());
    }

    #[test]
    fn the_refusal_names_the_widest_request_the_new_rule_matches() {
        let mut fanout = Fanout::default();
        assert_eq!(fanout.cap(), COUNTERS_PER_REQUEST_MAX);
        for n in 0..7 {
            fanout
                .try_add(&rule(&format!("b{n}"), "*", "*"))
                .expect("fits");
        }
        fanout
            .try_add(&rule("bundle", "GET", "/repo/v1/entity/1/bundle"))
            .expect("fits");
        let refused = fanout
            .try_add(&rule("b7", "*", "*"))
            .expect_err("9 on the endpoint");
        assert_eq!(
            refused.refusal(COUNTERS_PER_REQUEST_MAX).reason,
            "a GET request on /repo/v1/entity/#/bundle would match 9 rules; one request may be decided on at most 8"
        );
        // Refused, it was not added: a rule on another endpoint still fits.
        fanout.try_add(&rule("other", "POST", "/x")).expect("fits");
        // Removing rules makes room.
        fanout.remove(&rule("bundle", "GET", "/repo/v1/entity/1/bundle"));
        let refused = fanout
            .try_add(&rule("b7", "*", "*"))
            .expect_err("9 on POST /x");
        assert_eq!(refused.to_string(), "a POST request on /x");
        fanout.remove(&rule("other", "POST", "/x"));
        fanout.try_add(&rule("b7", "*", "*")).expect("fits now");
    }

    /// A small deterministic generator: the test needs variety, not a dependency.
    struct Xorshift(u64);

    impl Xorshift {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    #[test]
    fn both_forms_agree_with_every_request_on_random_sets() {
        let methods = ["*", "*", "GET", "get", "HEAD", "POST", "PUT"];
        let paths = ["*", "*", "/a", "/b", "/c/1", "/c/#", "/d"];
        let mut random = Xorshift(0x9e37_79b9_7f4a_7c15);
        for round in 0..400 {
            let cap = 1 + random.below(6);
            let candidates: Vec<Rule> = (0..random.below(24))
                .map(|n| {
                    if random.below(10) == 0 {
                        return unmatched(&format!("u{n}"));
                    }
                    let method = methods[random.below(methods.len())];
                    let path = paths[random.below(paths.len())];
                    rule(&format!("r{n}"), method, path)
                })
                .collect();
            // The whole set, against every request.
            let all: Vec<&Rule> = candidates.iter().collect();
            let expected = by_every_request(&all);
            match widest_of(&candidates) {
                None => assert!(candidates.iter().all(|r| r.matcher().is_none())),
                Some(widest) => {
                    assert_eq!(widest.rules, expected, "round {round}");
                    let (method, path) = request_of(&widest);
                    assert_eq!(count(&all, method, path), expected, "round {round}");
                }
            }
            // Assembled one rule at a time, with some removed on the way: each rule is added
            // exactly when the set with it stays within the cap, and a refusal names a
            // request it matches with the count it would have.
            let mut fanout = Fanout::new(cap, PathMatching::default());
            let mut admitted: Vec<&Rule> = Vec::new();
            for candidate in &candidates {
                if !admitted.is_empty() && random.below(5) == 0 {
                    let gone = admitted.remove(random.below(admitted.len()));
                    fanout.remove(gone);
                }
                let mut with: Vec<&Rule> = admitted.clone();
                with.push(candidate);
                let widest_with = by_every_request(&with);
                match fanout.try_add(candidate) {
                    Ok(()) => {
                        assert!(widest_with <= cap, "round {round}: {candidate:?} fits");
                        admitted.push(candidate);
                    }
                    Err(refused) => {
                        assert!(widest_with > cap, "round {round}: {candidate:?} refused");
                        assert_eq!(refused.rules, widest_with, "round {round}");
                        let (method, path) = request_of(&refused);
                        let matcher = candidate.matcher().expect("only a match is refused");
                        assert!(matcher.matches(method, path), "round {round}: {refused:?}");
                        assert_eq!(count(&with, method, path), refused.rules, "round {round}");
                    }
                }
            }
        }
    }

    #[test]
    fn ten_thousand_rules_are_assembled_and_measured() {
        // Endpoint rules on many paths and methods, with a few on every path and method: the
        // shapes that a product of methods and paths would make slow.
        let mut rules = Vec::new();
        for n in 0..5_000 {
            rules.push(rule(&format!("get-e{n}"), "GET", &format!("/e/n{n}/x")));
            rules.push(rule(&format!("any-f{n}"), "*", &format!("/f/n{n}/y")));
        }
        for n in 0..4 {
            rules.push(rule(&format!("all-{n}"), "*", "*"));
            rules.push(rule(&format!("get-{n}"), "GET", "*"));
        }
        let widest = widest_of(&rules).expect("some rule matches");
        assert_eq!(widest.rules, 9);
        let mut fanout = Fanout::default();
        let mut refused = 0;
        for rule in &rules {
            refused += usize::from(fanout.try_add(rule).is_err());
        }
        for n in 0..1_000 {
            assert!(
                fanout
                    .try_add(&rule(&format!("more-{n}"), "GET", "*"))
                    .is_err()
            );
        }
        // The last rule on GET everywhere would let a GET on an endpoint match 9.
        assert_eq!(refused, 1);
    }
}
