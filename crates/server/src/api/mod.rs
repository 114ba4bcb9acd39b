//! The handlers of HTTP API v1. The bodies they read and answer are `tollgate_api`'s; the
//! annotations beside each handler add each operation's statuses, parameters and links to the
//! OpenAPI document (`openapi.rs`), so the document cannot drift from what is served.
//!
//! `admin` holds the limits endpoints, `data` the data plane (acquire, commit, renew, pause)
//! and what every decision answers and counts, `inbound` `/v1/check` and the one inbound
//! decision `/v1/forward-auth` shares, `ops` health, readiness, metrics and the fallbacks. This
//! module holds what they share: the result type and the names read from a path.

pub(crate) mod admin;
pub(crate) mod data;
pub(crate) mod inbound;
pub(crate) mod ops;

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use tollgate::check_limit_name;

use crate::error::ApiError;

pub(crate) type ApiResult<T> = Result<T, ApiError>;

pub(crate) use tollgate_api::ms_ceil;

fn path_name(path: Result<Path<String>, PathRejection>, field: &str) -> ApiResult<String> {
    path.map(|Path(value)| value)
        .map_err(|rejection| ApiError::bad_field(field, rejection.body_text()))
}

/// A name in the path (a limit's, or a token's, which follow the same rule), as `name`.
pub(crate) fn limit_name(path: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    let name = path_name(path, "name")?;
    check_limit_name(&name).map_err(|reason| ApiError::bad_field("name", reason))?;
    Ok(name)
}
