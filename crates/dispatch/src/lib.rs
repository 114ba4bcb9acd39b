//! Tollgate's outbound dispatcher: keep every caller of a remote host inside the host's limits,
//! and turn the host's "rate limited, retry after" into a pause for the whole fleet.
//!
//! - [`Gate`]: one host's send protocol. Quota from a [`Quota`] (a [`tollgate::Limiter`] on
//!   any store, or a remote Tollgate server), a re-check for pauses and stale leases right
//!   before sending, the [`Classifier`]'s verdict on the answer, fleet-wide pauses, bounded
//!   retries with jittered backoff.
//! - [`Dispatcher`]: a priority fan-in queue and a bounded pool of connections keyed by a
//!   selector, on top of a gate, runnable on a dedicated runtime.
//! - [`TollgateMiddleware`]: the gate as a `reqwest-middleware` middleware.
//! - [`llm`]: token budgets for language-model APIs (requests, input and output tokens per
//!   period), settled as the answer streams.
//! - [`read_advice`]: a vendor's rate-limit headers (five families) read into [`Advice`].
//!
//! No rate arithmetic lives here: priorities, waiting, pauses that only extend, and sharing
//! across processes are the engine's.

mod advice;
mod classify;
mod dispatcher;
mod error;
mod gate;
pub mod llm;
mod middleware;
mod pool;
mod quota;
mod remote;
mod retry_after;

pub use advice::{
    ADVICE_QUOTAS_MAX, ADVICE_VALUE_BYTES_MAX, Advice, AdvisedQuota, Family, read_advice,
};
pub use classify::{
    Answer, Classifier, Classify, GRPC_RESOURCE_EXHAUSTED, GRPC_UNAVAILABLE, Plain, Rule, Verdict,
    default_verdict,
};
pub use dispatcher::{
    CONNECTIONS_MAX_LIMIT, DispatchRuntime, Dispatcher, DispatcherConfig, Job, QUEUED_MAX_LIMIT,
};
pub use error::{ConnectError, DispatchError};
pub use gate::{Admission, Gate, GateConfig, GateStats, RETRIES_MAX_LIMIT, Settled};
pub use middleware::TollgateMiddleware;
pub use quota::{HostLimits, Quota, QuotaPermit};
pub use remote::{REMOTE_BODY_BYTES_MAX, RemoteQuota};
pub use retry_after::{RETRY_AFTER_BYTES_MAX, parse_retry_after};
pub use tollgate::Priority;
