//! The Redis store: counters shared by any number of processes and machines.
//!
//! Every operation (acquire over several counters, commit, renew, pause) is one call of the
//! script (`lua/*.lua`, joined by `abi.rs`) per Redis Cluster slot it touches, which decides
//! atomically with the same arithmetic as the decision core, on Redis's clock (`TIME`), never a
//! worker's (G5). On Redis 7 and later the script is loaded as a function library named after
//! its hash and each call is one `FCALL` (its helpers are then made once, not on every call);
//! where `FUNCTION LOAD` is refused (older Redis, ACLs) it is one `EVALSHA`. A Redis that lost
//! the library (restart without persistence, a node new to a cluster) gets it again on the
//! first call that misses it. Under load, acquires on one slot share calls (`batch.rs`),
//! decided in order, each all or nothing, as they would be one by one.
//!
//! Where: one Redis (`redis://`), a Redis Cluster (`redis-cluster://`), or the master a set of
//! Sentinels names (`redis-sentinel://`), see `backend.rs`. Keys (`keys.rs`): each counter's
//! hash tag comes from its namespace, limit and key, so counters spread over a cluster's slots;
//! a request whose counters sit in several slots is decided slot by slot (`plan`): reserved
//! in ascending slot order and rolled back on a denial, so it stays all or nothing and never
//! overdraws. Every key is written with its expiry in the same script, so no key lives without
//! a TTL and Redis's memory follows live state (G7).
//!
//! Lost state (G6): a generation hash per slot (per namespace on one Redis) names its birth and
//! the Redis process that owns it. Every call reads it; a missing hash or another owner
//! (restart, flush, failover to a replica that may have missed writes) starts a new generation,
//! and every counter not written since waits out whatever it may have counted. A slot moved by
//! resharding is held too: nothing a script can see tells it from a stale copy after a failover
//! (`loss.rs`). Unreachable Redis: `store_unavailable`, unless `fail_open`
//! is set. A Redis that answered with a failure (out of memory, a script error, `READONLY`) is
//! `StoreFailed` and never failed open: a caller who can fill Redis must not gain by it
//! (`store_error` tells the two apart).
//!
//! Keys (G7, G10): each limit counted per key has a budget of keys (`keys_per_limit_max`, or the
//! limit's `keys_max`), kept by a tally in the limit's own slot (`tally.rs`). A counter of a key
//! carries its cover, until when the tally counts it, and the script never writes it to live
//! longer: a new key, or one whose cover runs out, is admitted first, by the script itself when
//! the tally is in the call's slot (always on one Redis), else by one call in the tally's slot
//! and the counter's call again. A full budget refuses that limit's new keys
//! (`TooManyKeysForLimit`), nothing else; a limit's one counter (not counted per key) is never
//! refused.
//!
//! Waiting across processes: the script publishes a counter's key on the namespace's wake
//! channel whenever capacity comes back (a refund, a release); a subscriber task turns that into
//! the limiter's wake-up, so a waiter in one process wakes when another releases.

mod abi;
mod acquire;
mod backend;
mod batch;
mod call;
mod connect;
mod errors;
mod eviction;
mod keys;
mod leasing;
mod native;
mod operations;
mod store;
pub mod tally;
#[cfg(test)]
mod twins;

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod differential_tests;
#[cfg(test)]
mod queue_tests;

pub use abi::PROTOCOL_VERSION;

/// The function library's source as `FUNCTION LOAD` takes it, its function named `name`: for
/// tests that run it beside another implementation of its protocol (`tollgate-redis-module`).
#[doc(hidden)]
pub fn library_source(name: &str) -> String {
    format!(
        "#!lua name={name}\n{}",
        abi::script().replace("__TOLLGATE_FUNCTION__", name)
    )
}
pub use keys::check_namespace;
pub use leasing::{LeasingConfig, LeasingStats, LeasingStore};
pub use native::{
    COMMIT_REFUSED_BEFORE_SENDING, LEAVE_REFUSED_BEFORE_SENDING, Module,
    OPERATIONS_REFUSED_BEFORE_SENDING, REFUSED_BEFORE_SENDING, REFUSED_IN_REDIS,
    RENEW_REFUSED_BEFORE_SENDING,
};
pub use store::{LessonFn, RedisStore, RedisStoreConfig};
/// The cross-slot plan and the loss check this store runs, as plain functions.
pub use tollgate_redis_protocol::{loss, plan, queue};
