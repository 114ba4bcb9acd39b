//! envoyproxy/ratelimit's configuration, read as that service reads it: one YAML document per
//! domain (`domain`, nested `descriptors` of `key`, optional `value`, `rate_limit`, and flags),
//! from a file or from every `*.yaml`/`*.yml` file of a directory. This module owns parsing,
//! validation (every refusal names the file and what is wrong), and the tree that requests are
//! matched against (`Domain::find`).
//!
//! Each limit of the tree is given a counter name that depends only on its domain and its place
//! in the tree, so that servers sharing a store share its counters.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use serde::Deserialize;
use tollgate::{Algorithm, Policy, Reserve};

/// Longest file read, in bytes.
const FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Why a configuration was refused: the file, and what is wrong in it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("envoy configuration {file}: {reason}")]
pub struct ConfigError {
    pub file: String,
    pub reason: String,
}

/// A time unit of `rate_limit`, with the length envoyproxy/ratelimit gives it: a month is 30
/// days, a year 365; windows are aligned to multiples of it counted from the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit as the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }
}

/// A limit of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub requests_per_unit: u32,
    pub unit: Option<Unit>,
    pub unlimited: bool,
    pub name: String,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    /// The counter's name in the store, from the domain and the entry's place in the tree.
    pub counter: String,
    /// Where the entry is: its domain, then each level's `key` or `key_value`, joined by `.`.
    pub path: String,
    /// What the server answered for this entry since the configuration was read.
    pub answers: Arc<Answers>,
    /// A fixed window of one unit; `None` for an unlimited entry or a limit of 0 (which refuses
    /// everything without counting).
    pub policy: Option<Policy>,
}

/// Answers given for one entry of the tree, by code: a descriptor that found it was allowed
/// (`ok`, shadow-mode entries included) or refused (`over_limit`). Counts, not configuration:
/// two specs are equal whatever they counted.
#[derive(Debug, Default)]
pub struct Answers {
    pub ok: AtomicU64,
    pub over_limit: AtomicU64,
}

impl PartialEq for Answers {
    fn eq(&self, _: &Answers) -> bool {
        true
    }
}

impl Eq for Answers {}

/// One level of the tree: its entries by `key` or `key_value`, and the wildcard entries among
/// them in the order written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    pub limit: Option<LimitSpec>,
    children: HashMap<String, Node>,
    /// `(key_value pattern, its parts split on '*')`.
    wildcards: Vec<(String, Vec<String>)>,
    /// `share_threshold`: every value this wildcard matches shares one counter.
    share_threshold: bool,
}

/// What a request's descriptor found in the tree.
#[derive(Clone, Debug)]
pub struct Found<'c> {
    pub limit: &'c LimitSpec,
    /// Per entry of the descriptor, the wildcard pattern that stands for its value in the
    /// counter's key (`share_threshold`), if any; empty (no allocation) when none does.
    pub shared: Vec<Option<&'c str>>,
}

/// Every domain of a configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    domains: HashMap<String, Node>,
}

fn wildcard_match(parts: &[String], value: &str) -> bool {
    match parts {
        [] => value.is_empty(),
        [only] => only == value,
        [first, middle @ .., last] => {
            let fixed: usize = parts.iter().map(String::len).sum();
            if value.len() < fixed
                || !value.starts_with(first.as_str())
                || !value.ends_with(last.as_str())
            {
                return false;
            }
            let mut rest = &value[first.len()..value.len() - last.len()];
            for part in middle {
                match rest.find(part.as_str()) {
                    Some(at) => rest = &rest[at + part.len()..],
                    None => return false,
                }
            }
            true
        }
    }
}

impl Config {
    pub fn domain(&self, name: &str) -> Option<&Node> {
        self.domains.get(name)
    }

    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Every counted limit of the tree: its counter's name and its policy (for a store that
    /// must carry them across a restart).
    pub fn counters(&self) -> Vec<(String, Policy)> {
        fn walk(node: &Node, into: &mut Vec<(String, Policy)>) {
            if let Some(LimitSpec {
                counter,
                policy: Some(policy),
                ..
            }) = &node.limit
            {
                into.push((counter.clone(), *policy));
            }
            for child in node.children.values() {
                walk(child, into);
            }
        }
        let mut counters = Vec::new();
        for domain in self.domains.values() {
            walk(domain, &mut counters);
        }
        counters
    }

