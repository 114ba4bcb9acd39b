//! The dispatcher's own failures. A vendor's answer is never one of these: whatever the job
//! returned (a 404, a decode error, the last 429 once retries are spent) reaches the caller
//! unchanged as the job's output. These are the cases where the dispatcher did not run the
//! job, or could not finish running it.

/// A connector's failure to open a connection for a selector.
pub type ConnectError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The queue holds `queued_max` jobs already; nothing was queued.
    #[error("the dispatcher's queue is full: {queued_max} jobs wait already")]
    QueueFull { queued_max: u32 },
    /// No quota within `wait_ms_max`; `paused` when the host was paused at the deadline.
    #[error("no quota for the host within {waited_ms} ms{}", if *paused { " (the host is paused)" } else { "" })]
    WaitTimedOut { waited_ms: u64, paused: bool },
    /// The lease's fencing number is no longer current (the lease expired, so its slot may be
    /// another holder's); the request was not sent.
    #[error(
        "lease with fence {fence} is stale: it expired before the request was sent, so the request was not sent"
    )]
    StaleLease { fence: u64 },
    /// The quota's store failed or refused the request.
    #[error("quota: {0}")]
    Quota(#[from] tollgate::Error),
    /// The remote Tollgate server failed or refused the request.
    #[error("remote quota server: {reason}")]
    Remote { reason: String, transient: bool },
    /// The connector could not open a connection for the job's selector.
    #[error("connecting: {source}")]
    Connect { source: ConnectError },
    /// The dispatcher stopped before the job ran.
    #[error("the dispatcher is shut down")]
    ShutDown,
    /// A configuration value is out of range; names the field.
    #[error("{field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
}

impl DispatchError {
    /// Whether the same job may succeed if submitted again later unchanged.
    pub fn is_transient(&self) -> bool {
        match self {
            DispatchError::QueueFull { .. }
            | DispatchError::WaitTimedOut { .. }
            | DispatchError::StaleLease { .. }
            | DispatchError::Connect { .. } => true,
            DispatchError::Quota(error) => error.is_transient(),
            DispatchError::Remote { transient, .. } => *transient,
            DispatchError::ShutDown | DispatchError::InvalidConfig { .. } => false,
        }
    }

    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> DispatchError {
        DispatchError::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}
