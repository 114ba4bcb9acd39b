//! The data plane's bodies: acquire, commit, renew, pause and check, their answers and their
//! refusals.

use serde::{Deserialize, Serialize};
use tollgate::LimitStatus;

use crate::{ErrorDetail, Reason, ms_ceil};

/// `POST /v1/acquire`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(example = json!({"limits": ["vendor-x"], "cost": 1, "priority": "normal", "wait_ms": 0})))]
pub struct AcquireBody {
    /// The limits to take from, all or none, each named once.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::schema::LimitName>, min_items = 1, max_items = 8))]
    pub limits: Vec<String>,
    /// The key, for limits counted `per` key (required when one is).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::Key>))]
    pub key: Option<String>,
    /// Units to take (default 1).
    #[serde(default, deserialize_with = "crate::number::optional")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1_000_000_000))]
    pub cost: Option<u64>,
    /// Units to take of some limits by name, where they differ from `cost`: a language model's
    /// input and output tokens beside its one request, granted all or none in one decision.
    /// Every name must be among `limits`; a limit not named takes `cost`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::number::optional_map"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::CostsSchema>))]
    pub costs: Option<std::collections::BTreeMap<String, u64>>,
    /// `high`, `normal` (default) or `low`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::PriorityName>))]
    pub priority: Option<String>,
    /// How long to wait for room, in milliseconds (default 0: answer now); capped by the
    /// server's `wait_ms_max`; at most 2^53 (longer than any wait, and what every client's
    /// numbers hold exactly).
    #[serde(default, deserialize_with = "crate::number::optional")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)
    )]
    pub wait_ms: Option<u64>,
    /// Whether a commit may give unused rate units back (default `true`). `false` is a plain
    /// "may I go now": the store records no reservation, so the decision is cheaper; the units
    /// count the same, a commit refunds nothing, and leases are leases as always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refundable: Option<bool>,
}

/// One limit's state after a decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitView {
    pub name: String,
    /// Units still open to the request's priority.
    pub remaining: u64,
    /// Milliseconds until everything counted now stops counting.
    pub reset_ms: u64,
    /// Leases: the fencing token; it only grows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// Leases: milliseconds until the lease expires unless renewed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

/// A grant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Granted {
    /// Opaque id, to commit (and renew, for leases).
    pub permit: String,
    pub limits: Vec<LimitView>,
}

/// 429: not granted within the wait.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RateLimited {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::rate_limited_detail))]
    pub error: ErrorDetail,
    /// When to try again, in milliseconds; also in `Retry-After` (seconds, rounded up).
    pub retry_after_ms: u64,
    pub reason: Reason,
    pub limits: Vec<LimitView>,
}

/// 429 from `/v1/check`: a denial, and what was matched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckDenied {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::rate_limited_detail))]
    pub error: ErrorDetail,
    /// When to try again, in milliseconds; also in `Retry-After` (seconds, rounded up).
    pub retry_after_ms: u64,
    pub reason: Reason,
    pub limits: Vec<LimitView>,
    /// Always false.
    pub allowed: bool,
    /// The normalized path that was matched.
    pub path: String,
    /// The limits whose `match` matched, by name.
    pub matched: Vec<String>,
}

/// `POST /v1/permits/{permit}/commit`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CommitBody {
    /// Units used, 0 to the permit's cost; the rest are refunded. Leases are released.
    /// Required: a commit that forgot it must not refund everything. A number counts for every
    /// rate limit of the permit; an object gives each rate limit's own by name (a permit
    /// granted with `costs`), and must name every rate limit of the permit and nothing else.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::UsedSchema, required = true))]
    pub used: Option<Used>,
    /// Milliseconds from the grant to the request leaving for the vendor (0 to 3,600,000):
    /// the caller's time from sending its acquire to sending the vendor's request, less the
    /// time the server held the acquire (its answer's `Server-Timing: acquire;dur=MS`), so
    /// that the answer's own way back is counted. The server widens each rate limit's margin to cover the
    /// most it has seen lately, so that arrivals at the vendor keep the limit on its clock
    /// (docs/outbound.md, *The vendor's clock*).
    #[serde(default, deserialize_with = "crate::number::optional")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 3_600_000))]
    pub sent_after_ms: Option<u64>,
}

/// What a commit says was used: one number for every rate limit, or one per limit by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Used {
    All(u64),
    Each(std::collections::BTreeMap<String, u64>),
}

