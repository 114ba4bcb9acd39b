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
    /// `high`, `normal` (default) or `low`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::PriorityName>))]
    pub priority: Option<String>,
    /// How long to wait for room, in milliseconds (default 0: answer now); capped by the
    /// server's `wait_ms_max`.
    #[serde(default, deserialize_with = "crate::number::optional")]
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
    /// Required: a commit that forgot it must not refund everything.
    #[serde(default, deserialize_with = "crate::number::optional")]
    #[cfg_attr(feature = "openapi", schema(value_type = u64, required = true))]
    pub used: Option<u64>,
}

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
