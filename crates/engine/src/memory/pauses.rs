//! Pauses and holds on the memory store: a counter's own pause, a limit-wide pause (every key),
//! a hold after a loss of state (`hold`), lifting them, and a counter's usage as it stands.

use super::*;

impl MemoryStore {
    /// When the hold on `limit` ends, while it is held.
    pub(super) fn hold_end(&self, limit: &str, now: u64) -> Option<u64> {
        if self.hold_ends.load(Ordering::Acquire) <= now {
            return None;
        }
        lock(&self.hold)
            .get(limit)
            .copied()
            .filter(|&end| now < end)
    }

    /// What this store knows of `limit` beyond a counter at `now` (`tollgate_core::Around`).
    pub(super) fn around(&self, limit: &str, now: u64) -> Around {
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
    pub(super) fn hold_policies<'l>(
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

    /// Lift every pause of `limit`: the limit-wide one and each key's. For a limit that is gone
    /// or changed kind; examines every counter, so it is for such rare changes only.
    pub(super) fn lift_all_pauses(&self, limit: &str) {
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
    pub(super) fn lift_limit_pause(&self, limit: &str) -> bool {
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
        if lifted && let Some(write_ahead) = &self.write_ahead {
            write_ahead.pauses_changed();
        }
        lifted
    }

    pub(super) fn resume_now(&self, take: Take<'_>) -> Result<bool> {
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
    pub(super) fn limit_paused_until(&self, limit: &str, now: u64) -> u64 {
        if self.limit_pauses_end.load(Ordering::Acquire) <= now {
            return 0;
        }
        self.limit_pause_of(limit)
    }

    pub(super) fn limit_pause_of(&self, limit: &str) -> u64 {
        lock(&self.pauses)
            .iter()
            .find(|(name, _)| &**name == limit)
            .map_or(0, |(_, until)| *until)
    }

    /// The limit-wide pauses still on at `now`.
    pub(super) fn limit_pauses(&self, now: u64) -> Vec<(String, u64)> {
        lock(&self.pauses)
            .iter()
            .filter(|(_, until)| *until > now)
            .map(|(name, until)| (name.to_string(), *until))
            .collect()
    }

    pub(super) fn usage_now(&self, take: Take<'_>) -> Result<Usage> {
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

    pub(super) fn pause_now(&self, take: Take<'_>, duration_us: u64) -> Result<u64> {
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
                if let Some(write_ahead) = &self.write_ahead {
                    write_ahead.pauses_changed();
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
                if let Some(write_ahead) = &mut shard.write_ahead
                    && write_ahead.touch(index, || OwnedCounterId::new(take.counter))
                {
                    self.wake_writer();
                }
                Ok(paused_for_us)
            }
        }
    }
}
