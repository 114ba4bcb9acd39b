//! `GET /v1/stats`: every limit with its rule, its usage, its waiters, grants and denials; the
//! rules' reload state; the store's; Envoy's entries; and with `?history=` each limit's recent
//! past.

use serde::{Deserialize, Serialize};
use tollgate::DenyReason;

use crate::admin::RejectedRow;
use crate::{RawRule, Reason};

/// The server at a glance: `GET /v1/stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Stats {
    /// The limits in force (or the one asked for), by name.
    pub limits: Vec<LimitStats>,
    pub rules: RulesView,
    pub store: StoreView,
    /// The Envoy configuration served over gRPC, when there is one (and the caller's token is
    /// not scoped to some limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy: Option<EnvoyView>,
}

/// Envoy's rate limit service: its configuration, and each entry that has a limit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvoyView {
    /// The file or directory the configuration is read from.
    pub config: String,
    pub domains: u64,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// Why the last edit was refused (the configuration in force stays as it was); absent when
    /// the last read succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_reload_error: Option<String>,
    /// `ShouldRateLimit` answers since the server started, by overall code.
    pub answered_ok: u64,
    pub answered_over_limit: u64,
    /// Requests decided without the store, because it could not answer.
    pub store_failures: u64,
    pub limits: Vec<EnvoyLimit>,
}

/// One entry of the configuration with a limit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvoyLimit {
    /// The entry's place: its domain, then each level's `key` or `key_value`, joined by `.`.
    pub path: String,
    /// The entry's `name`, if it has one (what `replaces` refers to).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Requests per unit; absent when unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_unit: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    pub unlimited: bool,
    pub shadow_mode: bool,
    /// The counter it counts in the store (per descriptor value), when it counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counter: Option<String>,
    /// Descriptors that found this entry, answered `OK` and `OVER_LIMIT`, since the
    /// configuration was read.
    pub ok: u64,
    pub over_limit: u64,
}

/// One limit: its rule, what its counter holds now, and what the server has decided on it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitStats {
    pub name: String,
    /// The rule in force, as `GET /v1/limits/{name}` shows it.
    pub rule: RawRule,
    /// The key whose usage is shown, for a limit counted per key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The counter now; absent for a limit counted per key when no key was asked for, or when
    /// the store did not answer (then `usage_error` says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_error: Option<String>,
    /// A limit counted per key, when no key was asked for: the keys asked for most since the
    /// server started (an estimate that never misses a key asked for often), with their usage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hot_keys: Vec<HotKey>,
    /// Acquires waiting for room on this limit now.
    pub waiting: u64,
    /// The same, by priority.
    pub waiting_by_priority: ByPriority,
    /// Acquires granted since the server started.
    pub grants: u64,
    /// Acquires not granted within their wait since the server started, by reason.
    pub denials: Denials,
    /// With `?history=`: the limit's recent past; absent when the server keeps none for it
    /// (it keeps the first 1,000 limits by name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<crate::stats::Series>,
    /// For a rate limit: the limit in force beside the configured one, what a vendor taught
    /// (`POST /v1/learn`) and the grant-to-send delay callers report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<crate::data::LearnedView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageView {
    /// Units (rate) or lease slots (concurrency) counted now.
    pub used: u64,
    /// What the counter can hold at once: the limit, or a GCRA limit's burst.
    pub capacity: u64,
    /// What could be held at once (the limit, or a GCRA limit's burst) less what is used: what
    /// the highest priority could still take.
    pub remaining: u64,
    /// Milliseconds until every unit counted now stops counting.
    pub reset_after_ms: u64,
    /// Milliseconds until a pause (or a hold after a loss of state) ends; 0 when none is on.
    pub paused_ms: u64,
    /// Of `paused_ms`, milliseconds until the store's hold after a loss of state ends (after a
    /// crash, or a Redis that came back empty: see `recovering`); 0 when none is on. A hold is
    /// not a pause: nobody asked for it, and resuming the limit does not lift it.
    #[serde(default)]
    pub held_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HotKey {
    pub key: String,
    /// Requests for this key (acquires and checks), counted since the server started; an upper
    /// bound for a key that entered the count late.
    pub requests: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ByPriority {
    pub high: u64,
    pub normal: u64,
    pub low: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RulesView {
    /// Grows with every change of the rules in force.
    pub version: u64,
    /// Where the rules come from: `table NAME` or `file PATH`.
    pub source: String,
    /// Whether the admin API can change the limits (false when they come from a file).
    pub writable: bool,
    /// Whether the last reload read the source.
    pub last_reload_ok: bool,
    /// Why the last reload failed (the rules in force stay as they were); absent when it read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_reload_error: Option<String>,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// Rows (or file entries) not in force as written.
    pub rejected: Vec<RejectedRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoreView {
    /// `memory` or `redis`.
    pub kind: String,
    /// Memory store: counters tracked now, and at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys_tracked: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys_tracked_max: Option<u64>,
}

/// One limit's history as served: the newest sample last, one every `step_ms`, the newest taken
/// `age_ms` before the answer. `used` is null where the counter was not read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Series {
    pub step_ms: u64,
    pub age_ms: u64,
    pub used: Vec<Option<u64>>,
    pub grants: Vec<u64>,
    pub denials: Vec<u64>,
    pub waiting: Vec<u64>,
    /// Grants and denials since the server started, as of the newest sample: with the counts
    /// per step, every sample's running total.
    pub grants_total: u64,
    pub denials_total: u64,
}

/// Denials by reason: every reason the core has, under its one name, 0 when none was denied
/// for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Denials(pub [u64; DenyReason::ALL.len()]);

impl Denials {
    pub fn count(&mut self, reason: DenyReason, by: u64) {
        if let Some(place) = DenyReason::ALL.iter().position(|known| *known == reason) {
            self.0[place] = self.0[place].saturating_add(by);
        }
    }

    pub fn get(&self, reason: DenyReason) -> u64 {
        DenyReason::ALL
            .iter()
            .position(|known| *known == reason)
            .map_or(0, |place| self.0[place])
    }

    pub fn total(&self) -> u64 {
        self.0
            .iter()
            .fold(0, |total, count| total.saturating_add(*count))
    }

    /// Every reason with its count, in `DenyReason::ALL`'s order.
    pub fn iter(&self) -> impl Iterator<Item = (Reason, u64)> + '_ {
        DenyReason::ALL
            .iter()
            .map(|reason| Reason(*reason))
            .zip(self.0.iter().copied())
    }
}

impl Serialize for Denials {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (reason, count) in self.iter() {
            map.serialize_entry(reason.as_str(), &count)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Denials {
    /// Reasons this client does not know are left out.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Denials, D::Error> {
        let named = std::collections::BTreeMap::<String, u64>::deserialize(deserializer)?;
        let mut denials = Denials::default();
        for (name, count) in named {
            if let Some(reason) = Reason::parse(&name) {
                denials.count(reason.0, count);
            }
        }
        Ok(denials)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Denials {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let mut object = ObjectBuilder::new().description(Some(
            "Acquires not granted within their wait since the server started, by reason.",
        ));
        for reason in DenyReason::ALL {
            object = object
                .property(
                    reason.as_str(),
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0)),
                )
                .required(reason.as_str());
        }
        object.into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Denials {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("Denials")
    }
}
