//! The in-memory store: counters for one process, in shards so that threads deciding on
//! different keys rarely meet on a lock.
//!
//! Memory follows live state (G7): a counter is forgotten once the core says it is idle (it
//! can no longer affect a decision). Every counter a shard takes in pays for examining the
//! next four under a rotating cursor, dropping the idle ones, so reclaiming memory is spread
//! over the traffic that grows the map, never a stop-the-world sweep (a decision on a counter
//! already tracked examines none); `sweep` does the same in bounded steps for a background
//! task, for shards that stop taking in new counters; a shard's map shrinks as it empties, so
//! the memory of a burst of keys comes back once they are idle. Each limit counted per key
//! has its own budget of keys (`keys_per_limit_max`, or the limit's `keys_max`), so a caller
//! flooding one limit with keys is refused there (`TooManyKeysForLimit`) and takes no room
//! from any other; a store-wide cap on tracked counters (`TooManyKeys`) bounds memory when many
//! limits are flooded together. A limit's one counter (not counted per key) is never refused
//! for either. Each shard sits on its own cache lines, so threads deciding in different shards
//! do not take lines from each other.
//!
//! A request over several counters locks every shard it touches, in ascending shard order
//! (so two requests never wait on each other in a cycle), checks all, then grants all or none.
//!
//! This file holds the store itself (its configuration, its fields, the `Store` and `InProcess`
//! ways in, the limits it is told); the rest is cut along its concerns:
//!
//! - `counters.rs`: finding and making counters (ids, entries, shards, key budgets, sweeps);
//! - `decide.rs`: deciding a request on its counters (check all, grant all or none), and the
//!   hot ways a `LimitHandle` takes;
//! - `pauses.rs`: pauses (a counter's, a limit's), holds after a loss of state, usage;
//! - `snapshot.rs`: carrying every counter to a later process (`snapshot`, `restore`);
//! - `records.rs`: the write-ahead record keeper's side (`write_ahead.rs` holds the budgets).

use std::hash::{BuildHasher, Hash, Hasher};

use indexmap::map::RawEntryApiV1;
use indexmap::{Equivalent, IndexMap};
use smallvec::SmallVec;
use tollgate_core::{Around, Committed, Counter, GcraStep, Grant, Policy, Priority, gcra_admit};

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::{
    Adjust, Adjusted, Ask, Costs, CounterId, CounterOutcome, Decision, InProcess, News, Offers,
    Renewed, Store, StoreFuture, Take, Usage, WakeFn,
};
use std::sync::Arc;

use crate::hot::HotCounter;
use crate::limits::{Limit, LimitTable, check_key};
use crate::sync::{AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, OwnLine, lock};
use crate::write_ahead::{Flight, List, RECORD_WAIT_MAX, RecordBatch, ShardRecords, WriteAhead};

mod counters;
mod decide;
mod pauses;
mod records;
mod snapshot;

pub(crate) use counters::OwnedCounterId;
use counters::{Budgets, Entry, Located, Room, Shard};
use decide::decided;
pub use snapshot::{MemorySnapshot, Restored, SavedCounter};

/// Shards per store. A power of two well above the core count keeps lock collisions rare.
#[cfg(not(tollgate_loom))]
const SHARDS: usize = 64;
/// Under loom, few shards, so that requests meet on locks and in lock order.
#[cfg(tollgate_loom)]
const SHARDS: usize = 2;
/// Counters examined for idleness for each counter a shard takes in. With k examined per new
/// counter, a pass of the cursor over n counters admits n/k new ones and drops every counter
/// idle when examined, so a shard settles at most k/(k-1) times the counters live within
/// their period. Idle counters of a shard that takes in nothing new wait for `sweep`, which
/// the server and the layer run on a timer.
const SWEEP_PER_INSERT: usize = 4;
/// Counters examined, over all shards, before a new key is refused for the cap: first in the
/// key's own shard, under the request's locks; then, with no lock held, in every shard.
const SWEEP_BEFORE_REFUSING: usize = 1024;
/// A shard's map this small is never shrunk: what it would give back is not worth a move.
const SHRINK_ABOVE_CAPACITY: usize = 64;
/// Counters one request may name.
pub const COUNTERS_PER_REQUEST_MAX: usize = 8;

/// Bytes of a limit name and key kept inside the map's entry; longer ids go to the heap (most
/// names and keys are short, and an entry that holds its id keeps a lookup in one place).
const ID_BYTES_INLINE: usize = 32;

