//! Tollgate's decision core: every limit algorithm as plain arithmetic on
//! `(policy, counter state, now, cost, priority)`.
//!
//! Nothing here reads a clock, performs I/O, allocates a task or knows about a store: `now` is
//! an argument in integer microseconds on whatever clock decides (a process's monotonic clock
//! for the memory store, Redis `TIME` for the shared store). Stores, the model checker and the
//! simulators all call these same functions, so the logic that is checked is the logic that runs.
//!
//! ```
//! use tollgate_core::{Algorithm, Counter, Policy, Priority, Reserve, Verdict};
//! let policy = Policy::rate(2, 1_000_000, 0, Algorithm::Sliding, Reserve::default())?;
//! let mut counter = Counter::new(0);
//! assert!(counter.decide(&policy, 0, 1, Priority::Normal, true)?.is_granted());
//! assert!(counter.decide(&policy, 10, 1, Priority::Normal, true)?.is_granted());
//! // The third unit must wait until the first stops counting, one period after it.
//! match counter.decide(&policy, 20, 1, Priority::Normal, true)? {
//!     Verdict::Denied(denial) => assert_eq!(denial.retry_after_us, 999_980),
//!     Verdict::Granted(_) => unreachable!(),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod counter;
mod policy;
mod stops;

pub use counter::{
    Committed, CostError, Counter, CounterWordsError, Denial, DenyReason, GcraStep, Grant,
    LEASES_MAX, PermitError, RESERVATIONS_TRACKED_MAX, SLIDING_BUCKETS_MAX, Verdict, gcra_admit,
};
pub use policy::{
    Algorithm, Concurrency, Kind, Policy, PolicyError, Priority, Rate, Reserve, SPAN_US_MAX,
    SPAN_US_MIN, UNITS_MAX,
};
pub use stops::Around;