impl Serialize for Used {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Used::All(units) => serializer.serialize_u64(*units),
            Used::Each(each) => each.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Used {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Used, D::Error> {
        crate::number::units_or_map(deserializer)
    }
}

/// `POST /v1/charge`: units spent beyond any grant, counted even past the limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(example = json!({"limits": ["model-output"], "cost": 420})))]
pub struct ChargeBody {
    /// The rate limits to charge, each named once.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::schema::LimitName>, min_items = 1, max_items = 8))]
    pub limits: Vec<String>,
    /// The key, for limits counted `per` key (required when one is).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::Key>))]
    pub key: Option<String>,
    /// Units to charge each limit (default 1).
    #[serde(default, deserialize_with = "crate::number::optional")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1_000_000_000))]
    pub cost: Option<u64>,
    /// Units to charge some limits by name, where they differ from `cost`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::number::optional_map"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::CostsSchema>))]
    pub costs: Option<std::collections::BTreeMap<String, u64>>,
}

/// One limit after a charge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChargedView {
    pub name: String,
    /// Units counted: the charge, less what would have put the limit more than one capacity
    /// past itself.
    pub charged: u64,
    /// Units counted now, the charge among them; past the limit, later grants wait.
    pub used: u64,
    /// Milliseconds until everything counted now stops counting.
    pub reset_ms: u64,
}

/// What a charge counted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChargeAnswer {
    pub limits: Vec<ChargedView>,
}

/// The longest wait a request may name, in milliseconds (`wait_ms`, a token's `wait_max_ms`):
/// 2^53, longer than any wait, and what every client's numbers hold exactly.
pub const WAIT_MS_MAX: u64 = 1 << 53;

/// The longest `sent_after_ms` a commit may report: an hour.
pub const SENT_AFTER_MS_MAX: u64 = 3_600_000;

/// What a commit gave back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommitAnswer {
    /// Rate units refunded.
    pub refunded: u64,
    /// Leases released.
    pub released: u64,
}

/// `POST /v1/permits/{permit}/renew` takes an empty body or `{}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenewBody {}

/// A renewed lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RenewAnswer {
    /// Milliseconds until the earliest lease of the permit expires unless renewed again.
    pub expires_ms: u64,
}

/// `POST /v1/pause`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(example = json!({"limit": "vendor-x", "retry_after_ms": 15000})))]
pub struct PauseBody {
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::LimitName))]
    pub limit: String,
    /// For a limit counted per key: pause that key only (without it, every key).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::Key>))]
    pub key: Option<String>,
    /// How long to grant nothing, in milliseconds; longer than the server's `pause_ms_max`
    /// (an hour by default) is cut to it. Pauses only extend; an administrator lifts one with
    /// `DELETE /v1/limits/{name}/pause`.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    #[serde(deserialize_with = "crate::number::integer")]
    pub retry_after_ms: u64,
}

/// `POST /v1/learn`: what a vendor's answer said of a limit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(example = json!({"limit": "vendor-x", "source": "x-ratelimit-limit from api.vendor.example", "quotas": [{"quota": 10, "window_ms": 1000}], "remaining": 3, "reset_ms": 400})))]
pub struct LearnBody {
    /// A rate limit not counted per key.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::LimitName))]
    pub limit: String,
    /// Where it was read (a header's name, a host): printable ASCII, 1 to 128 bytes, shown
    /// beside what was learned.
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 128, pattern = "^[ -~]+$")
    )]
    pub source: String,
    /// The quotas the vendor advertised (at most 8): the limit in force becomes the least of
    /// them, converted to the limit's period, between the floor and the configured limit.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_items = 8))]
    pub quotas: Vec<QuotaBody>,
    /// Calls the vendor says are left in its window.
    #[serde(default, deserialize_with = "crate::number::optional")]
    pub remaining: Option<u64>,
    /// Milliseconds until the vendor's window gives calls back; with `remaining` 0, the limit
    /// is paused this long for every caller (cut to the server's `pause_ms_max`).
    #[serde(default, deserialize_with = "crate::number::optional")]
    pub reset_ms: Option<u64>,
    /// The vendor answered "rate limited" and advertised no quota: the limit in force is
    /// halved (once for a burst of such answers) and climbs back by itself.
    #[serde(default)]
    pub rate_limited: bool,
}

/// One quota a vendor advertised.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    #[serde(deserialize_with = "crate::number::integer")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub quota: u64,
    /// The window the vendor counts the quota in, in milliseconds; absent: the limit's period.
    #[serde(default, deserialize_with = "crate::number::optional")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 31_622_400_000_u64))]
    pub window_ms: Option<u64>,
}

/// A rate limit's learned state: the limit in force beside the configured one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LearnedView {
    pub configured: u64,
    /// The limit in force.
    pub effective: u64,
    /// A limit learned and in force, if any.
    pub learned: Option<LearnedLimitView>,
    /// The most grant-to-send delay callers reported in the last minute or two (`sent_after_ms`).
    pub delay_ms: u64,
    /// The margin learned from it (added to the configured margin when larger).
    pub margin_ms: u64,
}

