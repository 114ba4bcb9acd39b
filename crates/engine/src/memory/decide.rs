//! Deciding a request on the memory store: every counter checked under its shard's lock (the
//! core decides, with the limit-wide pause and hold around it), then all granted or none; a
//! request that needs a write-ahead record waits for it and is decided again under the limits
//! then in force; and the hot ways a `LimitHandle` takes (`grant_tracked`, `hot_counter`).

use super::*;

/// One request, as asked of one counter.
#[derive(Clone, Copy, Debug)]
pub(super) struct Asked {
    pub(super) now: u64,
    pub(super) cost: u64,
    pub(super) priority: Priority,
}

/// The error for a cost that `take`'s limit can never grant.
pub(super) fn cost_error(take: Take<'_>) -> impl FnOnce(tollgate_core::CostError) -> Error + '_ {
    move |source| Error::Cost {
        limit: take.counter.limit.to_owned(),
        source,
    }
}

/// `takes` under the policies of `table` (the limits in force, when the store was told them).
/// A limit the table does not name keeps the policy it was asked under: the store also
/// decides for callers with limits of their own (Envoy's service asks it directly), and a
/// limit removed meanwhile is at worst decided once more as it was.
pub(super) fn in_force_now<'t>(
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
pub(super) fn check_entry(
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
pub(super) fn grant_entry(
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

/// A decision, from an attempt that needs no record first.
pub(super) fn decided(attempt: Result<Option<Decision>>) -> Result<Decision> {
    match attempt {
        Ok(Some(decision)) => Ok(decision),
        Ok(None) => Err(Error::StoreFailed {
            reason: "a record of the budget is needed first".into(),
        }),
        Err(error) => Err(error),
    }
}

impl MemoryStore {
    /// The decision on every take: all granted or none, under the locks of their shards.
    pub(crate) fn acquire_now(
        &self,
        takes: &[Take<'_>],
        costs: Costs<'_>,
        priority: Priority,
        refundable: bool,
    ) -> Result<Decision> {
        decided(self.attempt(takes, costs, priority, refundable))
    }

    /// `acquire_now`, or `None` (only with write-ahead on): the request fits, but a counter
    /// needs a record of its budget first; nothing was granted, and the record is asked for.
    pub(super) fn attempt(
        &self,
        takes: &[Take<'_>],
        costs: Costs<'_>,
        priority: Priority,
        refundable: bool,
    ) -> Result<Option<Decision>> {
        match self.acquire_locked(takes, costs, priority, refundable) {
            Err(Error::TooManyKeys { .. } | Error::TooManyKeysForLimit { .. }) => {
                // The key's own shard had no idle counter to give up; look in all of them, with
                // no lock held (taking more locks while holding some could deadlock), once.
                self.sweep(SWEEP_BEFORE_REFUSING / SHARDS);
                self.acquire_locked(takes, costs, priority, refundable)
            }
            other => other,
        }
    }

    pub(super) fn acquire_locked(
        &self,
        takes: &[Take<'_>],
        costs: Costs<'_>,
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
            return self.acquire_one(*take, costs.of(0), priority, refundable);
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
        let asked = |position: usize| Asked {
            now,
            cost: costs.of(position),
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
            let outcome = check_entry(entry, *take, asked(position), around, granted_next)?;
            all_allowed &= matches!(outcome, CounterOutcome::Allowed { .. });
            outcomes.push(outcome);
        }
        if all_allowed && self.write_ahead.is_some() {
            // Every counter short of budget asks for its record, so that one batch serves them.
            let mut short = false;
            for (position, take) in takes.iter().enumerate() {
                let shard = &mut guards[guard_of_take[position]];
                if let Some(write_ahead) = &mut shard.write_ahead
                    && !take.policy.is_concurrency()
                {
                    let id = || OwnedCounterId::new(take.counter);
                    short |= !write_ahead.allows(
                        index_of_take[position],
                        id,
                        take.policy,
                        costs.of(position),
                    );
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
                *outcome = grant_entry(entry, *take, asked(position), refundable);
                if let Some(write_ahead) = &mut shard.write_ahead
                    && !take.policy.is_concurrency()
                {
                    let id = || OwnedCounterId::new(take.counter);
                    due |= write_ahead.spent(index, id, take.policy, costs.of(position));
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
    pub(super) fn acquire_one(
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
        let admitted = (!refundable && limit_pause_until <= now && shard.write_ahead.is_none())
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
                    CounterOutcome::Allowed { .. } => match &mut shard.write_ahead {
                        Some(write_ahead) if !take.policy.is_concurrency() => {
                            let id = || OwnedCounterId::new(take.counter);
                            if !write_ahead.allows(index, id, take.policy, cost) {
                                self.wake_writer();
                                self.sweep_after(shard, now);
                                return Ok(None);
                            }
                            let granted = grant_entry(entry, take, asked, refundable);
                            if write_ahead.spent(index, id, take.policy, cost) {
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
    /// settles, until it is decided, the state database fails, or `RECORD_WAIT_MAX` passes.
    pub(super) async fn acquire_after_record(
        &self,
        takes: &[Take<'_>],
        costs: Costs<'_>,
        priority: Priority,
        refundable: bool,
        mut seen: u64,
    ) -> Result<Decision> {
        let Some(write_ahead) = &self.write_ahead else {
            return self.acquire_now(takes, costs, priority, refundable);
        };
        let deadline = tokio::time::Instant::now() + RECORD_WAIT_MAX;
        loop {
            write_ahead.wait_after(seen, deadline).await?;
            seen = write_ahead.batches();
            // The limits may have changed while it waited (an administrator, a vendor's
            // lesson): a lowered limit must not grant under its old policy for this long.
            let table = lock(&self.in_force).clone();
            let takes = in_force_now(table.as_deref(), takes);
            if let Some(decision) = self.attempt(&takes, costs, priority, refundable)? {
                return Ok(decision);
            }
            if let Some(error) = write_ahead.failure() {
                return Err(error);
            }
        }
    }

    /// Count `units` spent beyond any grant on `take`'s counter (`Counter::debit`), making the
    /// counter when it is not tracked yet; returns the units counted. With write-ahead on, the
    /// units are spent from the counter's budget like a grant's, never waiting for a record (a
    /// charge is never refused): past the budget, a record is asked for at once, and a crash
    /// before it lands restores the counter charged its budget, which may be less than the
    /// debt: the rest is lost with the crash, and the vendor may then refuse what is granted.
    pub(super) fn charge_now(&self, take: Take<'_>, units: u64) -> Result<u64> {
        if take.policy.is_concurrency() {
            return Ok(0);
        }
        let located = self.locate(take.counter);
        let mut guard = lock(&self.shards[located.shard]);
        let shard = &mut *guard;
        let now = self.clock.now_us();
        let index = self.entry_index(shard, take.counter, located.hash, now, Room::Sweep)?;
        let entry = &mut shard.counters[index];
        let charged = entry.counter.debit(take.policy, now, units);
        entry.idle_at = entry.counter.idle_at(take.policy);
        if let Some(write_ahead) = &mut shard.write_ahead {
            let id = || OwnedCounterId::new(take.counter);
            if charged > 0 && write_ahead.spent(index, id, take.policy, charged) {
                self.wake_writer();
            }
        }
        let limit_pause_until = self.limit_paused_until(take.counter.limit, now);
        entry.publish(take.policy, now, limit_pause_until);
        self.sweep_after(shard, now);
        Ok(charged)
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
        if self.write_ahead.is_some() {
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
        if !take.policy.is_gcra() || self.write_ahead.is_some() {
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
}
