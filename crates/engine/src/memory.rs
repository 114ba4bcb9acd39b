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

use std::hash::{BuildHasher, Hash, Hasher};

use indexmap::map::RawEntryApiV1;
use indexmap::{Equivalent, IndexMap};
use smallvec::SmallVec;
use tollgate_core::{Around, Committed, Counter, GcraStep, Grant, Policy, Priority, gcra_admit};

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::{
    Adjust, Adjusted, Ask, CounterId, CounterOutcome, Decision, InProcess, News, Offers, Renewed,
    Store, StoreFuture, Take, Usage, WakeFn,
};
use std::sync::Arc;

use crate::ahead::{AHEAD_WAIT_MAX, Ahead, AheadBatch, Flight, List, ShardAhead};
use crate::hot::HotCounter;
use crate::limits::{Limit, LimitTable, check_key};
use crate::sync::{AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, OwnLine, lock};

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

/// A counter's id as one run of bytes, the limit's name then the key: one length and one
/// buffer for both keeps the map's entries small, and so more of them in cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedCounterId {
    bytes: SmallVec<[u8; ID_BYTES_INLINE]>,
    /// Bytes of the name (names are short: `LIMIT_NAME_BYTES_MAX`).
    limit_len: u32,
    keyed: bool,
}

impl OwnedCounterId {
    pub(crate) fn new(counter: CounterId<'_>) -> OwnedCounterId {
        let limit = counter.limit.as_bytes();
        let key = counter.key.map_or(&[][..], str::as_bytes);
        let mut bytes = SmallVec::with_capacity(limit.len() + key.len());
        bytes.extend_from_slice(limit);
        bytes.extend_from_slice(key);
        OwnedCounterId {
            bytes,
            limit_len: u32::try_from(limit.len()).unwrap_or(u32::MAX),
            keyed: counter.key.is_some(),
        }
    }

    /// The name's bytes and the key's (if the limit is counted per key).
    fn parts(&self) -> (&[u8], Option<&[u8]>) {
        let (limit, key) = self
            .bytes
            .split_at_checked(self.limit_len as usize)
            .unwrap_or((&self.bytes, &[]));
        (limit, self.keyed.then_some(key))
    }

    /// The name and the key as text (they were text when the id was made).
    pub(crate) fn texts(&self) -> (String, Option<String>) {
        let (limit, key) = self.parts();
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (text(limit), key.map(text))
    }
}

// Hashes exactly like `CounterId`, so the map can be searched with a borrowed id.
impl Hash for OwnedCounterId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (limit, key) = self.parts();
        CounterId::hash_bytes(limit, key, state);
    }
}

impl Equivalent<OwnedCounterId> for CounterId<'_> {
    #[inline]
    fn equivalent(&self, owned: &OwnedCounterId) -> bool {
        let (limit, key) = owned.parts();
        limit == self.limit.as_bytes() && key == self.key.map(str::as_bytes)
    }
}

#[derive(Debug)]
struct Entry {
    counter: Counter,
    /// From this instant the counter is idle and may be dropped (`Counter::idle_at`).
    idle_at: u64,
    /// The word handles decide this counter on without a lock, while one is published
    /// (`hot`): then it, not `counter`, holds the backlog's end. Every lookup under the lock
    /// seizes it first (`entry_index`, `with_existing`).
    hot: Option<Arc<HotCounter>>,
    /// The budget of the counter's limit, for a counter of a key: its place is given back there
    /// when the counter is dropped.
    tally: Option<Arc<KeyTally>>,
}

/// The keys one limit has tracked now, and how many it may (its budget).
#[derive(Debug)]
struct KeyTally {
    tracked: AtomicU64,
    keys_max: AtomicU64,
}