    /// Every entry of the tree that has a limit (unlimited and zero ones included), by domain
    /// and place.
    pub fn limits(&self) -> Vec<&LimitSpec> {
        fn walk<'c>(node: &'c Node, into: &mut Vec<&'c LimitSpec>) {
            if let Some(limit) = &node.limit {
                into.push(limit);
            }
            for child in node.children.values() {
                walk(child, into);
            }
        }
        let mut limits = Vec::new();
        for domain in self.domains.values() {
            walk(domain, &mut limits);
        }
        limits.sort_by(|a, b| a.path.cmp(&b.path));
        limits
    }

    /// The limit a descriptor's entries find, as envoyproxy/ratelimit finds it: at each level
    /// the entry `key_value`, else the first wildcard entry that matches, else the entry `key`
    /// alone; a limit applies only at the level of the descriptor's last entry, and a request
    /// deeper than the tree finds none.
    pub fn find<'c>(&'c self, domain: &str, entries: &[(&str, &str)]) -> Option<Found<'c>> {
        let mut node = self.domains.get(domain)?;
        let mut shared = Vec::new();
        for (index, (key, value)) in entries.iter().enumerate() {
            let full = format!("{key}_{value}");
            let mut next = node.children.get(&full);
            if next.is_none() {
                for (pattern, parts) in &node.wildcards {
                    if wildcard_match(parts, &full) {
                        next = node.children.get(pattern);
                        if next.is_some_and(|child| child.share_threshold) {
                            shared.resize(entries.len(), None);
                            shared[index] = pattern.strip_prefix(&format!("{key}_"));
                        }
                        break;
                    }
                }
            }
            let next = match next {
                Some(next) => next,
                None => node.children.get(*key)?,
            };
            if index + 1 == entries.len() {
                return next.limit.as_ref().map(|limit| Found { limit, shared });
            }
            if next.children.is_empty() {
                return None;
            }
            node = next;
        }
        None
    }

    /// Read a file, or every `*.yaml`/`*.yml` file of a directory (others are ignored), one
    /// domain each.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let refuse = |file: &Path, reason: String| ConfigError {
            file: file.display().to_string(),
            reason,
        };
        let metadata = std::fs::metadata(path).map_err(|error| refuse(path, error.to_string()))?;
        let files: Vec<PathBuf> = if metadata.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|error| refuse(path, error.to_string()))?
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|file| {
                    matches!(
                        file.extension().and_then(|extension| extension.to_str()),
                        Some("yaml" | "yml")
                    )
                })
                .collect();
            files.sort();
            files
        } else {
            vec![path.to_owned()]
        };
        let mut texts = Vec::with_capacity(files.len());
        for file in files {
            let length = std::fs::metadata(&file)
                .map_err(|error| refuse(&file, error.to_string()))?
                .len();
            if length > FILE_BYTES_MAX {
                return Err(refuse(
                    &file,
                    format!("is larger than {FILE_BYTES_MAX} bytes"),
                ));
            }
            let text =
                std::fs::read_to_string(&file).map_err(|error| refuse(&file, error.to_string()))?;
            texts.push((file.display().to_string(), text));
        }
        Config::parse(
            texts
                .iter()
                .map(|(name, text)| (name.as_str(), text.as_str())),
        )
    }

    /// Parse documents given as `(file name, text)`.
    pub fn parse<'t>(
        files: impl IntoIterator<Item = (&'t str, &'t str)>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for (file, text) in files {
            let refuse = |reason: String| ConfigError {
                file: file.to_owned(),
                reason,
            };
            let root: YamlRoot =
                yaml_serde::from_str(text).map_err(|error| refuse(error.to_string()))?;
            if root.domain.is_empty() {
                return Err(refuse("the domain is empty".to_owned()));
            }
            if config.domains.contains_key(&root.domain) {
                return Err(refuse(format!(
                    "domain {:?} is configured twice (in another file too)",
                    root.domain
                )));
            }
            let mut domain = Node::default();
            let root_level = Level {
                domain: &root.domain,
                path: &root.domain,
                place: &root.domain,
            };
            load_level(&mut domain, &root_level, &root.descriptors).map_err(refuse)?;
            config.domains.insert(root.domain, domain);
        }
        Ok(config)
    }
}

/// Where a level of the tree is: its domain, its path in messages, and its place, the path with
/// each entry's `.` and `\` escaped, which names its counters.
struct Level<'a> {
    domain: &'a str,
    path: &'a str,
    place: &'a str,
}

