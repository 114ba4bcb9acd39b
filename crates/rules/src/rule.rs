//! Rules: a limit plus an optional request `match`, validated in two stages. `RawRule` is the
//! input as written (an HTTP body or an SQL row), with every field optional and numbers signed,
//! so that nothing is refused by the parser with a vague message; `Validate::validate` turns it
//! into a `Rule` or an error that names the field and the reason.

use std::borrow::Cow;

use tollgate::{Algorithm, Limit, Policy, Reserve, check_key, check_limit_name};

use crate::path::Match;
pub use tollgate_api::{RawMatch, RawReserve, RawRule};

/// Why a rule was refused: the field (as named in JSON, dotted for nested fields) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct RuleError {
    pub field: Cow<'static, str>,
    pub reason: String,
}

/// The field a serde error is about, dotted from the document's root: serde names an unknown,
/// missing or repeated field in back-quotes, and `serde_path_to_error`'s `path` ends at an
/// unknown field but at the parent of a missing or repeated one. `whole` names the document
/// when no field is at fault.
pub fn serde_field(path: &str, message: &str, whole: &str) -> String {
    let named = ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name)
        // A field named by the empty string cannot be pointed at: its object is at fault.
        .filter(|name| !name.is_empty());
    let path = match named {
        Some(_) => path,
        None => path.trim_end_matches('.'),
    };
    match (named, path) {
        // A key written empty (`"": 1`) has no name to show: its parent is named instead.
        (Some(""), path) => match path.strip_suffix('.').unwrap_or(path) {
            "" | "." => whole.to_owned(),
            parent => parent.to_owned(),
        },
        (Some(name), "." | "") => name.to_owned(),
        (Some(name), path) if path == name || path.ends_with(&format!(".{name}")) => {
            path.to_owned()
        }
        (Some(name), parent) => format!("{parent}.{name}"),
        (None, "." | "") => whole.to_owned(),
        (None, path) => path.to_owned(),
    }
}