/// Builder-free configuration: every field is a decision the caller makes.
#[derive(Debug, Clone)]
pub struct MemoryStoreConfig {
    /// Counters tracked at most, over every limit; past it new keys get `TooManyKeys` (G7). A
    /// bound on memory: each limit's own budget refuses first, so only many flooded limits
    /// together reach it. A limit's one counter (not counted per key) is never refused.
    pub keys_tracked_max: u64,
    /// Keys one limit counted per key may have tracked at once, unless the limit says
    /// otherwise (`Limit::keys_max`); past it, that limit's new keys get
    /// `TooManyKeysForLimit` and no other limit is affected.
    pub keys_per_limit_max: u64,
}

/// Limits held back after a loss of state (`MemoryStore::hold`): when each hold ends.
type Hold = std::collections::HashMap<Box<str>, u64>;

/// Counters in this process's memory.
#[derive(Debug)]
pub struct MemoryStore {
    /// Each on its own lines: threads deciding in different shards never share a line.
    shards: Box<[OwnLine<Mutex<Shard>>]>,
    hasher: foldhash::fast::RandomState,
    clock: Arc<dyn Clock>,
    keys_tracked_max: u64,
    keys_per_limit_max: u64,
    tracked: AtomicUsize,
    /// Locked after a shard's lock, never before.
    budgets: Mutex<Budgets>,
    /// Limit-wide pauses (`pause` with no key), by limit name; consulted for every counter of
    /// the limit.
    pauses: Mutex<Vec<(Box<str>, u64)>>,
    /// The end of the latest of those pauses: once it has passed, no decision needs the lock
    /// above. Shared with the hot words, which decide nothing before it.
    limit_pauses_end: Arc<OwnLine<AtomicU64>>,
    /// Limits held back after a loss of state; `hold_ends` is the latest such hold's end, so
    /// that once it has passed no new counter looks at the hold.
    hold: Mutex<Hold>,
    hold_ends: AtomicU64,
    /// The wake-ups of every limiter on this store.
    wake: WakeHandlers,
    /// The write-ahead of budgets to a state database, when on (`with_write_ahead`).
    write_ahead: Option<WriteAhead>,
    /// The limits in force as last told (`News::Limits`), kept with write-ahead on: a request
    /// that waited for a record is decided under them, not under those it was asked under.
    in_force: Mutex<Option<Arc<LimitTable>>>,
}

#[derive(Default)]
struct WakeHandlers(Mutex<Vec<WakeFn>>);

impl std::fmt::Debug for WakeHandlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WakeHandlers({})", lock(&self.0).len())
    }
}

impl MemoryStore {
    pub fn new(config: MemoryStoreConfig, clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore::with_records(config, clock, false)
    }

    /// A store that grants on a rate counter only within a budget recorded ahead in a state
    /// database (`write_ahead.rs`): whoever keeps that database drains `record_batch`, writes each
    /// batch, and reports `records_landed` or `records_failed`. A request that needs a record
    /// waits for one (its answer is pending until then); the lock-free paths of `LimitHandle`
    /// step aside. After a crash, `restore` of the last records charges each its budget.
    pub fn with_write_ahead(config: MemoryStoreConfig, clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore::with_records(config, clock, true)
    }

