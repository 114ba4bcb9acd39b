//! The limiter's side of learning (`crate::learned` holds the arithmetic): the learned state
//! of each limit, laid over the configured limits whenever the table changes, and a timer that
//! puts the configured limit back in force when what was learned runs out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Limiter, Shared};
use crate::error::{Error, Result};
use crate::learned::{
    Bounds, LESSON_QUOTAS_MAX, LESSON_SOURCE_BYTES_MAX, Learned, Lesson, LimitLearning,
    lowered_policy,
};
use crate::limits::{Limit, LimitTable};
use crate::permit_id::decode;

#[derive(Debug)]
pub(super) struct Learning {
    /// The origin of the learning's clock (microseconds since it).
    epoch: Instant,
    by_name: HashMap<Box<str>, LimitLearning>,
    /// When the timer that refreshes the table next fires, if one is set.
    timer_at_us: Option<u64>,
}

impl Learning {
    pub(super) fn new() -> Learning {
        Learning {
            epoch: Instant::now(),
            by_name: HashMap::new(),
            timer_at_us: None,
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Learning> {
    // Plain values, whole whatever panicked while they were held.
    match shared.learning.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn check_source(source: &str) -> Result<()> {
    if source.is_empty() || source.len() > LESSON_SOURCE_BYTES_MAX {
        return Err(Error::invalid(
            "source",
            format!("must be 1 to {LESSON_SOURCE_BYTES_MAX} bytes"),
        ));
    }
    if !source.bytes().all(|byte| (b' '..=b'~').contains(&byte)) {
        return Err(Error::invalid("source", "must be printable ASCII"));
    }
    Ok(())
}

/// The policy `limit` decides under with `state` at `now_us`.
fn learned_limit(limit: &Limit, state: &LimitLearning, shared: &Shared, now_us: u64) -> Limit {
    let configured = limit.configured();
    let Some(bounds) = Bounds::of(configured, &shared.config.learn) else {
        return limit.learned(*configured);
    };
    let effective = if limit.per().is_some() {
        bounds.configured
    } else {
        state.limit(bounds, &shared.config.learn, now_us)
    };
    let margin_us = state.margin_us(bounds.period_us, now_us);
    let policy = lowered_policy(configured, effective, margin_us).unwrap_or(*configured);
    limit.learned(policy)
}

impl Limiter {
    /// `table` with what was learned laid over its configured limits.
    pub(super) fn overlay_learned(&self, mut table: LimitTable) -> LimitTable {
        let learning = lock(&self.shared);
        let now_us = learning.now_us();
        let mut changes = Vec::new();
        for limit in table.iter() {
            let learned = match learning.by_name.get(limit.name()) {
                Some(state) => learned_limit(limit, state, &self.shared, now_us),
                // Nothing learned (any more): the configured policy.
                None if limit.policy() != limit.configured() => limit.learned(*limit.configured()),
                None => continue,
            };
            if learned.policy() != limit.policy() {
                changes.push(learned);
            }
        }
        for learned in changes {
            table.set(learned);
        }
        table
    }

    /// Put the learned state in force now, if it changed `name`'s policy, and keep a timer set
    /// for its next change by itself.
    fn relearn(&self, name: &str) {
        let changed = {
            let learning = lock(&self.shared);
            let table = self.shared.table();
            match (table.get(name), learning.by_name.get(name)) {
                (Some(limit), Some(state)) => {
                    learned_limit(limit, state, &self.shared, learning.now_us()).policy()
                        != limit.policy()
                }
                (Some(limit), None) => limit.policy() != limit.configured(),
                (None, _) => false,
            }
        };
        if changed {
            self.update_limits(|table| Some(table.clone()));
        }
        self.schedule();
    }

    /// Set the timer for the earliest change of what is learned, if it is not set earlier.
    fn schedule(&self) {
        let mut learning = lock(&self.shared);
        let now_us = learning.now_us();
        let table = self.shared.table();
        let config = &self.shared.config.learn;
        let next = learning
            .by_name
            .iter()
            .filter_map(|(name, state)| {
                let limit = table.get(name)?;
                let bounds = Bounds::of(limit.configured(), config)?;
                state.next_change_us(bounds.period_us, config, now_us)
            })
            .min();
        let Some(at_us) = next else {
            return;
        };
        if learning.timer_at_us.is_some_and(|set| set <= at_us) {
            return;
        }
        // Without a runtime nothing can sleep; the next lesson or change puts it right.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        learning.timer_at_us = Some(at_us);
        let when = learning.epoch + Duration::from_micros(at_us);
        let shared = Arc::downgrade(&self.shared);
        runtime.spawn(async move {
            tokio::time::sleep_until(when).await;
            if let Some(shared) = shared.upgrade() {
                Limiter { shared }.refresh_learned();
            }
        });
    }

    /// Forget what ran out, put the rest in force, and set the timer again.
    fn refresh_learned(&self) {
        {
            let mut learning = lock(&self.shared);
            learning.timer_at_us = None;
            let now_us = learning.now_us();
            let table = self.shared.table();
            let config = self.shared.config.learn;
            learning.by_name.retain(|name, state| {
                let Some(bounds) = table
                    .get(name)
                    .and_then(|limit| Bounds::of(limit.configured(), &config))
                else {
                    return false;
                };
                state.expire(bounds, &config, now_us);
                !state.is_empty(now_us)
            });
        }
        self.update_limits(|table| Some(table.clone()));
        self.schedule();
    }

    /// A vendor's answer about `limit`, a rate limit not counted per key: the quotas it
    /// advertised lower the limit in force to the least of them (converted to the limit's
    /// period), never above the configured limit nor below the floor, until
    /// `LearnConfig::ttl` passes without another; an advertised quota at or above the
    /// configured limit puts it back. A rate-limit answer that advertised nothing halves the
    /// limit in force (once per period, however many answers say so), and it climbs back a
    /// twentieth of the configured limit every `LearnConfig::raise_every`. Shared with every
    /// process that shares this limiter (a server's callers); see `docs/outbound.md`.
    pub fn learn(&self, limit: &str, lesson: &Lesson<'_>) -> Result<Learned> {
        check_source(lesson.source)?;
        if lesson.quotas.len() > LESSON_QUOTAS_MAX {
            return Err(Error::invalid(
                "quotas",
                format!("at most {LESSON_QUOTAS_MAX}"),
            ));
        }
        if lesson.quotas.iter().any(|quota| quota.quota == 0) {
            return Err(Error::invalid("quotas", "a quota must be at least 1"));
        }
        let table = self.shared.table();
        let target = table.get(limit).ok_or_else(|| Error::UnknownLimit {
            name: limit.to_owned(),
        })?;
        let config = self.shared.config.learn;
        let Some(bounds) = Bounds::of(target.configured(), &config) else {
            return Err(Error::invalid(
                "limit",
                format!("limit {limit:?} is a concurrency limit: only a rate limit learns"),
            ));
        };
        if target.per().is_some() {
            return Err(Error::invalid(
                "limit",
                format!("limit {limit:?} is counted per key: only a limit of one counter learns"),
            ));
        }
        let view = {
            let mut learning = lock(&self.shared);
            let now_us = learning.now_us();
            let state = learning.by_name.entry(limit.into()).or_default();
            state.learn(lesson, bounds, &config, now_us);
            state.view(bounds, &config, now_us)
        };
        self.relearn(limit);
        Ok(view)
    }

    /// A caller sent the request of permit `id` `delay` after its grant: each of the permit's
    /// rate limits widens its margin to cover the most delay seen in the last minute or two
    /// (plus an allowance for the call's own way to the vendor), so that grants a period apart
    /// never arrive at the vendor less than a period apart. Bounded: at most a quarter of the
    /// period and a second, forgotten two minutes after the last report. Returns the limits
    /// whose margin this changed.
    pub fn note_sent(&self, id: &str, delay: Duration) -> Result<Vec<String>> {
        let parts = decode(&self.shared.config.permit_secret, id)?;
        Ok(parts
            .iter()
            .filter(|part| self.note_delay(&part.limit, delay))
            .map(|part| part.limit.to_string())
            .collect())
    }

    /// `note_sent` for one limit by name (what another process reported): whether it changed
    /// the limit's margin. A name that is not a rate limit in force changes nothing.
    pub fn note_delay(&self, limit: &str, delay: Duration) -> bool {
        let delay_us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        let table = self.shared.table();
        let Some(target) = table.get(limit) else {
            return false;
        };
        let Some(bounds) = Bounds::of(target.configured(), &self.shared.config.learn) else {
            return false;
        };
        let changed = {
            let mut learning = lock(&self.shared);
            let now_us = learning.now_us();
            let state = learning.by_name.entry(limit.into()).or_default();
            let before = state.margin_us(bounds.period_us, now_us);
            state.note_delay(delay_us, now_us);
            state.margin_us(bounds.period_us, now_us) != before
        };
        if changed {
            self.relearn(limit);
        }
        changed
    }

    /// The vendor said no call remains until `reset`: pause `limit` that long for every caller
    /// (cut to `pause_max`), before the vendor refuses one. The limit's own counter cannot say
    /// otherwise: it may count in a shorter window than the vendor's, or miss calls the vendor
    /// counts (another user of the same key). Returns the pause in force (zero: none).
    pub async fn vendor_exhausted(&self, limit: &str, reset: Duration) -> Result<Duration> {
        if reset.is_zero() {
            return Ok(Duration::ZERO);
        }
        self.pause(limit, None, reset).await
    }

    /// What was learned of `limit`, if it is a rate limit: the limit and margin in force
    /// beside the configured ones.
    pub fn learned(&self, limit: &str) -> Option<Learned> {
        let table = self.shared.table();
        let target = table.get(limit)?;
        let config = self.shared.config.learn;
        let bounds = Bounds::of(target.configured(), &config)?;
        let learning = lock(&self.shared);
        let now_us = learning.now_us();
        let state = learning.by_name.get(limit).cloned().unwrap_or_default();
        Some(state.view(bounds, &config, now_us))
    }
}
