//! Tollgate: keep a fleet of programs inside the limits that APIs impose.
//!
//! A [`Limiter`] holds named [`Limit`]s and decides requests against a [`store::Store`]: the
//! in-memory [`MemoryStore`] for one process, or a shared store for many. A request names one
//! or more limits and is granted on all or none; it may wait, in priority order, for room.
//! Grants are [`Permit`]s: rate units that `commit(used)` partly refunds, and leases with
//! fencing tokens that `release` ends and `renew` extends. A pause (a vendor's "retry after")
//! stops every grant on a limit until it ends. A caller with nothing to settle asks
//! [`Limiter::check`] (or a [`LimitHandle`] for one limit on a hot path): the same decision,
//! without a permit.
//!
//! The arithmetic lives in [`tollgate_core`], re-exported here.

mod clock;
pub mod conformance;
mod error;
mod hot;
mod learned;
mod limiter;
mod limits;
mod memory;
mod permit_id;
pub mod store;
mod sync;
mod waiters;
mod write_ahead;

#[cfg(all(test, tollgate_loom))]
mod loom_tests;

pub use clock::{Clock, ManualClock, MonotonicClock, TscClock, utc_now_text, utc_text};
pub use error::{Error, Result};
pub use learned::{
    AdvertisedQuota, LEARNED_MARGIN_ALLOWANCE_US, LESSON_QUOTAS_MAX, LESSON_SOURCE_BYTES_MAX,
    LearnConfig, Learned, LearnedKind, LearnedLimit, Lesson,
};
pub use limiter::{
    Charged, Check, DEFAULT_PAUSE_MS_MAX, DEFAULT_WAITERS_MAX, DEFAULT_WAITERS_PER_LIMIT_MAX,
    Denied, Kept, LimitHandle, Limiter, LimiterConfig, Outcome, PAUSE_MS_MAX, Permit, QueueFull,
    Request, Shares, Status, Statuses, Used,
};
pub use limits::{
    KEY_BYTES_MAX, LIMIT_NAME_BYTES_MAX, Limit, LimitTable, check_key, check_limit_name,
};
pub use memory::{
    COUNTERS_PER_REQUEST_MAX, MemorySnapshot, MemoryStore, MemoryStoreConfig, Restored,
    SavedCounter,
};
#[doc(hidden)]
pub use permit_id::reencode_permit_id;
pub use permit_id::{
    LimitStatus, PERMIT_ID_CHARS_MAX, PERMIT_ID_CHARS_MIN, PermitId, PermitSecret,
};
pub use tollgate_core::{
    self as core, Algorithm, Committed, CostError, DenyReason, PermitError, Policy, PolicyError,
    Priority, Reserve, SPAN_US_MAX,
};
pub use write_ahead::{RECORD_WAIT_MAX, RecordBatch, WRITE_AHEAD_SHARE_OF_CAPACITY, budget_of};