fn load_level(
    node: &mut Node,
    level: &Level<'_>,
    descriptors: &[YamlDescriptor],
) -> Result<(), String> {
    let parent = level.path;
    for descriptor in descriptors {
        if descriptor.key.is_empty() {
            return Err(format!("{parent}: a descriptor has an empty key"));
        }
        let full = match &descriptor.value {
            Some(value) if !value.is_empty() => format!("{}_{value}", descriptor.key),
            _ => descriptor.key.clone(),
        };
        let path = format!("{parent}.{full}");
        // Escaped, so that the entry `a.b` and the entries `a`, `b` below it are two places (and
        // two counters); an entry without `.` or `\` is its own escape, so names stay as they were.
        let place = format!(
            "{}.{}",
            level.place,
            full.replace('\\', "\\\\").replace('.', "\\.")
        );
        if node.children.contains_key(&full) {
            return Err(format!("{path}: the descriptor is configured twice"));
        }
        let wildcard = full.contains('*');
        if descriptor.share_threshold && !wildcard {
            return Err(format!(
                "{path}: share_threshold needs a value with a wildcard '*'"
            ));
        }
        let limit = match &descriptor.rate_limit {
            None => None,
            Some(rate) => Some(limit_spec(
                rate,
                descriptor.shadow_mode,
                level.domain,
                &path,
                &place,
            )?),
        };
        let mut child = Node {
            limit,
            share_threshold: descriptor.share_threshold,
            ..Node::default()
        };
        let below = Level {
            domain: level.domain,
            path: &path,
            place: &place,
        };
        load_level(&mut child, &below, &descriptor.descriptors)?;
        if wildcard {
            let parts = full.split('*').map(str::to_owned).collect();
            node.wildcards.push((full.clone(), parts));
        }
        node.children.insert(full, child);
    }
    Ok(())
}

fn limit_spec(
    rate: &YamlRateLimit,
    shadow_mode: bool,
    domain: &str,
    path: &str,
    place: &str,
) -> Result<LimitSpec, String> {
    let unit = match rate.unit.as_deref() {
        None | Some("") => None,
        Some(text) => Some(Unit::parse(text).ok_or_else(|| {
            format!("{path}: rate_limit.unit {text:?} is not a unit (second, minute, hour, day, week, month or year)")
        })?),
    };
    if rate.unlimited && unit.is_some() {
        return Err(format!(
            "{path}: rate_limit is unlimited, so it takes no unit"
        ));
    }
    if !rate.unlimited && unit.is_none() {
        return Err(format!("{path}: rate_limit.unit is required"));
    }
    let name = rate.name.clone().unwrap_or_default();
    let mut replaces = Vec::with_capacity(rate.replaces.len());
    for replaced in &rate.replaces {
        if replaced.name.is_empty() {
            return Err(format!(
                "{path}: rate_limit.replaces has an entry with no name"
            ));
        }
        if replaced.name == name {
            return Err(format!(
                "{path}: rate_limit.replaces names this limit itself ({name:?})"
            ));
        }
        replaces.push(replaced.name.clone());
    }
    let policy = match unit {
        Some(unit) if rate.requests_per_unit > 0 => Some(
            Policy::rate(
                u64::from(rate.requests_per_unit),
                unit.seconds() * 1_000_000,
                0,
                Algorithm::Fixed,
                Reserve::default(),
            )
            .map_err(|error| format!("{path}: rate_limit: {error}"))?,
        ),
        _ => None,
    };
    Ok(LimitSpec {
        requests_per_unit: rate.requests_per_unit,
        unit,
        unlimited: rate.unlimited,
        name,
        replaces,
        shadow_mode,
        counter: counter_name(domain, place),
        path: path.to_owned(),
        answers: Arc::default(),
        policy,
    })
}

/// `envoy.` and 16 hex digits of a 64-bit FNV-1a hash of the entry's place in the tree: a limit
/// name the store accepts whatever the domain and keys hold, and the same on every server and
/// every build (the standard library's hasher promises neither).
fn counter_name(domain: &str, place: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in domain.bytes().chain([0]).chain(place.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("envoy.{hash:016x}")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRoot {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<YamlDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlDescriptor {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    descriptors: Vec<YamlDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    /// Accepted as envoyproxy/ratelimit accepts them; they shape its statistics, which
    /// Tollgate keeps its own way.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    #[allow(dead_code)]
    quota_mode: bool,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<yaml_serde::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRateLimit {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<YamlReplaces>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlReplaces {
    #[serde(default)]
    name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(yaml: &str) -> Vec<String> {
        let config = Config::parse([("api.yaml", yaml)]).expect("valid configuration");
        let mut names: Vec<String> = config
            .counters()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_entry_with_a_dot_and_entries_one_below_another_are_two_counters() {
        let yaml = "
domain: d
descriptors:
  - key: a.b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: a
    value: b.c
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: a_b
    descriptors:
      - key: c
        rate_limit: {unit: day, requests_per_unit: 4}
";
        let names = names(yaml);
        assert_eq!(names.len(), 4);
        assert!(names.windows(2).all(|pair| pair[0] != pair[1]), "{names:?}");
    }

    #[test]
    fn names_without_dots_in_entries_are_as_before() {
        let yaml = "
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
";
        assert_eq!(names(yaml), ["envoy.748c81f746044ec2"]);
    }
}