    fn with_records(
        config: MemoryStoreConfig,
        clock: Arc<dyn Clock>,
        write_ahead: bool,
    ) -> MemoryStore {
        let hasher = foldhash::fast::RandomState::default();
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| {
                    OwnLine(Mutex::new(Shard {
                        counters: IndexMap::with_hasher(hasher.clone()),
                        cursor: 0,
                        sweep_owed: 0,
                        write_ahead: write_ahead.then(ShardRecords::default),
                    }))
                })
                .collect(),
            hasher,
            clock,
            keys_tracked_max: config.keys_tracked_max,
            keys_per_limit_max: config.keys_per_limit_max,
            tracked: AtomicUsize::new(0),
            budgets: Mutex::new(Budgets::default()),
            pauses: Mutex::new(Vec::new()),
            in_force: Mutex::new(None),
            limit_pauses_end: Arc::new(OwnLine(AtomicU64::new(0))),
            hold: Mutex::new(Hold::new()),
            hold_ends: AtomicU64::new(0),
            wake: WakeHandlers::default(),
            write_ahead: write_ahead.then(WriteAhead::new),
        }
    }

    /// Counters the shards' maps have room for without growing: what their memory is sized by.
    pub fn capacity(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).counters.capacity())
            .sum()
    }

    /// Counters tracked now.
    pub fn len(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl InProcess for MemoryStore {
    fn hot_counter(&self, take: Take<'_>) -> Option<Arc<HotCounter>> {
        MemoryStore::hot_counter(self, take)
    }

    fn grant_tracked(&self, take: Take<'_>, cost: u64, priority: Priority) -> Option<GcraStep> {
        MemoryStore::grant_tracked(self, take, cost, priority)
    }
}

impl Store for MemoryStore {
    fn offers(&self) -> Offers<'_> {
        Offers {
            queue: None,
            in_process: Some(self),
        }
    }

    /// The waiter is not needed: every waiter on this store is in this process's queue.
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        let Ask {
            takes,
            costs,
            priority,
            refundable,
            waiter: _,
        } = ask;
        let Some(write_ahead) = &self.write_ahead else {
            return StoreFuture::ready(self.acquire_now(takes, costs, priority, refundable));
        };
        // Counted before the attempt, so a batch that lands after it is not missed.
        let seen = write_ahead.batches();
        match self.attempt(takes, costs, priority, refundable) {
            Ok(None) => match write_ahead.closed() {
                Some(error) => StoreFuture::ready(Err(error)),
                None => StoreFuture::boxed(
                    self.acquire_after_record(takes, costs, priority, refundable, seen),
                ),
            },
            attempt => StoreFuture::ready(decided(attempt)),
        }
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        let result = self.with_existing(
            take,
            || {
                // Forgotten counters were idle: nothing they granted still counts.
                if take.policy.is_concurrency() {
                    Ok(Committed {
                        refunded: 0,
                        released: 0,
                    })
                } else {
                    Err(tollgate_core::PermitError::Gone.into())
                }
            },
            |counter, now| Ok(counter.commit(take.policy, now, seq, used)?),
        );
        if let Ok(committed) = &result
            && (committed.refunded > 0 || committed.released > 0)
        {
            // Every limiter on this store, not only the one that committed, has waiters to wake.
            let handlers: Vec<WakeFn> = lock(&self.wake.0).clone();
            for handler in handlers {
                handler(take.counter);
            }
        }
        StoreFuture::ready(result)
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        StoreFuture::ready(self.with_existing(
            take,
            || Err(tollgate_core::PermitError::LeaseExpired.into()),
            |counter, now| {
                let expires_at = counter.renew(take.policy, now, fence)?;
                Ok(Renewed {
                    expires_in_us: expires_at.saturating_sub(now),
                })
            },
        ))
    }

    fn adjust<'a>(&'a self, take: Take<'a>, adjust: Adjust) -> StoreFuture<'a, Adjusted> {
        StoreFuture::ready(match adjust {
            Adjust::Pause { for_us } => {
                self.pause_now(take, for_us).map(|paused_for_us| Adjusted {
                    changed: true,
                    paused_for_us,
                    ..Adjusted::default()
                })
            }
            Adjust::Resume => self.resume_now(take).map(|changed| Adjusted {
                changed,
                ..Adjusted::default()
            }),
            Adjust::Reset => self
                .with_existing(
                    take,
                    || Ok(false),
                    |counter, _| {
                        counter.forget();
                        Ok(true)
                    },
                )
                .map(|changed| Adjusted {
                    changed,
                    ..Adjusted::default()
                }),
            Adjust::Charge { units } => self.charge_now(take, units).map(|charged| Adjusted {
                changed: charged > 0,
                charged,
                ..Adjusted::default()
            }),
        })
    }

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, Usage> {
        StoreFuture::ready(self.usage_now(take))
    }

    fn tell(&self, news: News<'_>) {
        match news {
            News::Limits(limits) => self.set_limits(limits),
            News::Wake(wake) => lock(&self.wake.0).push(wake),
        }
    }

    /// With write-ahead on, a store whose last batch of records failed is failing: requests
    /// that need a record are refused until one lands.
    fn ping(&self) -> StoreFuture<'_, ()> {
        StoreFuture::ready(
            match self.write_ahead.as_ref().and_then(WriteAhead::failure) {
                Some(error) => Err(error),
                None => Ok(()),
            },
        )
    }
}

impl MemoryStore {
    /// The limits in force, as the limiter tells them (`News::Limits`).
    fn set_limits(&self, limits: &LimitTable) {
        if self.write_ahead.is_some() {
            *lock(&self.in_force) = Some(Arc::new(limits.clone()));
        }
        let gone: Vec<Box<str>> = {
            let mut budgets = lock(&self.budgets);
            let gone = budgets
                .limits
                .iter()
                .filter(|(name, (_, leases))| {
                    limits
                        .get(name)
                        .is_none_or(|limit| limit.policy().is_concurrency() != *leases)
                })
                .map(|(name, _)| name.clone())
                .collect();
            budgets.limits = limits
                .iter()
                .map(|limit| {
                    let known = (limit.keys_max(), limit.policy().is_concurrency());
                    (Box::from(limit.name()), known)
                })
                .collect();
            for (name, tally) in &budgets.tallies {
                let keys_max = self.keys_max_of(&budgets, name);
                tally.keys_max.store(keys_max, Ordering::Release);
            }
            gone
        };
        // With no lock held: lifting a key's pause takes its shard's lock.
        for limit in &gone {
            self.lift_all_pauses(limit);
        }
    }
}