impl KeyTally {
    /// Take a place in the budget; `false` when it is full.
    fn claim(&self) -> bool {
        let before = self.tracked.fetch_add(1, Ordering::AcqRel);
        if before >= self.keys_max.load(Ordering::Acquire) {
            self.tracked.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn release(&self) {
        self.tracked.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Each limit's budget of keys, and the limits in force as last told (`News::Limits`).
#[derive(Debug, Default)]
struct Budgets {
    /// Every limit's tally, kept for the store's life (limit names are bounded by what is
    /// configured), so that every counter of a limit always shares one.
    tallies: std::collections::HashMap<Box<str>, Arc<KeyTally>>,
    /// The limits in force: their own `keys_max`, and whether they count leases (a limit that
    /// changes kind loses its pauses).
    limits: std::collections::HashMap<Box<str>, (Option<u64>, bool)>,
}

impl Entry {
    /// Make `counter` the truth: take back the backlog's end a handle may have moved.
    fn seize(&mut self) {
        if let Some(hot) = &self.hot
            && let Some(tat) = hot.seize(&mut self.counter)
        {
            // Handles' grants moved only the backlog's end, so that is all `idle_at` misses.
            self.idle_at = self.idle_at.max(tat);
        }
    }

    /// A grant nobody will refund, decided on the GCRA backlog alone (`gcra_admit`) when the
    /// counter needs nothing else, as its hot word would decide it. `None` changed nothing.
    fn grant_backlog_alone(
        &mut self,
        policy: &Policy,
        now: u64,
        cost: u64,
        priority: Priority,
    ) -> Option<GcraStep> {
        let tat = self.counter.gcra_alone(policy, now)?;
        let step = gcra_admit(tat, policy, now, cost, priority)?;
        self.counter.set_gcra_tat(step.tat);
        self.idle_at = self.idle_at.max(step.tat);
        Some(step)
    }

    /// After a decision on this counter alone, under the lock hold that seized it: let
    /// handles decide on it by themselves again, if it allows and no limit-wide pause is on
    /// (one that starts later stops the handles through the end they read).
    fn publish(&self, policy: &Policy, now: u64, limit_pause_until: u64) {
        if let Some(hot) = &self.hot
            && limit_pause_until <= now
        {
            hot.publish(&self.counter, policy, now);
        }
    }

    /// Whether the counter may be dropped at `now`. Never while a handle holds its hot word
    /// (the handle would go on deciding on a counter the store no longer has); once none
    /// does, none can take it again without the shard's lock, so the word is seized for good.
    fn idle(&mut self, now: u64) -> bool {
        if let Some(hot) = &self.hot {
            if Arc::strong_count(hot) > 1 {
                return false;
            }
            self.seize();
            self.hot = None;
        }
        self.idle_at <= now
    }
}

/// Whether making a counter at the cap may sweep its shard for a place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Room {
    Sweep,
    Keep,
}

/// Where a counter lives: its shard, and its hash in that shard's map.
#[derive(Clone, Copy, Debug)]
struct Located {
    shard: usize,
    hash: u64,
}

/// One request, as asked of one counter.
#[derive(Clone, Copy, Debug)]
struct Asked {
    now: u64,
    cost: u64,
    priority: Priority,
}

/// The error for a cost that `take`'s limit can never grant.
fn cost_error(take: Take<'_>) -> impl FnOnce(tollgate_core::CostError) -> Error + '_ {
    move |source| Error::Cost {
        limit: take.counter.limit.to_owned(),
        source,
    }
}

/// `takes` under the policies of `table` (the limits in force, when the store was told them).
/// A limit the table does not name keeps the policy it was asked under: the store also
/// decides for callers with limits of their own (Envoy's service asks it directly), and a
/// limit removed meanwhile is at worst decided once more as it was.
fn in_force_now<'t>(
    table: Option<&'t LimitTable>,
    takes: &[Take<'t>],
) -> SmallVec<[Take<'t>; COUNTERS_PER_REQUEST_MAX]> {
    takes
        .iter()
        .map(
            |take| match table.and_then(|table| table.get(take.counter.limit)) {
                Some(limit) => Take {
                    counter: take.counter,
                    policy: limit.policy(),
                },
                None => *take,
            },
        )
        .collect()
}

/// Check one counter of a request, with what the store knows `around` it (the core decides).
/// `granted_next` says the request is granted right after if this allows it, so the grant will
/// report what remains and working it out here would be wasted.
fn check_entry(
    entry: &mut Entry,
    take: Take<'_>,
    asked: Asked,
    around: Around,
    granted_next: bool,
) -> Result<CounterOutcome> {
    let Asked {
        now,
        cost,
        priority,
    } = asked;
    let check = entry
        .counter
        .check_around(take.policy, now, cost, priority, around)
        .map_err(cost_error(take))?;
    Ok(match check {
        Some(denial) => CounterOutcome::Denied(denial),
        None => {
            let remaining = if granted_next {
                0
            } else {
                entry.counter.status(take.policy, now, priority).0
            };
            CounterOutcome::Allowed { remaining }
        }
    })
}

/// Grant on one counter that `check_entry` allowed under the same lock and `now`.
fn grant_entry(
    entry: &mut Entry,
    take: Take<'_>,
    asked: Asked,
    refundable: bool,
) -> CounterOutcome {
    let Asked {
        now,
        cost,
        priority,
    } = asked;
    let grant = entry
        .counter
        .grant(take.policy, now, cost, priority, refundable);
    entry.idle_at = entry.counter.idle_at(take.policy);
    CounterOutcome::Granted(grant)
}

#[derive(Debug)]
struct Shard {
    /// Hashed with the store's own `hasher`, so a counter's hash is worked out once per
    /// operation: it picks the shard and finds the entry.
    counters: IndexMap<OwnedCounterId, Entry, foldhash::fast::RandomState>,
    cursor: usize,
    /// Counters to examine for idleness at the end of this operation: every new counter adds
    /// `SWEEP_PER_INSERT`, so the map cannot outgrow its live counters, and a decision on a
    /// counter already tracked examines none (the examination's cache misses are most of a
    /// sweep's cost, and most decisions find their counter).
    sweep_owed: usize,
    /// With write-ahead on: each counter's spending since its record, and the counters due
    /// for one (`ahead.rs`).
    ahead: Option<ShardAhead>,
}

impl Shard {
    /// Where `counter` is in this shard's map, if it is tracked; `hash` is its hash by the
    /// store's hasher (`MemoryStore::locate`).
    #[inline]
    fn find(&self, counter: CounterId<'_>, hash: u64) -> Option<usize> {
        self.counters
            .raw_entry_v1()
            .index_from_hash(hash, |owned| counter.equivalent(owned))
    }

    /// Examine up to `budget` counters from the cursor; drop the idle ones. Returns how many.
    fn sweep(&mut self, now: u64, budget: usize) -> usize {
        let mut dropped = 0;
        for _ in 0..budget {
            if self.counters.is_empty() {
                break;
            }
            if self.cursor >= self.counters.len() {
                self.cursor = 0;
            }
            // A counter a request waits to grant on stays, idle or not: its record is due.
            let idle = self
                .counters
                .get_index_mut(self.cursor)
                .is_some_and(|(_, entry)| entry.idle(now))
                && !self
                    .ahead
                    .as_ref()
                    .is_some_and(|ahead| ahead.waited_on(self.cursor));
            if idle {
                // The last counter moves into the cursor's place and is examined next.
                if let Some((id, entry)) = self.counters.swap_remove_index(self.cursor) {
                    if let Some(tally) = entry.tally {
                        tally.release();
                    }
                    if let Some(ahead) = &mut self.ahead {
                        ahead.removed(self.cursor, id);
                    }
                }
                dropped += 1;
            } else {
                self.cursor += 1;
            }
        }
        if dropped > 0 {
            self.shrink_if_sparse();
        }
        dropped
    }

    /// Give memory back once the shard is mostly empty: below a quarter of its capacity the
    /// map shrinks to twice its length, which leaves room to grow again and makes a shrink
    /// cost at most what the removals before it did. A map keeps its capacity otherwise, so
    /// without this a burst of keys would hold its peak memory for good.
    fn shrink_if_sparse(&mut self) {
        let capacity = self.counters.capacity();
        if capacity > SHRINK_ABOVE_CAPACITY && self.counters.len() < capacity / 4 {
            self.counters.shrink_to(self.counters.len() * 2);
        }
    }
}

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

/// One counter as `MemoryStore::snapshot` saw it, or a record of write-ahead
/// (`AheadBatch`): its limit, its key, and its state in the core's words
/// (`Counter::to_words`), times on the store's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedCounter {
    pub limit: String,
    pub key: Option<String>,
    pub state: Vec<u64>,
    /// Units the store may have granted on the counter past `state`: its write-ahead budget
    /// (`ahead.rs`); 0 in a snapshot, taken once nothing decides any more. `restore` charges
    /// them (`Counter::charge`).
    pub budget: u64,
}

/// Everything a memory store counts, to be put back by `MemoryStore::restore` in a later
/// process whose clock reads the same time (the server's clock reads wall time).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemorySnapshot {
    pub counters: Vec<SavedCounter>,
    /// Limit-wide pauses: the limit and when its pause ends.
    pub pauses: Vec<(String, u64)>,
    /// The store's clock when the snapshot was taken.
    pub taken_at_us: u64,
}

/// What `MemoryStore::restore` did with a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Counters put back.
    pub counters: usize,
    /// Counters left out because their limit is no longer in force, or they no longer count.
    pub dropped: usize,
    /// Limits whose counters could not all be put back (a state that cannot be read, or the
    /// key cap): they are held instead, as after a crash.
    pub held: Vec<String>,
}

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
    ahead: Option<Ahead>,
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
        MemoryStore::with_ahead(config, clock, false)
    }

    /// A store that grants on a rate counter only within a budget recorded ahead in a state
    /// database (`ahead.rs`): whoever keeps that database drains `ahead_batch`, writes each
    /// batch, and reports `ahead_landed` or `ahead_failed`. A request that needs a record
    /// waits for one (its answer is pending until then); the lock-free paths of `LimitHandle`
    /// step aside. After a crash, `restore` of the last records charges each its budget.
    pub fn with_write_ahead(config: MemoryStoreConfig, clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore::with_ahead(config, clock, true)
    }

    fn with_ahead(config: MemoryStoreConfig, clock: Arc<dyn Clock>, ahead: bool) -> MemoryStore {
        let hasher = foldhash::fast::RandomState::default();
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| {
                    OwnLine(Mutex::new(Shard {
                        counters: IndexMap::with_hasher(hasher.clone()),
                        cursor: 0,
                        sweep_owed: 0,
                        ahead: ahead.then(ShardAhead::default),
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
            ahead: ahead.then(Ahead::new),
        }
    }

    /// The shard of `counter` and its hash in the shard's map.
    fn locate(&self, counter: CounterId<'_>) -> Located {
        let hash = self.hasher.hash_one(counter);
        Located {
            shard: MemoryStore::shard_of(counter, hash),
            hash,
        }
    }

    /// Bits of the hash the map does not use: hashbrown places entries by the low bits and tags
    /// them with the top seven, so a shard chosen by either would crowd its map's buckets.
    #[cfg(not(tollgate_loom))]
    fn shard_of(_counter: CounterId<'_>, hash: u64) -> usize {
        (hash >> 40) as usize % SHARDS
    }

    /// Under loom the shard must not depend on a random seed (every execution must be the same):
    /// the last bytes of limit and key pick it, so tests choose which counters share a shard.
    #[cfg(tollgate_loom)]
    fn shard_of(counter: CounterId<'_>, _hash: u64) -> usize {
        let last = |text: &str| usize::from(text.as_bytes().last().copied().unwrap_or(0));
        (last(counter.limit) + counter.key.map_or(0, last)) % SHARDS
    }

    fn fresh_counter(&self, counter: CounterId<'_>, now: u64) -> Counter {
        match self.hold_end(counter.limit, now) {
            Some(end) => Counter::recovering(now, end),
            None => Counter::new(now),
        }
    }

    /// When the hold on `limit` ends, while it is held.
    fn hold_end(&self, limit: &str, now: u64) -> Option<u64> {
        if self.hold_ends.load(Ordering::Acquire) <= now {
            return None;
        }
        lock(&self.hold)
            .get(limit)
            .copied()
            .filter(|&end| now < end)
    }

    /// What this store knows of `limit` beyond a counter at `now` (`tollgate_core::Around`).
    fn around(&self, limit: &str, now: u64) -> Around {
        Around {
            limit_paused_until: self.limit_paused_until(limit, now),
            held_until: self.hold_end(limit, now),
        }
    }

    /// Hold back `limits`: a counter made for one of them grants nothing until one period (or
    /// lease TTL) of its policy after `since_us` on this store's clock. For a process that lost
    /// what a previous run of it counted (a crash): `since_us` is when that run was last known
    /// to be granting, and `limits` the ones it may have granted on. A limit not named (one
    /// created since) is not held. Adds to any earlier hold.
    pub fn hold<'l>(&self, since_us: u64, limits: impl IntoIterator<Item = &'l Limit>) {
        self.hold_policies(
            since_us,
            limits
                .into_iter()
                .map(|limit| (limit.name(), limit.policy())),
        );
    }

    /// `hold`, by name and policy.
    fn hold_policies<'l>(
        &self,
        since_us: u64,
        limits: impl IntoIterator<Item = (&'l str, &'l Policy)>,
    ) {
        let mut hold = lock(&self.hold);
        for (name, policy) in limits {
            let end = since_us.saturating_add(policy.memory_us());
            let held = hold.entry(name.into()).or_default();
            *held = (*held).max(end);
            self.hold_ends.fetch_max(end, Ordering::AcqRel);
        }
    }

    /// Everything this store counts, for `restore` in a later process. Taken shard by shard:
    /// for an exact copy, take it once nothing decides any more (the server does so after its
    /// last request).
    pub fn snapshot(&self) -> MemorySnapshot {
        let now = self.clock.now_us();
        let mut counters = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            for (id, entry) in shard.counters.iter_mut() {
                entry.seize();
                if entry.idle_at <= now {
                    continue;
                }
                let (limit, key) = id.parts();
                let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
                counters.push(SavedCounter {
                    limit: text(limit),
                    key: key.map(text),
                    state: entry.counter.to_words(),
                    budget: 0,
                });
            }
        }
        let pauses = self.limit_pauses(now);
        MemorySnapshot {
            counters,
            pauses,
            taken_at_us: now,
        }
    }

    /// Put back what `snapshot` saw, for the limits `policy_of` knows (others are gone, and
    /// their counters with them). Meant for a store that has decided nothing yet. Each
    /// counter is charged its `budget` now (`Counter::charge`): what a crashed process may
    /// have granted past its last record. A counter that cannot be put back (its state cannot
    /// be read, or the key cap is reached) gets its limit held from the snapshot's time
    /// instead, so nothing it counted is granted again; `Restored::held` names those limits.
    /// With write-ahead on, every counter put back is due for a record of its own, and may
    /// spend only what its record's budget leaves past the charge.
    pub fn restore(
        &self,
        snapshot: &MemorySnapshot,
        policy_of: impl Fn(&str) -> Option<Policy>,
    ) -> Restored {
        let now = self.clock.now_us();
        let mut restored = Restored::default();
        let mut held = std::collections::BTreeMap::new();
        for saved in &snapshot.counters {
            let Some(policy) = policy_of(&saved.limit) else {
                restored.dropped += 1;
                continue;
            };
            let mut counter = match Counter::from_words(&saved.state) {
                Ok(counter) => counter,
                Err(_) => {
                    held.insert(saved.limit.clone(), policy);
                    continue;
                }
            };
            let charged = counter.charge(&policy, now, saved.budget);
            let idle_at = counter.idle_at(&policy);
            if idle_at <= now {
                restored.dropped += 1;
                continue;
            }
            let id = CounterId {
                limit: &saved.limit,
                key: saved.key.as_deref(),
            };
            let located = self.locate(id);
            let mut shard = lock(&self.shards[located.shard]);
            let index = match shard.find(id, located.hash) {
                Some(index) => {
                    let entry = &mut shard.counters[index];
                    entry.counter = counter;
                    entry.idle_at = idle_at;
                    index
                }
                // The same budgets as a counter made by a decision: a key past its limit's
                // budget (or the store's cap) holds its limit instead.
                None => match self.claim_places(id) {
                    Ok(tally) => {
                        let entry = Entry {
                            counter,
                            idle_at,
                            hot: None,
                            tally,
                        };
                        let (index, _) = shard.counters.insert_full(OwnedCounterId::new(id), entry);
                        if let Some(ahead) = &mut shard.ahead {
                            ahead.pushed();
                        }
                        index
                    }
                    Err(_) => {
                        held.insert(saved.limit.clone(), policy);
                        continue;
                    }
                },
            };
            if let Some(ahead) = &mut shard.ahead {
                ahead.restored(
                    index,
                    OwnedCounterId::new(id),
                    &policy,
                    charged,
                    saved.budget,
                );
            }
            restored.counters += 1;
        }
        let mut pauses = lock(&self.pauses);
        for (limit, until) in &snapshot.pauses {
            if *until > now && policy_of(limit).is_some() {
                pauses.retain(|(name, _)| &**name != limit);
                pauses.push((limit.as_str().into(), *until));
                self.limit_pauses_end.fetch_max(*until, Ordering::AcqRel);
            }
        }
        drop(pauses);
        self.hold_policies(
            snapshot.taken_at_us,
            held.iter().map(|(name, policy)| (name.as_str(), policy)),
        );
        restored.held = held.into_keys().collect();
        restored
    }

    /// The entry for `counter`, created if absent (subject to the cap).
    fn entry<'s>(
        &self,
        shard: &'s mut Shard,
        counter: CounterId<'_>,
        hash: u64,
        now: u64,
    ) -> Result<&'s mut Entry> {
        let index = self.entry_index(shard, counter, hash, now, Room::Sweep)?;
        Ok(&mut shard.counters[index])
    }

    /// Where the entry for `counter` is in `shard`, created if absent (subject to the cap).
    /// At the cap, `Room::Sweep` lets it sweep the shard for a place, which moves and may drop
    /// other entries; a request that already holds entries of this shard asks with
    /// `Room::Keep` (its own new counters are idle until granted, and a sweep would drop
    /// them), and makes room from outside its locks instead (`acquire_now`).
    fn entry_index(
        &self,
        shard: &mut Shard,
        counter: CounterId<'_>,
        hash: u64,
        now: u64,
        room: Room,
    ) -> Result<usize> {
        if let Some(index) = shard.find(counter, hash) {
            shard.counters[index].seize();
            return Ok(index);
        }
        self.insert_entry(shard, counter, now, room)
    }

    /// `entry_index` for a counter not tracked yet: out of line, so the common case (found)
    /// stays a short function.
    #[inline(never)]
    fn insert_entry(
        &self,
        shard: &mut Shard,
        counter: CounterId<'_>,
        now: u64,
        room: Room,
    ) -> Result<usize> {
        // Every counter is made here: a key is checked once, before its counter exists, and an
        // equal key found later is as valid.
        if let Some(key) = counter.key
            && let Err(reason) = check_key(key)
        {
            return Err(Error::invalid("key", reason));
        }
        // Claim a place before inserting, so that two shards inserting at once cannot both
        // take the last one.
        let tally = match self.claim_places(counter) {
            Ok(tally) => tally,
            Err(_) if room == Room::Sweep => {
                self.sweep_shard(shard, now, SWEEP_BEFORE_REFUSING / SHARDS);
                self.claim_places(counter)?
            }
            Err(refused) => return Err(refused),
        };
        let counter_state = self.fresh_counter(counter, now);
        let owned = OwnedCounterId::new(counter);
        shard.sweep_owed += SWEEP_PER_INSERT;
        let (index, _) = shard.counters.insert_full(
            owned,
            Entry {
                idle_at: now,
                counter: counter_state,
                hot: None,
                tally,
            },
        );
        if let Some(ahead) = &mut shard.ahead {
            ahead.pushed();
        }
        Ok(index)
    }

    /// The places a new counter takes: for a key, one in its limit's budget (returned, to be
    /// given back when the counter is dropped) and one under the store-wide cap; a limit's
    /// one counter is never refused (there is one per limit configured).
    fn claim_places(&self, counter: CounterId<'_>) -> Result<Option<Arc<KeyTally>>> {
        if counter.key.is_none() {
            self.tracked.fetch_add(1, Ordering::AcqRel);
            return Ok(None);
        }
        let tally = self.tally(counter.limit);
        if !tally.claim() {
            return Err(Error::TooManyKeysForLimit {
                limit: counter.limit.to_owned(),
                keys_max: tally.keys_max.load(Ordering::Acquire),
            });
        }
        let before = self.tracked.fetch_add(1, Ordering::AcqRel);
        if before as u64 >= self.keys_tracked_max {
            self.tracked.fetch_sub(1, Ordering::AcqRel);
            tally.release();
            return Err(Error::TooManyKeys {
                keys_tracked_max: self.keys_tracked_max,
            });
        }
        Ok(Some(tally))
    }

    /// `limit`'s budget of keys, made on its first key.
    fn tally(&self, limit: &str) -> Arc<KeyTally> {
        let mut budgets = lock(&self.budgets);
        if let Some(tally) = budgets.tallies.get(limit) {
            return Arc::clone(tally);
        }
        let keys_max = self.keys_max_of(&budgets, limit);
        let tally = Arc::new(KeyTally {
            tracked: AtomicU64::new(0),
            keys_max: AtomicU64::new(keys_max),
        });
        budgets.tallies.insert(limit.into(), Arc::clone(&tally));
        tally
    }

    /// The budget of `limit`: its own, or the store's.
    fn keys_max_of(&self, budgets: &Budgets, limit: &str) -> u64 {
        budgets
            .limits
            .get(limit)
            .and_then(|(keys_max, _)| *keys_max)
            .unwrap_or(self.keys_per_limit_max)
    }

    /// Keys of `limit` tracked now (for tests and operators).
    pub fn keys_of(&self, limit: &str) -> u64 {
        lock(&self.budgets)
            .tallies
            .get(limit)
            .map_or(0, |tally| tally.tracked.load(Ordering::Acquire))
    }

    /// Lift every pause of `limit`: the limit-wide one and each key's. For a limit that is gone
    /// or changed kind; examines every counter, so it is for such rare changes only.
    fn lift_all_pauses(&self, limit: &str) {
        self.lift_limit_pause(limit);
        let now = self.clock.now_us();
        let hold_until = self.hold_end(limit, now).unwrap_or(0);
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            for (id, entry) in shard.counters.iter_mut() {
                if id.parts().0 == limit.as_bytes() {
                    entry.seize();
                    // Its `idle_at` stays: later than need be at worst, until a decision on it.
                    entry.counter.resume(now, hold_until);
                }
            }
        }
    }

    /// Lift `limit`'s limit-wide pause; returns whether one was on.
    fn lift_limit_pause(&self, limit: &str) -> bool {
        let now = self.clock.now_us();
        let mut pauses = lock(&self.pauses);
        let lifted = pauses
            .iter()
            .any(|(name, until)| &**name == limit && *until > now);
        pauses.retain(|(name, until)| &**name != limit && *until > now);
        // Every writer of the end holds this lock: lowering it to the latest pause still on
        // lets hot words decide again.
        let end = pauses.iter().map(|(_, until)| *until).max().unwrap_or(0);
        self.limit_pauses_end.store(end, Ordering::Release);
        drop(pauses);
        if lifted && let Some(ahead) = &self.ahead {
            ahead.pauses_changed();
        }
        lifted
    }

    fn resume_now(&self, take: Take<'_>) -> Result<bool> {
        match take.counter.key {
            None => Ok(self.lift_limit_pause(take.counter.limit)),
            Some(_) => self.with_existing(
                take,
                || Ok(false),
                |counter, now| {
                    let hold_until = self.hold_end(take.counter.limit, now).unwrap_or(0);
                    Ok(counter.resume(now, hold_until))
                },
            ),
        }
    }

    /// The end of the limit-wide pause of `limit`, or 0. Looked up only while some pause of
    /// any limit may still be on at `now`.
    #[inline]
    fn limit_paused_until(&self, limit: &str, now: u64) -> u64 {
        if self.limit_pauses_end.load(Ordering::Acquire) <= now {
            return 0;
        }
        self.limit_pause_of(limit)
    }

    fn limit_pause_of(&self, limit: &str) -> u64 {
        lock(&self.pauses)
            .iter()
            .find(|(name, _)| &**name == limit)
            .map_or(0, |(_, until)| *until)
    }

    /// The examinations this operation's new counters owe (see `SWEEP_PER_INSERT`), once the
    /// operation is done with the indices it holds: a sweep moves counters.
    #[inline]
    fn sweep_after(&self, shard: &mut Shard, now: u64) {
        if shard.sweep_owed == 0 {
            return;
        }
        let budget = std::mem::take(&mut shard.sweep_owed);
        self.sweep_shard(shard, now, budget);
    }

    /// `Shard::sweep`, with the dropped counters' places given back to the cap.
    fn sweep_shard(&self, shard: &mut Shard, now: u64, budget: usize) {
        let dropped = shard.sweep(now, budget);
        if dropped > 0 {
            self.tracked.fetch_sub(dropped, Ordering::AcqRel);
        }
    }

    /// Drop idle counters, examining at most `budget_per_shard` in each shard. For a background
    /// task: memory comes back even when no traffic touches a shard. Returns how many it dropped.
    pub fn sweep(&self, budget_per_shard: usize) -> usize {
        let now = self.clock.now_us();
        let mut dropped = 0;
        for shard in self.shards.iter() {
            dropped += lock(shard).sweep(now, budget_per_shard);
        }
        self.tracked.fetch_sub(dropped, Ordering::Relaxed);
        dropped
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

    /// The decision on every take: all granted or none, under the locks of their shards.
    pub(crate) fn acquire_now(
        &self,
        takes: &[Take<'_>],
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> Result<Decision> {
        decided(self.attempt(takes, cost, priority, refundable))
    }

    /// `acquire_now`, or `None` (only with write-ahead on): the request fits, but a counter
    /// needs a record of its budget first; nothing was granted, and the record is asked for.
    fn attempt(
        &self,
        takes: &[Take<'_>],
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> Result<Option<Decision>> {
        match self.acquire_locked(takes, cost, priority, refundable) {
            Err(Error::TooManyKeys { .. } | Error::TooManyKeysForLimit { .. }) => {
                // The key's own shard had no idle counter to give up; look in all of them, with
                // no lock held (taking more locks while holding some could deadlock), once.
                self.sweep(SWEEP_BEFORE_REFUSING / SHARDS);
                self.acquire_locked(takes, cost, priority, refundable)
            }
            other => other,
        }
    }

    fn acquire_locked(
        &self,
        takes: &[Take<'_>],
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> Result<Option<Decision>> {
        if takes.len() > COUNTERS_PER_REQUEST_MAX {
            return Err(Error::invalid(
                "limits",
                format!("at most {COUNTERS_PER_REQUEST_MAX} limits per request"),
            ));
        }
        if let [take] = takes {
            return self.acquire_one(*take, cost, priority, refundable);
        }
        let count = takes.len();
        let mut located = [Located { shard: 0, hash: 0 }; COUNTERS_PER_REQUEST_MAX];
        for (slot, take) in located.iter_mut().zip(takes) {
            *slot = self.locate(take.counter);
        }
        // Shards are locked in ascending order, each once (two requests can then never wait
        // on each other); each take remembers which of the guards is its shard's.
        let mut in_shard_order: [usize; COUNTERS_PER_REQUEST_MAX] = std::array::from_fn(|i| i);
        in_shard_order[..count].sort_unstable_by_key(|&position| located[position].shard);
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; COUNTERS_PER_REQUEST_MAX]> =
            SmallVec::new();
        let mut guard_of_take = [0usize; COUNTERS_PER_REQUEST_MAX];
        let mut locked_shard = None;
        for &position in &in_shard_order[..count] {
            let shard = located[position].shard;
            if locked_shard != Some(shard) {
                guards.push(lock(&self.shards[shard]));
                locked_shard = Some(shard);
            }
            guard_of_take[position] = guards.len() - 1;
        }
        let now = self.clock.now_us();
        let asked = Asked {
            now,
            cost,
            priority,
        };

        let mut outcomes: SmallVec<[CounterOutcome; 1]> = SmallVec::with_capacity(count);
        let mut all_allowed = true;
        let mut index_of_take = [0usize; COUNTERS_PER_REQUEST_MAX];
        for (position, take) in takes.iter().enumerate() {
            let around = self.around(take.counter.limit, now);
            let shard = &mut guards[guard_of_take[position]];
            let hash = located[position].hash;
            // At the cap, no sweep of a shard this request holds: its own new counters are
            // idle until granted.
            let index = self.entry_index(shard, take.counter, hash, now, Room::Keep)?;
            index_of_take[position] = index;
            let entry = &mut shard.counters[index];
            // The last counter, when every one allows the request, is granted next, and the
            // grant reports what remains.
            let granted_next = all_allowed && position + 1 == count;
            let outcome = check_entry(entry, *take, asked, around, granted_next)?;
            all_allowed &= matches!(outcome, CounterOutcome::Allowed { .. });
            outcomes.push(outcome);
        }
        if all_allowed && self.ahead.is_some() {
            // Every counter short of budget asks for its record, so that one batch serves them.
            let mut short = false;
            for (position, take) in takes.iter().enumerate() {
                let shard = &mut guards[guard_of_take[position]];
                if let Some(ahead) = &mut shard.ahead
                    && !take.policy.is_concurrency()
                {
                    let id = || OwnedCounterId::new(take.counter);
                    short |= !ahead.allows(index_of_take[position], id, take.policy, cost);
                }
            }
            if short {
                self.wake_writer();
                for guard in guards.iter_mut() {
                    self.sweep_after(guard, now);
                }
                return Ok(None);
            }
        }
        if all_allowed {
            let mut due = false;
            for (position, (take, outcome)) in takes.iter().zip(&mut outcomes).enumerate() {
                let shard = &mut guards[guard_of_take[position]];
                // The index the check found still holds its counter: under `Room::Keep`
                // nothing is swept or moved while the locks are held.
                let index = index_of_take[position];
                let entry = &mut shard.counters[index];
                *outcome = grant_entry(entry, *take, asked, refundable);
                if let Some(ahead) = &mut shard.ahead
                    && !take.policy.is_concurrency()
                {
                    let id = || OwnedCounterId::new(take.counter);
                    due |= ahead.spent(index, id, take.policy, cost);
                }
            }
            if due {
                self.wake_writer();
            }
        }
        for guard in guards.iter_mut() {
            self.sweep_after(guard, now);
        }
        Ok(Some(Decision::from_outcomes(now, outcomes)))
    }

    /// `acquire_locked` for one counter: one shard, nothing to order. A decision on a counter
    /// alone hands its hot word, if it has one, back to its handles.
    fn acquire_one(
        &self,
        take: Take<'_>,
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> Result<Option<Decision>> {
        let located = self.locate(take.counter);
        let mut guard = lock(&self.shards[located.shard]);
        let shard = &mut *guard;
        let now = self.clock.now_us();
        let asked = Asked {
            now,
            cost,
            priority,
        };
        let limit_pause_until = self.limit_paused_until(take.counter.limit, now);
        let index = self.entry_index(shard, take.counter, located.hash, now, Room::Sweep)?;
        let entry = &mut shard.counters[index];
        // A grant nobody will refund on a counter that needs nothing but its GCRA backlog is
        // decided as its hot word would decide it (with write-ahead on, the general way spends
        // the budget).
        let admitted = (!refundable && limit_pause_until <= now && shard.ahead.is_none())
            .then(|| entry.grant_backlog_alone(take.policy, now, cost, priority))
            .flatten();
        let outcome = match admitted {
            Some(step) => {
                CounterOutcome::Granted(Grant {
                    // Nothing to commit: no number is handed out.
                    seq: 0,
                    remaining: step.remaining,
                    reset_after_us: step.reset_after_us,
                    lease_expires_at: None,
                })
            }
            None => {
                let around = Around {
                    limit_paused_until: limit_pause_until,
                    held_until: self.hold_end(take.counter.limit, now),
                };
                match check_entry(entry, take, asked, around, true)? {
                    CounterOutcome::Allowed { .. } => match &mut shard.ahead {
                        Some(ahead) if !take.policy.is_concurrency() => {
                            let id = || OwnedCounterId::new(take.counter);
                            if !ahead.allows(index, id, take.policy, cost) {
                                self.wake_writer();
                                self.sweep_after(shard, now);
                                return Ok(None);
                            }
                            let granted = grant_entry(entry, take, asked, refundable);
                            if ahead.spent(index, id, take.policy, cost) {
                                self.wake_writer();
                            }
                            granted
                        }
                        _ => grant_entry(entry, take, asked, refundable),
                    },
                    refused => refused,
                }
            }
        };
        entry.publish(take.policy, now, limit_pause_until);
        self.sweep_after(shard, now);
        let mut outcomes = SmallVec::new();
        outcomes.push(outcome);
        Ok(Some(Decision::from_outcomes(now, outcomes)))
    }

    /// The decision on a request that needs a record first: tried again after each batch
    /// settles, until it is decided, the state database fails, or `AHEAD_WAIT_MAX` passes.
    async fn acquire_after_record(
        &self,
        takes: &[Take<'_>],
        cost: u64,
        priority: Priority,
        refundable: bool,
        mut seen: u64,
    ) -> Result<Decision> {
        let Some(ahead) = &self.ahead else {
            return self.acquire_now(takes, cost, priority, refundable);
        };
        let deadline = tokio::time::Instant::now() + AHEAD_WAIT_MAX;
        loop {
            ahead.wait_after(seen, deadline).await?;
            seen = ahead.batches();
            // The limits may have changed while it waited (an administrator, a vendor's
            // lesson): a lowered limit must not grant under its old policy for this long.
            let table = lock(&self.in_force).clone();
            let takes = in_force_now(table.as_deref(), takes);
            if let Some(decision) = self.attempt(&takes, cost, priority, refundable)? {
                return Ok(decision);
            }
            if let Some(error) = ahead.failure() {
                return Err(error);
            }
        }
    }

    fn wake_writer(&self) {
        if let Some(ahead) = &self.ahead {
            ahead.wake_writer();
        }
    }

    /// Wait until some counter is due for a record (with write-ahead on; never otherwise).
    pub async fn ahead_due(&self) {
        match &self.ahead {
            Some(ahead) => ahead.work().await,
            None => std::future::pending().await,
        }
    }

    /// The next records to write ahead, at most `rows_max` counters (those a request waits
    /// on first), or `None` when nothing is due, write-ahead is off, or a batch is still out:
    /// one batch at a time, each settled by `ahead_landed` or `ahead_failed` before the next.
    pub fn ahead_batch(&self, rows_max: usize) -> Option<AheadBatch> {
        let ahead = self.ahead.as_ref()?;
        if !ahead.begin_batch() {
            return None;
        }
        let mut batch = AheadBatch::default();
        for list in [List::Urgent, List::Due] {
            for (shard_index, shard) in self.shards.iter().enumerate() {
                let room = rows_max.saturating_sub(batch.counters.len());
                if room == 0 && list == List::Due {
                    break;
                }
                let mut guard = lock(shard);
                let Shard {
                    counters,
                    ahead: Some(shard_ahead),
                    ..
                } = &mut *guard
                else {
                    continue;
                };
                // With write-ahead on, no handle holds a counter's word: the counter is the
                // truth.
                shard_ahead.take(list, room, shard_index, &mut batch, |id| {
                    let index = counters.get_index_of(id)?;
                    let (limit, key) = id.texts();
                    let state = counters[index].counter.to_words();
                    Some((
                        index,
                        SavedCounter {
                            limit,
                            key,
                            state,
                            budget: 0,
                        },
                    ))
                });
            }
        }
        if ahead.take_pauses_changed() {
            let now = self.clock.now_us();
            batch.pauses = Some(self.limit_pauses(now));
        }
        if batch.is_empty() {
            ahead.abandon_batch();
            return None;
        }
        Some(batch)
    }

    /// The state database committed `batch`: its budgets may be spent.
    pub fn ahead_landed(&self, batch: AheadBatch) {
        self.settle_ahead(batch, None);
    }

    /// The state database did not take `batch` (`reason`): its counters are due again, and
    /// requests that wait for one of them fail with `StoreFailed` naming the reason.
    pub fn ahead_failed(&self, batch: AheadBatch, reason: &str) {
        self.settle_ahead(batch, Some(reason));
    }

    fn settle_ahead(&self, batch: AheadBatch, failure: Option<&str>) {
        let Some(ahead) = &self.ahead else {
            return;
        };
        for Flight { shard, id } in batch.flights {
            let mut guard = lock(&self.shards[shard]);
            let Shard {
                counters,
                ahead: Some(shard_ahead),
                ..
            } = &mut *guard
            else {
                continue;
            };
            if let Some(index) = counters.get_index_of(&id) {
                shard_ahead.settled(index, id, failure.is_none());
            }
        }
        if failure.is_some() && batch.pauses.is_some() {
            ahead.pauses_changed();
        }
        ahead.settle(failure);
    }

    /// No batch will be written any more (`reason`): requests waiting for a record fail, and
    /// so does every later request that needs one. Counters within their budget still grant.
    pub fn ahead_close(&self, reason: &str) {
        if let Some(ahead) = &self.ahead {
            ahead.close(reason);
        }
    }

    /// The limit-wide pauses still on at `now`.
    fn limit_pauses(&self, now: u64) -> Vec<(String, u64)> {
        lock(&self.pauses)
            .iter()
            .filter(|(_, until)| *until > now)
            .map(|(name, until)| (name.to_string(), *until))
            .collect()
    }

    /// A keyed `LimitHandle`'s grant nobody will refund on a counter this store tracks, when
    /// its GCRA backlog alone decides it (`Entry::grant_backlog_alone`) and no limit-wide pause
    /// is on. The counter is found, never made, so its key was checked when it was made. `None`
    /// counted nothing: the handle asks the usual way, which decides and explains.
    pub(crate) fn grant_tracked(
        &self,
        take: Take<'_>,
        cost: u64,
        priority: Priority,
    ) -> Option<GcraStep> {
        // With write-ahead on, every grant spends a budget: the general way.
        if self.ahead.is_some() {
            return None;
        }
        let located = self.locate(take.counter);
        let mut shard = lock(&self.shards[located.shard]);
        let now = self.clock.now_us();
        if self.limit_pauses_end.load(Ordering::Acquire) > now {
            return None;
        }
        let index = shard.find(take.counter, located.hash)?;
        let entry = &mut shard.counters[index];
        entry.seize();
        let step = entry.grant_backlog_alone(take.policy, now, cost, priority);
        entry.publish(take.policy, now, 0);
        step
    }

    /// A word through which a `LimitHandle` decides on `take`'s counter without the shard's
    /// lock (`HotCounter`), for a GCRA limit; the counter is made if it is not tracked yet, and
    /// kept for as long as a handle holds its word. `None`: the handle asks the store.
    pub(crate) fn hot_counter(&self, take: Take<'_>) -> Option<Arc<HotCounter>> {
        // A word decides without the store, so without spending a budget: not with write-ahead.
        if !take.policy.is_gcra() || self.ahead.is_some() {
            return None;
        }
        let located = self.locate(take.counter);
        let mut shard = lock(&self.shards[located.shard]);
        let now = self.clock.now_us();
        // At the key cap there is no counter to hold: the handle asks the store every time,
        // which answers why.
        let entry = self
            .entry(&mut shard, take.counter, located.hash, now)
            .ok()?;
        // A word made for another policy's interval stays seized for good (its handles are no
        // longer in force); handles under this policy get a word of their own.
        if !entry
            .hot
            .as_ref()
            .is_some_and(|hot| hot.serves(take.policy))
        {
            let hot = HotCounter::new(
                self.clock.clone(),
                Arc::clone(&self.limit_pauses_end),
                take.policy,
            )?;
            entry.hot = Some(Arc::new(hot));
        }
        let hot = Arc::clone(entry.hot.as_ref()?);
        let limit_pause_until = self.limit_paused_until(take.counter.limit, now);
        entry.publish(take.policy, now, limit_pause_until);
        // A new counter owes a sweep like any other; the word held now keeps it.
        self.sweep_after(&mut shard, now);
        Some(hot)
    }

    fn with_existing<T>(
        &self,
        take: Take<'_>,
        absent: impl FnOnce() -> Result<T>,
        present: impl FnOnce(&mut Counter, u64) -> Result<T>,
    ) -> Result<T> {
        let located = self.locate(take.counter);
        let mut shard = lock(&self.shards[located.shard]);
        let now = self.clock.now_us();
        let result = match shard.find(take.counter, located.hash) {
            None => absent(),
            Some(index) => {
                let entry = &mut shard.counters[index];
                entry.seize();
                let result = present(&mut entry.counter, now);
                entry.idle_at = entry.counter.idle_at(take.policy);
                let limit_pause_until = self.limit_paused_until(take.counter.limit, now);
                entry.publish(take.policy, now, limit_pause_until);
                result
            }
        };
        self.sweep_after(&mut shard, now);
        result
    }

    fn usage_now(&self, take: Take<'_>) -> Result<Usage> {
        let limit = take.counter.limit;
        // A limit-wide pause, or a hold on the limit that a counter made now would start under.
        let limit_paused_until = |now: u64| {
            self.limit_paused_until(limit, now)
                .max(self.hold_end(limit, now).unwrap_or(0))
        };
        let held_for = |now: u64| self.hold_end(limit, now).unwrap_or(0).saturating_sub(now);
        self.with_existing(
            take,
            || {
                let now = self.clock.now_us();
                Ok(Usage {
                    paused_for_us: limit_paused_until(now).saturating_sub(now),
                    held_for_us: held_for(now),
                    ..Usage::default()
                })
            },
            |counter, now| {
                let (used, reset_after_us) = counter.usage(take.policy, now);
                let paused_until = counter.paused_until().max(limit_paused_until(now));
                Ok(Usage {
                    used,
                    reset_after_us,
                    paused_for_us: paused_until.saturating_sub(now),
                    held_for_us: held_for(now),
                })
            },
        )
    }

    fn pause_now(&self, take: Take<'_>, duration_us: u64) -> Result<u64> {
        let now = self.clock.now_us();
        let until = now.saturating_add(duration_us);
        match take.counter.key {
            None => {
                let mut pauses = lock(&self.pauses);
                pauses.retain(|(_, until)| *until > now);
                let until = match pauses
                    .iter_mut()
                    .find(|(name, _)| &**name == take.counter.limit)
                {
                    Some((_, current)) => {
                        *current = (*current).max(until);
                        *current
                    }
                    None => {
                        pauses.push((take.counter.limit.into(), until));
                        until
                    }
                };
                // Hot words read this end before each decision: from here on none grants.
                self.limit_pauses_end.fetch_max(until, Ordering::AcqRel);
                drop(pauses);
                if let Some(ahead) = &self.ahead {
                    ahead.pauses_changed();
                }
                Ok(until - now)
            }
            Some(_) => {
                let located = self.locate(take.counter);
                let mut guard = lock(&self.shards[located.shard]);
                let shard = &mut *guard;
                let index =
                    self.entry_index(shard, take.counter, located.hash, now, Room::Sweep)?;
                let entry = &mut shard.counters[index];
                entry.counter.pause(until);
                entry.idle_at = entry.counter.idle_at(take.policy);
                let paused_for_us = entry.counter.paused_until().saturating_sub(now);
                // The pause is kept with the counter's next record.
                if let Some(ahead) = &mut shard.ahead
                    && ahead.touch(index, || OwnedCounterId::new(take.counter))
                {
                    self.wake_writer();
                }
                Ok(paused_for_us)
            }
        }
    }
}

/// A decision, from an attempt that needs no record first.
fn decided(attempt: Result<Option<Decision>>) -> Result<Decision> {
    match attempt {
        Ok(Some(decision)) => Ok(decision),
        Ok(None) => Err(Error::StoreFailed {
            reason: "a record of the budget is needed first".into(),
        }),
        Err(error) => Err(error),
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
            cost,
            priority,
            refundable,
            waiter: _,
        } = ask;
        let Some(ahead) = &self.ahead else {
            return StoreFuture::ready(self.acquire_now(takes, cost, priority, refundable));
        };
        // Counted before the attempt, so a batch that lands after it is not missed.
        let seen = ahead.batches();
        match self.attempt(takes, cost, priority, refundable) {
            Ok(None) => match ahead.closed() {
                Some(error) => StoreFuture::ready(Err(error)),
                None => StoreFuture::boxed(
                    self.acquire_after_record(takes, cost, priority, refundable, seen),
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
                })
            }
            Adjust::Resume => self.resume_now(take).map(|changed| Adjusted {
                changed,
                paused_for_us: 0,
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
                    paused_for_us: 0,
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
        StoreFuture::ready(match self.ahead.as_ref().and_then(Ahead::failure) {
            Some(error) => Err(error),
            None => Ok(()),
        })
    }
}

impl MemoryStore {
    /// The limits in force, as the limiter tells them (`News::Limits`).
    fn set_limits(&self, limits: &LimitTable) {
        if self.ahead.is_some() {
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
