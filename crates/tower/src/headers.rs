//! The answer fields: `Retry-After` and the IETF `RateLimit-Policy` / `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers-10, as HTTP structured-field lists (RFC 9651).
//!
//! One list member per limit that applied to the request, named by the rule's name (rule
//! names are `[a-z0-9][a-z0-9._:-]*`, so they never need escaping inside a string):
//!
//! ```text
//! RateLimit-Policy: "user-conc";q=4;qu="concurrent-requests", "user-freq";q=100;w=60, "entity-bundle";q=10;w=60
//! RateLimit: "user-conc";r=3, "user-freq";r=97;t=42, "entity-bundle";r=9;t=42
//! ```
//!
//! - `q`: the quota: the limit's units (the burst for GCRA) or leases.
//! - `w`: for rate limits, the window in whole seconds, rounded up.
//! - `qu="concurrent-requests"`: for concurrency limits (the draft's unit for in-flight requests;
//!   rate limits use the default unit, `requests`, and omit it).
//! - `r`: units remaining for this user after the decision.
//! - `t`: for rate limits, seconds until the units counted now stop counting, rounded up.
//!
//! The partition key (`pk`) is not sent: it would reveal how users are told apart.
//! `Retry-After` is in whole seconds, rounded up, and at least 1 on a refusal.

use std::fmt::Write;
use std::time::Duration;

use http::HeaderValue;
use tollgate::core::Kind;
use tollgate::{Limit, LimitStatus};

/// The `RateLimit-Policy` field name.
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
/// The `RateLimit` field name.
pub const RATELIMIT: &str = "ratelimit";

/// Whole seconds, rounded up.
pub fn seconds_ceil(duration: Duration) -> u64 {
    duration
        .as_micros()
        .div_ceil(1_000_000)
        .try_into()
        .unwrap_or(u64::MAX)
}

/// One `RateLimit-Policy` list member for a limit.
pub fn policy_item(limit: &Limit) -> String {
    let policy = limit.policy();
    match policy.kind() {
        Kind::Rate(rate) => format!(
            "\"{}\";q={};w={}",
            limit.name(),
            policy.capacity(),
            seconds_ceil(Duration::from_micros(rate.period_us()))
        ),
        Kind::Concurrency(_) => format!(
            "\"{}\";q={};qu=\"concurrent-requests\"",
            limit.name(),
            policy.capacity()
        ),
    }
}

/// The `RateLimit-Policy` value for the given members.
pub(crate) fn policy_value<'a>(items: impl Iterator<Item = &'a str>) -> Option<HeaderValue> {
    let text = items.collect::<Vec<_>>().join(", ");
    HeaderValue::try_from(text).ok()
}

/// The `RateLimit` value: per limit, what remains and (for rate limits) when it resets.
/// `is_lease` tells, per status, whether the limit counts concurrent requests.
pub(crate) fn ratelimit_value<'a>(
    statuses: impl Iterator<Item = (&'a LimitStatus, bool)>,
) -> Option<HeaderValue> {
    ratelimit_members(statuses.map(|(status, is_lease)| Member {
        name: &status.name,
        remaining: status.remaining,
        reset_after: status.reset_after,
        is_lease,
    }))
}

/// One member of the `RateLimit` field.
pub(crate) struct Member<'a> {
    pub(crate) name: &'a str,
    pub(crate) remaining: u64,
    pub(crate) reset_after: Duration,
    pub(crate) is_lease: bool,
}

/// `RateLimit` from its members, in order.
pub(crate) fn ratelimit_members<'a>(
    members: impl Iterator<Item = Member<'a>>,
) -> Option<HeaderValue> {
    let mut text = String::new();
    for member in members {
        if !text.is_empty() {
            text.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = write!(text, "\"{}\";r={}", member.name, member.remaining);
        if !member.is_lease {
            let _ = write!(text, ";t={}", seconds_ceil(member.reset_after));
        }
    }
    HeaderValue::try_from(text).ok()
}

/// `Retry-After` for a refusal: whole seconds, rounded up, at least 1 (a client told "0"
/// would retry at once and be refused again).
pub(crate) fn retry_after_value(retry_after: Duration) -> HeaderValue {
    HeaderValue::from(seconds_ceil(retry_after).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::{Algorithm, Policy, Reserve};

    #[test]
    fn policy_items_follow_the_draft() {
        let rate =
            Policy::rate(10, 60_500_000, 0, Algorithm::Fixed, Reserve::default()).expect("valid");
        let limit = Limit::new("entity-bundle", rate, Some("user")).expect("valid");
        assert_eq!(policy_item(&limit), "\"entity-bundle\";q=10;w=61");
        let concurrency = Policy::concurrency(4, 30_000_000, Reserve::default()).expect("valid");
        let limit = Limit::new("user-conc", concurrency, Some("user")).expect("valid");
        assert_eq!(
            policy_item(&limit),
            "\"user-conc\";q=4;qu=\"concurrent-requests\""
        );
    }

    #[test]
    fn ratelimit_values_round_up() {
        let status = |name: &str, remaining, reset_ms| LimitStatus {
            name: name.to_owned(),
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            fence: None,
            lease_expires_in: None,
        };
        let statuses = [status("a", 3, 1), status("b", 0, 2_000), status("c", 1, 0)];
        let value =
            ratelimit_value(statuses.iter().zip([false, false, true])).expect("valid header");
        assert_eq!(value, "\"a\";r=3;t=1, \"b\";r=0;t=2, \"c\";r=1");
        assert_eq!(retry_after_value(Duration::from_millis(1)), "1");
        assert_eq!(retry_after_value(Duration::ZERO), "1");
        assert_eq!(retry_after_value(Duration::from_millis(2_001)), "3");
    }
}
