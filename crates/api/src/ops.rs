//! Operations: liveness and readiness.

use serde::{Deserialize, Serialize};

/// Liveness and readiness.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// `ok`, or what is wrong.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// What is wrong with the rules, one line each (a limits file's as `FILE:LINE: NAME:
    /// FIELD: REASON`): rejected rows and a failed reload. Readiness holds meanwhile, since the
    /// last good rules are enforced; absent when all is well.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules_problems: Option<Vec<String>>,
}
