//! The engine's error type. A denial is not an error (see `Outcome`); these are failures: bad
//! input, unknown names, a store that cannot be reached or that answered with a failure. The
//! server and the tower layer map them to HTTP codes. `fails_open` is the one place that says which of them a
//! caller that chose availability over its limits may grant through.

use tollgate_core::{CostError, PermitError, PolicyError};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A request field is malformed; names the field and the reason.
    #[error("{field}: {reason}")]
    InvalidRequest { field: &'static str, reason: String },
    #[error("unknown limit {name:?}")]
    UnknownLimit { name: String },
    /// The request can never be granted at its priority, however long it waits.
    #[error("limit {limit:?}: {source}")]
    Cost { limit: String, source: CostError },
    /// A permit operation that does not apply: unknown, committed already, expired.
    #[error("permit: {source}")]
    Permit { source: PermitError },
    /// The store cannot be reached: no connection, no answer in time, the connection dropped,
    /// no master to ask. Nothing was granted. The only error failing open may grant through.
    #[error("store unavailable: {reason}")]
    StoreUnavailable { reason: String },
    /// The store answered, with a failure: out of memory, a script error, a reply it cannot
    /// read, a replica refusing writes. Nothing was granted, and failing open never grants
    /// through it: a caller able to cause it (filling the store) must not gain by it.
    #[error("store failed: {reason}")]
    StoreFailed { reason: String },
    /// Tracking a new key would exceed the configured `keys_tracked_max` (G7).
    #[error("too many keys tracked: the store's keys_tracked_max of {keys_tracked_max} is reached")]
    TooManyKeys { keys_tracked_max: u64 },
    /// Tracking a new key of `limit` would exceed that limit's own budget of keys (its
    /// `keys_max`, or the store's `keys_per_limit_max`): one flooded limit never takes room
    /// from another.
    #[error(
        "too many keys tracked for limit {limit:?}: its budget of {keys_max} keys (keys_max) is \
         reached; other limits are not affected"
    )]
    TooManyKeysForLimit { limit: String, keys_max: u64 },
    /// The limiter is shutting down and takes no new waits.
    #[error("the limiter is shutting down")]
    ShuttingDown,
}

impl Error {
    /// Whether the same request may succeed if tried again later unchanged.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::StoreUnavailable { .. }
                | Error::StoreFailed { .. }
                | Error::TooManyKeys { .. }
                | Error::TooManyKeysForLimit { .. }
                | Error::ShuttingDown
        )
    }

    /// Whether a caller that fails open may grant through this error: only when the store
    /// cannot be reached. A store that answered with a failure, a full key cap, bad input or a
    /// limit being shut down never do, since a caller can bring those about at will.
    pub fn fails_open(&self) -> bool {
        matches!(self, Error::StoreUnavailable { .. })
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidRequest {
            field,
            reason: reason.into(),
        }
    }
}

impl From<PermitError> for Error {
    fn from(source: PermitError) -> Error {
        Error::Permit { source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An invalid policy is invalid input, named by its field.
impl From<PolicyError> for Error {
    fn from(error: PolicyError) -> Error {
        Error::InvalidRequest {
            field: error.field,
            reason: error.reason,
        }
    }
}