/// The wire's name of a field the core names in its own unit: the core takes microseconds, the
/// wire milliseconds.
fn wire_field(core_field: &'static str) -> &'static str {
    match core_field {
        "period_us" => "period_ms",
        "margin_us" => "margin_ms",
        "lease_ttl_us" => "lease_ttl_ms",
        other => other,
    }
}

/// The algorithms' names as a refusal lists them: `"sliding", "fixed" or "gcra"`.
fn algorithm_names() -> String {
    let names: Vec<String> = Algorithm::EACH
        .iter()
        .map(|algorithm| format!("{:?}", algorithm.name()))
        .collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

fn refuse(field: &'static str, reason: impl Into<String>) -> RuleError {
    RuleError {
        field: Cow::Borrowed(field),
        reason: reason.into(),
    }
}

/// A validated rule: the limit the engine enforces, its `match`, and its canonical form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    limit: Limit,
    matcher: Option<Match>,
    canonical: RawRule,
}

impl Rule {
    pub fn name(&self) -> &str {
        self.limit.name()
    }

    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    pub fn matcher(&self) -> Option<&Match> {
        self.matcher.as_ref()
    }

    /// The rule as stored and shown: the name, defaults filled in, the path normalized.
    pub fn canonical(&self) -> &RawRule {
        &self.canonical
    }
}

const MICROS_PER_MS: i64 = 1_000;

fn required(field: &'static str, value: Option<i64>) -> Result<i64, RuleError> {
    value.ok_or_else(|| refuse(field, "is required"))
}

fn positive(field: &'static str, value: i64) -> Result<u64, RuleError> {
    if value < 1 {
        return Err(refuse(field, format!("must be at least 1, got {value}")));
    }
    Ok(value.unsigned_abs())
}

fn not_negative(field: &'static str, value: i64) -> Result<u64, RuleError> {
    if value < 0 {
        return Err(refuse(field, format!("must not be negative, got {value}")));
    }
    Ok(value.unsigned_abs())
}

fn ms_to_us(field: &'static str, ms: u64) -> Result<u64, RuleError> {
    ms.checked_mul(MICROS_PER_MS.unsigned_abs())
        .ok_or_else(|| refuse(field, "is too large"))
}

fn absent<T>(field: &'static str, value: &Option<T>, why: &str) -> Result<(), RuleError> {
    match value {
        Some(_) => Err(refuse(field, why.to_owned())),
        None => Ok(()),
    }
}

/// The second stage of reading a rule: check every field of what was written and build the
/// rule named `name`.
pub trait Validate {
    fn validate(&self, name: &str) -> Result<Rule, RuleError>;
}

impl Validate for RawRule {
    fn validate(&self, name: &str) -> Result<Rule, RuleError> {
        check_limit_name(name).map_err(|reason| refuse("name", reason))?;
        if let Some(given) = self.name.as_ref().filter(|given| *given != name) {
            return Err(refuse(
                "name",
                format!("{given:?} differs from the name in the path, {name:?}"),
            ));
        }
        let kind = self
            .kind
            .as_deref()
            .ok_or_else(|| refuse("kind", "is required: \"rate\" or \"concurrency\""))?;
        let reserve = reserve(self)?;
        let limit = positive("limit", required("limit", self.limit)?)?;
        let mut canonical = RawRule {
            name: Some(name.to_owned()),
            kind: Some(kind.to_owned()),
            limit: self.limit,
            reserve: (reserve != Reserve::default()).then(|| RawReserve {
                high: (reserve.high > 0).then_some(reserve.high as i64),
                normal: (reserve.normal > 0).then_some(reserve.normal as i64),
            }),
            per: self.per.clone(),
            ..RawRule::default()
        };
        let policy = match kind {
            "rate" => {
                absent(
                    "lease_ttl_ms",
                    &self.lease_ttl_ms,
                    "applies only to concurrency limits",
                )?;
                let period_ms = positive("period_ms", required("period_ms", self.period_ms)?)?;
                let margin_ms = not_negative("margin_ms", self.margin_ms.unwrap_or(0))?;
                let name = self.algorithm.as_deref().unwrap_or("sliding");
                let algorithm = match Algorithm::named(name, 0) {
                    Some(Algorithm::Gcra { .. }) => Algorithm::Gcra {
                        burst: positive("burst", self.burst.unwrap_or(limit as i64))?,
                    },
                    Some(other) => {
                        absent("burst", &self.burst, "applies only to the gcra algorithm")?;
                        other
                    }
                    None => {
                        return Err(refuse(
                            "algorithm",
                            format!("must be {}, got {name:?}", algorithm_names()),
                        ));
                    }
                };
                canonical.period_ms = self.period_ms;
                canonical.algorithm = Some(algorithm.name().to_owned());
                canonical.margin_ms = (margin_ms > 0).then_some(margin_ms as i64);
                if let Algorithm::Gcra { burst } = algorithm {
                    canonical.burst = Some(burst as i64);
                }
                Policy::rate(
                    limit,
                    ms_to_us("period_ms", period_ms)?,
                    ms_to_us("margin_ms", margin_ms)?,
                    algorithm,
                    reserve,
                )
            }
            "concurrency" => {
                let why = "applies only to rate limits";
                absent("period_ms", &self.period_ms, why)?;
                absent("algorithm", &self.algorithm, why)?;
                absent("burst", &self.burst, why)?;
                absent("margin_ms", &self.margin_ms, why)?;
                let ttl_ms =
                    positive("lease_ttl_ms", required("lease_ttl_ms", self.lease_ttl_ms)?)?;
                canonical.lease_ttl_ms = self.lease_ttl_ms;
                Policy::concurrency(limit, ms_to_us("lease_ttl_ms", ttl_ms)?, reserve)
            }
            other => {
                return Err(refuse(
                    "kind",
                    format!("must be \"rate\" or \"concurrency\", got {other:?}"),
                ));
            }
        }
        .map_err(|error| refuse(wire_field(error.field), error.reason))?;
        if let Some(per) = &self.per {
            check_key(per).map_err(|reason| refuse("per", reason))?;
        }
        let keys_max = match self.keys_max {
            Some(_) if self.per.is_none() => {
                return Err(refuse(
                    "keys_max",
                    "applies only to limits counted per key (give `per`)",
                ));
            }
            Some(keys_max) => Some(positive("keys_max", keys_max)?),
            None => None,
        };
        canonical.keys_max = self.keys_max;
        let matcher = match &self.matcher {
            None => None,
            Some(raw) => {
                let method = raw
                    .method
                    .as_deref()
                    .ok_or_else(|| refuse("match.method", "is required (\"*\" for any)"))?;
                let path = raw
                    .path
                    .as_deref()
                    .ok_or_else(|| refuse("match.path", "is required (\"*\" for any)"))?;
                let matcher =
                    Match::new(method, path).map_err(|(field, reason)| refuse(field, reason))?;
                canonical.matcher = Some(RawMatch {
                    method: Some(matcher.method().to_owned()),
                    path: Some(matcher.path().to_owned()),
                });
                Some(matcher)
            }
        };
        let limit = Limit::new(name, policy, self.per.as_deref())
            .and_then(|limit| limit.with_keys_max(keys_max))
            .map_err(|error| refuse("name", error.to_string()))?;
        Ok(Rule {
            limit,
            matcher,
            canonical,
        })
    }
}

fn reserve(rule: &RawRule) -> Result<Reserve, RuleError> {
    {
        let Some(raw) = &rule.reserve else {
            return Ok(Reserve::default());
        };
        Ok(Reserve {
            high: not_negative("reserve.high", raw.high.unwrap_or(0))?,
            normal: not_negative("reserve.normal", raw.normal.unwrap_or(0))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> RawRule {
        serde_json::from_str(json).expect("parses")
    }

    fn field_of(json: &str) -> String {
        parse(json)
            .validate("vendor-x")
            .expect_err("invalid")
            .field
            .into_owned()
    }

    #[test]
    fn reserve_and_match_are_objects_not_arrays() {
        for json in [
            r#"{"kind":"rate","limit":5,"period_ms":1000,"reserve":[1,0]}"#,
            r#"{"kind":"rate","limit":5,"period_ms":1000,"match":["GET","/a"]}"#,
        ] {
            let error = serde_json::from_str::<RawRule>(json).expect_err(json);
            assert!(
                error.to_string().contains("expected an object or null"),
                "{error}"
            );
        }
        let rule = parse(r#"{"kind":"rate","limit":5,"period_ms":1000,"reserve":null}"#);
        assert_eq!(rule.reserve, None);
        let rule = parse(r#"{"kind":"rate","limit":5,"period_ms":1000,"reserve":{"high":1}}"#);
        assert_eq!(rule.reserve.and_then(|reserve| reserve.high), Some(1));
        // A field inside is still named by its path.
        let json = r#"{"kind":"rate","limit":5,"period_ms":1000,"reserve":{"high":"x"}}"#;
        let mut deserializer = serde_json::Deserializer::from_str(json);
        let error = serde_path_to_error::deserialize::<_, RawRule>(&mut deserializer)
            .expect_err("a string for a number");
        assert_eq!(error.path().to_string(), "reserve.high");
    }

    #[test]
    fn a_rate_rule_gets_its_defaults_filled_in() {
        let rule = parse(r#"{"kind":"rate","limit":10,"period_ms":1000,"reserve":{"high":2}}"#)
            .validate("vendor-x")
            .expect("valid");
        assert_eq!(rule.name(), "vendor-x");
        let canonical = rule.canonical();
        assert_eq!(canonical.algorithm.as_deref(), Some("sliding"));
        assert_eq!(canonical.reserve.as_ref().and_then(|r| r.high), Some(2));
        assert_eq!(rule.limit().policy().capacity(), 10);
    }

    #[test]
    fn a_throttle_table_row_is_a_fixed_rule_per_user_with_a_match() {
        let rule = parse(
            r#"{"kind":"rate","limit":3,"period_ms":60000,"algorithm":"fixed","per":"user",
                "match":{"method":"get","path":"/entity/123/bundle"}}"#,
        )
        .validate("entity-bundle")
        .expect("valid");
        let matcher = rule.matcher().expect("has a match");
        assert!(matcher.matches("GET", "/entity/#/bundle"));
        assert_eq!(
            rule.canonical()
                .matcher
                .as_ref()
                .and_then(|m| m.path.as_deref()),
            Some("/entity/#/bundle")
        );
        assert_eq!(rule.limit().per(), Some("user"));
    }

    #[test]
    fn gcra_bursts_default_to_the_limit() {
        let rule = parse(r#"{"kind":"rate","limit":5,"period_ms":1000,"algorithm":"gcra"}"#)
            .validate("g")
            .expect("valid");
        assert_eq!(rule.canonical().burst, Some(5));
    }

    #[test]
    fn every_refusal_names_its_field() {
        let cases = [
            (r#"{"limit":1,"period_ms":1}"#, "kind"),
            (r#"{"kind":"leaky","limit":1,"period_ms":1}"#, "kind"),
            (r#"{"kind":"rate","period_ms":1000}"#, "limit"),
            (r#"{"kind":"rate","limit":0,"period_ms":1000}"#, "limit"),
            (r#"{"kind":"rate","limit":-3,"period_ms":1000}"#, "limit"),
            (r#"{"kind":"rate","limit":1}"#, "period_ms"),
            (r#"{"kind":"rate","limit":1,"period_ms":0}"#, "period_ms"),
            (
                r#"{"kind":"rate","limit":1,"period_ms":-1000}"#,
                "period_ms",
            ),
            (
                r#"{"kind":"rate","limit":1,"period_ms":9223372036854775807}"#,
                "period_ms",
            ),
            (
                r#"{"kind":"rate","limit":1,"period_ms":1000,"margin_ms":-1}"#,
                "margin_ms",
            ),
            (
                r#"{"kind":"rate","limit":1,"period_ms":1000,"algorithm":"x"}"#,
                "algorithm",
            ),
            (
                r#"{"kind":"rate","limit":1,"period_ms":1000,"burst":3}"#,
                "burst",
            ),
            (
                r#"{"kind":"rate","limit":1,"period_ms":1000,"algorithm":"gcra","burst":0}"#,
                "burst",
            ),
            (
                r#"{"kind":"rate","limit":1,"period_ms":1000,"lease_ttl_ms":10}"#,
                "lease_ttl_ms",
            ),
            (
                r#"{"kind":"rate","limit":2,"period_ms":1000,"reserve":{"high":2}}"#,
                "reserve",
            ),
            (
                r#"{"kind":"rate","limit":2,"period_ms":1000,"reserve":{"high":-1}}"#,
                "reserve.high",
            ),
            (
                r#"{"kind":"rate","limit":2,"period_ms":1000,"per":""}"#,
                "per",
            ),
            (
                r#"{"kind":"rate","limit":2,"period_ms":1000,"match":{"path":"/"}}"#,
                "match.method",
            ),
            (
                r#"{"kind":"rate","limit":2,"period_ms":1000,"match":{"method":"GET","path":"x"}}"#,
                "match.path",
            ),
            (r#"{"kind":"concurrency","limit":2}"#, "lease_ttl_ms"),
            (
                r#"{"kind":"rate","limit":2,"period_ms":1000,"keys_max":10}"#,
                "keys_max",
            ),
            (
                r#"{"kind":"rate","limit":2,"period_ms":1000,"per":"user","keys_max":0}"#,
                "keys_max",
            ),
            (
                r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":0}"#,
                "lease_ttl_ms",
            ),
            (
                r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":10,"period_ms":5}"#,
                "period_ms",
            ),
            (
                r#"{"name":"other","kind":"concurrency","limit":2,"lease_ttl_ms":10}"#,
                "name",
            ),
            // Refused by the core, which names them in its microseconds: named as the wire does.
            (
                r#"{"kind":"rate","limit":2,"period_ms":31622400001}"#,
                "period_ms",
            ),
            (
                r#"{"kind":"rate","limit":2,"period_ms":1000,"margin_ms":31622400001}"#,
                "margin_ms",
            ),
            (
                r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":31622400001}"#,
                "lease_ttl_ms",
            ),
        ];
        for (json, field) in cases {
            assert_eq!(field_of(json), field, "{json}");
        }
        let bad_name = parse(r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":10}"#)
            .validate("Vendor X")
            .expect_err("bad name");
        assert_eq!(bad_name.field, "name");
    }

    #[test]
    fn an_empty_key_is_named_by_its_parent() {
        let field = |json: &str| {
            let mut deserializer = serde_json::Deserializer::from_str(json);
            let error = serde_path_to_error::deserialize::<_, RawRule>(&mut deserializer)
                .expect_err("refused");
            serde_field(
                &error.path().to_string(),
                &error.inner().to_string(),
                "body",
            )
        };
        assert_eq!(field(r#"{"": 1}"#), "body");
        assert_eq!(field(r#"{"kind": "rate", "reserve": {"": 1}}"#), "reserve");
        assert_eq!(field(r#"{"match": {"method": "GET", "": 1}}"#), "match");
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let error = serde_json::from_str::<RawRule>(r#"{"kind":"rate","limt":1}"#)
            .expect_err("unknown field");
        assert!(error.to_string().contains("limt"), "{error}");
    }
}