/// A learned limit in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LearnedLimitView {
    pub limit: u64,
    /// `advertised` (a vendor's quota, until it expires) or `rate_limited` (halved by
    /// rate-limit answers, climbing back a step at a time).
    pub kind: String,
    pub source: String,
    /// Milliseconds until this value ends: an advertised limit expires, a lowered one takes
    /// its next step back up.
    pub expires_in_ms: u64,
}

impl From<tollgate::Learned> for LearnedView {
    fn from(learned: tollgate::Learned) -> LearnedView {
        LearnedView {
            configured: learned.configured,
            effective: learned.effective,
            learned: learned.learned.map(|limit| LearnedLimitView {
                limit: limit.limit,
                kind: limit.kind.as_str().to_owned(),
                source: limit.source,
                expires_in_ms: ms_ceil(limit.changes_in),
            }),
            delay_ms: ms_ceil(learned.delay),
            margin_ms: ms_ceil(learned.margin),
        }
    }
}

/// What a lesson left in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LearnAnswer {
    pub limit: String,
    pub configured: u64,
    /// The limit in force after the lesson.
    pub effective: u64,
    pub learned: Option<LearnedLimitView>,
    pub delay_ms: u64,
    pub margin_ms: u64,
    /// Milliseconds the limit is paused for every caller after this lesson (0: none): the
    /// vendor said `remaining` 0.
    pub paused_ms: u64,
}

impl LearnAnswer {
    pub fn new(limit: String, view: LearnedView, paused_ms: u64) -> LearnAnswer {
        LearnAnswer {
            limit,
            configured: view.configured,
            effective: view.effective,
            learned: view.learned,
            delay_ms: view.delay_ms,
            margin_ms: view.margin_ms,
            paused_ms,
        }
    }
}

/// A pause in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PauseAnswer {
    pub limit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Milliseconds until the pause ends (longer than asked if an earlier pause runs longer,
    /// shorter if the ask was cut to the server's `pause_ms_max`).
    pub paused_ms: u64,
}

/// `POST /v1/check`: may this inbound request proceed?
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(example = json!({"user": "u1", "method": "GET", "path": "/repo/v1/entity/123/bundle"})))]
pub struct CheckBody {
    /// Who makes the request: the key for limits counted `per` key.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::Key>))]
    pub user: Option<String>,
    /// The request's HTTP method: letters only, compared without case. A rule on GET also
    /// matches HEAD, which routers serve with the GET handler.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z]+$"))]
    pub method: String,
    /// The request path as received (a query is ignored). It is matched normalized, as the
    /// throttle layer does: percent-decoded once (`%2F` stays within its segment), dot
    /// segments resolved, empty segments dropped, ids (numbers in any spelling such as `+12`
    /// or `012`, UUIDs plain, braced or as `urn:uuid:`, runs of 16+ hex digits) as `#`;
    /// lower-cased, and `;` parameters dropped, when the server's `path_case` and
    /// `path_params` say the application's router reads paths so. A path that cannot be
    /// percent-decoded (a `%` without two hex digits, bytes that are not UTF-8) is a 400, and
    /// so is one over 8 KiB.
    pub path: String,
}

/// An inbound request allowed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckAnswer {
    pub allowed: bool,
    /// The normalized path that was matched.
    pub path: String,
    /// The limits whose `match` matched, by name.
    pub matched: Vec<String>,
    /// When a concurrency limit applied: commit this permit when the request is done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit: Option<String>,
    pub limits: Vec<LimitView>,
}

impl From<&LimitStatus> for LimitView {
    fn from(status: &LimitStatus) -> LimitView {
        LimitView {
            name: status.name.clone(),
            remaining: status.remaining,
            reset_ms: ms_ceil(status.reset_after),
            fence: status.fence,
            expires_ms: status.lease_expires_in.map(ms_ceil),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RawRule;

    #[test]
    fn request_bodies_read_integers_in_either_json_spelling() {
        let body: AcquireBody =
            serde_json::from_str(r#"{"limits":["a"],"cost":2.0,"wait_ms":1000.0}"#).expect("read");
        assert_eq!((body.cost, body.wait_ms), (Some(2), Some(1000)));
        let body: PauseBody =
            serde_json::from_str(r#"{"limit":"a","retry_after_ms":86400000.0}"#).expect("read");
        assert_eq!(body.retry_after_ms, 86_400_000);
        let rule: RawRule = serde_json::from_str(
            r#"{"kind":"rate","limit":5.0,"period_ms":1000.0,"reserve":{"high":1.0}}"#,
        )
        .expect("read");
        assert_eq!((rule.limit, rule.period_ms), (Some(5), Some(1000)));
        assert_eq!(rule.reserve.and_then(|reserve| reserve.high), Some(1));
        let error = serde_json::from_str::<CommitBody>(r#"{"used":0.5}"#).expect_err("fraction");
        assert!(
            error.to_string().contains("floating point `0.5`"),
            "{error}"
        );
    }
}
