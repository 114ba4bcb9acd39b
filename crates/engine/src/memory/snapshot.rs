//! Carrying everything the memory store counts to a later process: `snapshot` and `restore`,
//! with the values they trade in.

use super::*;

/// One counter as `MemoryStore::snapshot` saw it, or a record of write-ahead
/// (`RecordBatch`): its limit, its key, and its state in the core's words
/// (`Counter::to_words`), times on the store's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedCounter {
    pub limit: String,
    pub key: Option<String>,
    pub state: Vec<u64>,
    /// Units the store may have granted on the counter past `state`: its write-ahead budget
    /// (`write_ahead.rs`); 0 in a snapshot, taken once nothing decides any more. `restore` charges
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

impl MemoryStore {
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
                        if let Some(write_ahead) = &mut shard.write_ahead {
                            write_ahead.pushed();
                        }
                        index
                    }
                    Err(_) => {
                        held.insert(saved.limit.clone(), policy);
                        continue;
                    }
                },
            };
            if let Some(write_ahead) = &mut shard.write_ahead {
                write_ahead.restored(
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
}
