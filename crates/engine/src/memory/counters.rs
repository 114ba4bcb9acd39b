//! Finding and making the memory store's counters: ids kept inline (`OwnedCounterId`), the map
//! entries and the shards that hold them, each limit's budget of keys, and the sweeps that
//! forget idle counters.

use super::*;

/// A counter's id as one run of bytes, the limit's name then the key: one length and one
/// buffer for both keeps the map's entries small, and so more of them in cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedCounterId {
    pub(super) bytes: SmallVec<[u8; ID_BYTES_INLINE]>,
    /// Bytes of the name (names are short: `LIMIT_NAME_BYTES_MAX`).
    pub(super) limit_len: u32,
    pub(super) keyed: bool,
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
    pub(super) fn parts(&self) -> (&[u8], Option<&[u8]>) {
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
pub(super) struct Entry {
    pub(super) counter: Counter,
    /// From this instant the counter is idle and may be dropped (`Counter::idle_at`).
    pub(super) idle_at: u64,
    /// The word handles decide this counter on without a lock, while one is published
    /// (`hot`): then it, not `counter`, holds the backlog's end. Every lookup under the lock
    /// seizes it first (`entry_index`, `with_existing`).
    pub(super) hot: Option<Arc<HotCounter>>,
    /// The budget of the counter's limit, for a counter of a key: its place is given back there
    /// when the counter is dropped.
    pub(super) tally: Option<Arc<KeyTally>>,
}

/// The keys one limit has tracked now, and how many it may (its budget).
#[derive(Debug)]
pub(super) struct KeyTally {
    pub(super) tracked: AtomicU64,
    pub(super) keys_max: AtomicU64,
}

impl KeyTally {
    /// Take a place in the budget; `false` when it is full.
    pub(super) fn claim(&self) -> bool {
        let before = self.tracked.fetch_add(1, Ordering::AcqRel);
        if before >= self.keys_max.load(Ordering::Acquire) {
            self.tracked.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    pub(super) fn release(&self) {
        self.tracked.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Each limit's budget of keys, and the limits in force as last told (`News::Limits`).
#[derive(Debug, Default)]
pub(super) struct Budgets {
    /// Every limit's tally, kept for the store's life (limit names are bounded by what is
    /// configured), so that every counter of a limit always shares one.
    pub(super) tallies: std::collections::HashMap<Box<str>, Arc<KeyTally>>,
    /// The limits in force: their own `keys_max`, and whether they count leases (a limit that
    /// changes kind loses its pauses).
    pub(super) limits: std::collections::HashMap<Box<str>, (Option<u64>, bool)>,
}

impl Entry {
    /// Make `counter` the truth: take back the backlog's end a handle may have moved.
    pub(super) fn seize(&mut self) {
        if let Some(hot) = &self.hot
            && let Some(tat) = hot.seize(&mut self.counter)
        {
            // Handles' grants moved only the backlog's end, so that is all `idle_at` misses.
            self.idle_at = self.idle_at.max(tat);
        }
    }

    /// A grant nobody will refund, decided on the GCRA backlog alone (`gcra_admit`) when the
    /// counter needs nothing else, as its hot word would decide it. `None` changed nothing.
    pub(super) fn grant_backlog_alone(
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
    pub(super) fn publish(&self, policy: &Policy, now: u64, limit_pause_until: u64) {
        if let Some(hot) = &self.hot
            && limit_pause_until <= now
        {
            hot.publish(&self.counter, policy, now);
        }
    }

    /// Whether the counter may be dropped at `now`. Never while a handle holds its hot word
    /// (the handle would go on deciding on a counter the store no longer has); once none
    /// does, none can take it again without the shard's lock, so the word is seized for good.
    pub(super) fn idle(&mut self, now: u64) -> bool {
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
pub(super) enum Room {
    Sweep,
    Keep,
}

/// Where a counter lives: its shard, and its hash in that shard's map.
#[derive(Clone, Copy, Debug)]
pub(super) struct Located {
    pub(super) shard: usize,
    pub(super) hash: u64,
}

#[derive(Debug)]
pub(super) struct Shard {
    /// Hashed with the store's own `hasher`, so a counter's hash is worked out once per
    /// operation: it picks the shard and finds the entry.
    pub(super) counters: IndexMap<OwnedCounterId, Entry, foldhash::fast::RandomState>,
    pub(super) cursor: usize,
    /// Counters to examine for idleness at the end of this operation: every new counter adds
    /// `SWEEP_PER_INSERT`, so the map cannot outgrow its live counters, and a decision on a
    /// counter already tracked examines none (the examination's cache misses are most of a
    /// sweep's cost, and most decisions find their counter).
    pub(super) sweep_owed: usize,
    /// With write-ahead on: each counter's spending since its record, and the counters due
    /// for one (`write_ahead.rs`).
    pub(super) write_ahead: Option<ShardRecords>,
}

impl Shard {
    /// Where `counter` is in this shard's map, if it is tracked; `hash` is its hash by the
    /// store's hasher (`MemoryStore::locate`).
    #[inline]
    pub(super) fn find(&self, counter: CounterId<'_>, hash: u64) -> Option<usize> {
        self.counters
            .raw_entry_v1()
            .index_from_hash(hash, |owned| counter.equivalent(owned))
    }

    /// Examine up to `budget` counters from the cursor; drop the idle ones. Returns how many.
    pub(super) fn sweep(&mut self, now: u64, budget: usize) -> usize {
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
                    .write_ahead
                    .as_ref()
                    .is_some_and(|write_ahead| write_ahead.waited_on(self.cursor));
            if idle {
                // The last counter moves into the cursor's place and is examined next.
                if let Some((id, entry)) = self.counters.swap_remove_index(self.cursor) {
                    if let Some(tally) = entry.tally {
                        tally.release();
                    }
                    if let Some(write_ahead) = &mut self.write_ahead {
                        write_ahead.removed(self.cursor, id);
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
    pub(super) fn shrink_if_sparse(&mut self) {
        let capacity = self.counters.capacity();
        if capacity > SHRINK_ABOVE_CAPACITY && self.counters.len() < capacity / 4 {
            self.counters.shrink_to(self.counters.len() * 2);
        }
    }
}

impl MemoryStore {
    /// The entry for `counter`, created if absent (subject to the cap).
    pub(super) fn entry<'s>(
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
    pub(super) fn entry_index(
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
    pub(super) fn insert_entry(
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
        if let Some(write_ahead) = &mut shard.write_ahead {
            write_ahead.pushed();
        }
        Ok(index)
    }

    /// The places a new counter takes: for a key, one in its limit's budget (returned, to be
    /// given back when the counter is dropped) and one under the store-wide cap; a limit's
    /// one counter is never refused (there is one per limit configured).
    pub(super) fn claim_places(&self, counter: CounterId<'_>) -> Result<Option<Arc<KeyTally>>> {
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
    pub(super) fn tally(&self, limit: &str) -> Arc<KeyTally> {
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
    pub(super) fn keys_max_of(&self, budgets: &Budgets, limit: &str) -> u64 {
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

    /// The examinations this operation's new counters owe (see `SWEEP_PER_INSERT`), once the
    /// operation is done with the indices it holds: a sweep moves counters.
    #[inline]
    pub(super) fn sweep_after(&self, shard: &mut Shard, now: u64) {
        if shard.sweep_owed == 0 {
            return;
        }
        let budget = std::mem::take(&mut shard.sweep_owed);
        self.sweep_shard(shard, now, budget);
    }

    /// `Shard::sweep`, with the dropped counters' places given back to the cap.
    pub(super) fn sweep_shard(&self, shard: &mut Shard, now: u64, budget: usize) {
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

    pub(super) fn with_existing<T>(
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

    /// The shard of `counter` and its hash in the shard's map.
    pub(super) fn locate(&self, counter: CounterId<'_>) -> Located {
        let hash = self.hasher.hash_one(counter);
        Located {
            shard: MemoryStore::shard_of(counter, hash),
            hash,
        }
    }

    /// Bits of the hash the map does not use: hashbrown places entries by the low bits and tags
    /// them with the top seven, so a shard chosen by either would crowd its map's buckets.
    #[cfg(not(tollgate_loom))]
    pub(super) fn shard_of(_counter: CounterId<'_>, hash: u64) -> usize {
        (hash >> 40) as usize % SHARDS
    }

    /// Under loom the shard must not depend on a random seed (every execution must be the same):
    /// the last bytes of limit and key pick it, so tests choose which counters share a shard.
    #[cfg(tollgate_loom)]
    pub(super) fn shard_of(counter: CounterId<'_>, _hash: u64) -> usize {
        let last = |text: &str| usize::from(text.as_bytes().last().copied().unwrap_or(0));
        (last(counter.limit) + counter.key.map_or(0, last)) % SHARDS
    }

    pub(super) fn fresh_counter(&self, counter: CounterId<'_>, now: u64) -> Counter {
        match self.hold_end(counter.limit, now) {
            Some(end) => Counter::recovering(now, end),
            None => Counter::new(now),
        }
    }
}
