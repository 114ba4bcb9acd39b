//! What a failure means to a caller: Redis unreachable (`StoreUnavailable`, which may fail
//! open) or an answer that is a failure (`StoreFailed`); the errors a script reply stands for,
//! and the one that says Redis lost the script.

use std::fmt;

use redis::RedisError;
use tollgate::Error;
use tollgate_core::PermitError;

use crate::call::u;
use crate::operations::ADMISSION_ATTEMPTS_MAX;

/// Redis cannot be reached (no connection, no answer in time).
pub(crate) fn unavailable(error: impl fmt::Display) -> Error {
    Error::StoreUnavailable {
        reason: error.to_string(),
    }
}

/// Redis answered, with a failure (a reply the store cannot read, a status it does not know).
pub(crate) fn failed(error: impl fmt::Display) -> Error {
    Error::StoreFailed {
        reason: error.to_string(),
    }
}

/// What a Redis error means: unreachable (no connection, the connection dropped, no answer in
/// time, no master for the slot or the name, a node still loading its data or moving a slot),
/// or an answer that is a failure (`OOM`, a script error, `READONLY`, `NOPERM`, a reply that
/// does not parse). Only the first may fail open, so anything not known to be unreachable is
/// a failure.
pub(crate) fn store_error(error: RedisError) -> Error {
    use redis::{ErrorKind, ServerErrorKind};
    let unreachable = error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::NoValidReplicasFoundBySentinel
                | ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                )
        );
    if unreachable {
        unavailable(error)
    } else if error.code() == Some("OOM") {
        failed(format!(
            "Redis is out of memory (its maxmemory is reached), so it decides nothing: {error}"
        ))
    } else {
        failed(error)
    }
}

pub(crate) fn too_many_keys(limit: &str, keys_max: u64) -> Error {
    Error::TooManyKeysForLimit {
        limit: limit.to_owned(),
        keys_max,
    }
}

pub(crate) fn lost_library(error: &RedisError) -> bool {
    let text = error.to_string();
    text.contains("Function not found") || text.contains("NOSCRIPT")
}

pub(crate) fn permit_error(status: &str, numbers: &[i64], used: u64) -> Error {
    let source = match status {
        "unknown" => PermitError::Unknown,
        "gone" => PermitError::Gone,
        "lease_expired" => PermitError::LeaseExpired,
        "wrong_kind" => PermitError::WrongKind,
        "used_above_cost" => PermitError::UsedAboveCost {
            used,
            cost: u(numbers.get(3).copied().unwrap_or(0)),
        },
        other => return failed(format!("unexpected script status {other}")),
    };
    Error::Permit { source }
}

/// The script asked for a key to be admitted more times than a cover can run out in.
pub(crate) fn not_admitted(limit: &str) -> Error {
    failed(format!(
        "a key of limit {limit:?} was not admitted to its budget in {ADMISSION_ATTEMPTS_MAX} \
         calls (are the Redis nodes' clocks far apart?)"
    ))
}
