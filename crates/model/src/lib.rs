//! Model checking of the scenarios' protocols and of Tollgate's own, over the real decision core.
//!
//! Each module is one small state machine checked exhaustively by stateright:
//!
//! - [`calls`]: the vendor-quota scenario (docs/guarantees.md), calls against a central counter
//!   (naive, check-then-act, await with and without a reset, reservation).
//! - [`tokens`]: the token-pool scenario, a prepaid token pool guarded by a lock that times out,
//!   and the same pool guarded by leases counted in the store.
//! - [`protocol`]: Tollgate's own protocol, workers against one store whose state is real
//!   `tollgate_core::Counter`s, so the arithmetic that is checked is the arithmetic that runs.
//! - [`cross_slot`]: the Redis Cluster store's requests over counters in several slots, decided
//!   slot by slot and rolled back on a denial, driven by `tollgate_redis_protocol::plan` itself.
//! - [`failover`]: one Redis Cluster slot through asynchronous replication, failovers,
//!   restarts and resharding, every decision made with the loss check of
//!   `tollgate_redis_protocol::loss` over a real `tollgate_core::Counter`.
//! - [`queue`]: one counter's queue across the fleet, waiters of several priorities in several
//!   processes that ask again, give up or crash, ordered by `tollgate_redis_protocol::queue`
//!   over a real `tollgate_core::Counter`.
//!
//! [`run`] explores a model and [`trace`] prints a discovery step by step. The bounds of every
//! model come from [`Bound`]: small by default so `cargo test` stays quick, larger with
//! `TOLLGATE_MODEL_BOUND=large` (see `docs/models.md`).

pub mod calls;
pub mod cross_slot;
pub mod failover;
pub mod protocol;
pub mod queue;
mod run;
pub mod tokens;

pub use run::{Bound, Outcome, run, trace};
