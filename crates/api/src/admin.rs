//! The admin API's bodies: the limits in force and the rows refused, deletions, lifted pauses,
//! and scoped data tokens.

use serde::{Deserialize, Serialize};

use crate::RawRule;

/// All limits in force, and the rows of the rules table that are not in force as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitList {
    /// Grows with every change of the rules in force.
    pub version: u64,
    pub limits: Vec<RawRule>,
    pub rejected: Vec<RejectedRow>,
}

/// A row of the rules table that failed validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RejectedRow {
    pub name: String,
    /// The table column (or the file's field) at fault.
    pub column: String,
    pub reason: String,
    /// Whether an earlier valid version of this limit is still in force.
    pub previous_in_force: bool,
    /// The limits file's line where the fault is written; absent for a table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// What a delete removed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Deleted {
    pub name: String,
    pub deleted: bool,
}

impl Deleted {
    pub fn new(name: String) -> Deleted {
        Deleted {
            name,
            deleted: true,
        }
    }
}

/// A pause lifted, or none to lift.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Resumed {
    pub limit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Whether a pause was on (false: there was none to lift).
    pub resumed: bool,
}

/// A counter forgotten by an administrator (`DELETE /v1/limits/{name}/usage`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Reset {
    pub limit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Whether the store held the counter (false: it counted nothing to forget).
    pub reset: bool,
}

/// `POST /v1/tokens`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(example = json!({"name": "team-a", "limits": ["vendor-*"], "priority_max": "normal",
    "may_pause": false})))]
pub struct TokenBody {
    /// The token's name, unique: to list and revoke it by.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::LimitName))]
    pub name: String,
    /// The limits it may use: names, prefixes ending in `*` (`vendor-*`), or `*` for all.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::schema::LimitPattern>, min_items = 1, max_items = 64))]
    pub limits: Vec<String>,
    /// The highest priority it may ask for (default `normal`); asking for none decides at
    /// `normal`, or at this if lower.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::PriorityName>))]
    pub priority_max: Option<String>,
    /// Whether it may pause its limits (default false).
    #[serde(default)]
    pub may_pause: Option<bool>,
    /// The most units one of its requests may ask for (default: no bound of its own); a
    /// request for more is refused with 403.
    #[serde(default, deserialize_with = "crate::number::optional")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1_000_000_000))]
    pub cost_max: Option<u64>,
    /// The longest one of its requests may wait, in milliseconds (default: the server's
    /// `wait_ms_max`); a longer `wait_ms` waits this long.
    #[serde(default, deserialize_with = "crate::number::optional")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 9_007_199_254_740_992_u64)
    )]
    pub wait_max_ms: Option<u64>,
}

/// A token and what it may do; never its secret.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenView {
    pub name: String,
    /// Limit names, `prefix*` patterns, or `*`.
    pub limits: Vec<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::PriorityName))]
    pub priority_max: String,
    pub may_pause: bool,
    /// When it was made, in milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// The most units one of its requests may ask for; `null`: no bound of its own.
    #[serde(default)]
    pub cost_max: Option<u64>,
    /// The longest one of its requests may wait, in milliseconds; `null`: the server's
    /// `wait_ms_max`.
    #[serde(default)]
    pub wait_max_ms: Option<u64>,
}

/// A token just made, with its secret: shown in this answer only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewToken {
    pub name: String,
    pub limits: Vec<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::PriorityName))]
    pub priority_max: String,
    pub may_pause: bool,
    pub created_ms: i64,
    #[serde(default)]
    pub cost_max: Option<u64>,
    #[serde(default)]
    pub wait_max_ms: Option<u64>,
    /// The bearer token to give the caller. Only its hash is kept: it cannot be shown again.
    pub secret: String,
}

/// The tokens in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// `GET /v1/admin-token/proof`: that the server holds the admin token, shown without sending
/// it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminProof {
    /// 64 lowercase hex digits: HMAC-SHA256 of the listen address and the nonce, keyed by a
    /// key derived from the admin token.
    pub proof: String,
}
