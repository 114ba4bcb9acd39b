//! A store written outside the workspace: what this proves is that the `Store` trait and the
//! conformance suite are enough, through `tollgate`'s public API alone, to build a complete store
//! and hold it to the same cases as the memory and Redis stores.
//!
//! `ExternalStore` is what a crate depending on `tollgate` would write: it names nothing private
//! (only `tollgate::...`, and the decision core as `tollgate::core`), keeps its counters in one
//! `Mutex<HashMap>` with the limit-wide pauses beside them, decides on a clock it owns (the public
//! `MonotonicClock`, which reads the wall clock the suite runs on), and answers in process
//! (`StoreFuture::ready`). Every decision is one step under that one lock: check every counter of
//! the request, then grant on all of them or on none. It forgets counters once the core says they
//! are idle, sweeping only when the map has doubled since the last sweep (so each sweep is paid
//! for by the counters taken in before it); it has no cap on tracked keys (the suite asks for
//! none).
//!
//! `tollgate_conformance::conformance_tests!` below runs every conformance case against it, two
//! limiters over one store, as the memory store's suite does.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tollgate::core::{Counter, Denial};
use tollgate::store::{
    Adjust, Adjusted, Ask, Costs, CounterId, CounterOutcome, Decision, News, Renewed, Store,
    StoreFuture, Take, Usage, WakeFn,
};
use tollgate::{
    COUNTERS_PER_REQUEST_MAX, Clock, Committed, DenyReason, Error, LimitTable, MonotonicClock,
    PermitError, Priority, Result, check_key,
};
use tollgate_conformance::Stores;

/// A counter's id, owned: its limit and, for a limit counted per key, its key.
type Id = (String, Option<String>);

/// The map is swept for idle counters once it has grown to this many, or twice what the last
/// sweep left, whichever is more: each sweep is paid for by as many insertions as it examines.
const SWEEP_FROM_LEN: usize = 64;

#[derive(Debug)]
struct Entry {
    counter: Counter,
    /// From this instant the counter is indistinguishable from a new one (`Counter::idle_at`)
    /// and may be forgotten.
    idle_at: u64,
}

#[derive(Debug, Default)]
struct State {
    counters: HashMap<Id, Entry>,
    /// Pauses asked for with no key, by limit: they stop every counter of the limit.
    limit_pauses: HashMap<String, u64>,
    /// The length at which the next insertion sweeps the map.
    sweep_at_len: usize,
    /// The limits in force as last told, and whether each counts leases: one that is gone or
    /// changed kind loses its pauses.
    limits: HashMap<String, bool>,
}

impl State {
    /// The limit-wide pause of `limit` still on at `now`, or 0.
    fn limit_paused_until(&self, limit: &str, now: u64) -> u64 {
        self.limit_pauses
            .get(limit)
            .copied()
            .filter(|&until| until > now)
            .unwrap_or(0)
    }

    /// The entry for `counter`, made (fresh at `now`) if it is not tracked.
    fn entry(&mut self, counter: CounterId<'_>, now: u64) -> Result<&mut Entry> {
        let id = owned(counter);
        if !self.counters.contains_key(&id)
            && let Some(key) = counter.key
        {
            check_key(key).map_err(|reason| Error::InvalidRequest {
                field: "key",
                reason,
            })?;
        }
        Ok(self.counters.entry(id).or_insert_with(|| Entry {
            counter: Counter::new(now),
            idle_at: now,
        }))
    }

    /// The entry for `counter`, if it is tracked.
    fn existing(&mut self, counter: CounterId<'_>) -> Option<&mut Entry> {
        self.counters.get_mut(&owned(counter))
    }

    /// Forget the counters idle at `now`, once the map has grown enough to pay for a look.
    /// Called before an operation touches any entry, never between its check and its grant.
    fn sweep_if_grown(&mut self, now: u64) {
        if self.counters.len() < self.sweep_at_len.max(SWEEP_FROM_LEN) {
            return;
        }
        self.counters.retain(|_, entry| entry.idle_at > now);
        self.limit_pauses.retain(|_, until| *until > now);
        self.sweep_at_len = self.counters.len() * 2;
    }
}

fn owned(counter: CounterId<'_>) -> Id {
    (counter.limit.to_owned(), counter.key.map(str::to_owned))
}

/// Counters in this process, decided under one lock on a clock the store owns.
struct ExternalStore {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// The wake-ups of every limiter on this store: a refund or release through one limiter
    /// must wake the waiters of another.
    wake: Mutex<Vec<WakeFn>>,
}

impl fmt::Debug for ExternalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExternalStore")
            .field("clock", &self.clock)
            .field("state", &self.state)
            .field("wake", &lock(&self.wake).len())
            .finish()
    }
}

/// A lock whose holder panicked still guards consistent state: every step checks before it
/// changes anything, and the core panics only before a change (a grant without room).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ExternalStore {
    fn new(clock: Arc<dyn Clock>) -> ExternalStore {
        ExternalStore {
            clock,
            state: Mutex::new(State::default()),
            wake: Mutex::new(Vec::new()),
        }
    }

    fn acquire_now(
        &self,
        takes: &[Take<'_>],
        costs: Costs<'_>,
        priority: Priority,
        refundable: bool,
    ) -> Result<Decision> {
        if takes.len() > COUNTERS_PER_REQUEST_MAX {
            return Err(Error::InvalidRequest {
                field: "limits",
                reason: format!("at most {COUNTERS_PER_REQUEST_MAX} limits per request"),
            });
        }
        // Checking one counter twice and then granting on it twice could grant past its limit.
        for (index, take) in takes.iter().enumerate() {
            if takes[..index].iter().any(|t| t.counter == take.counter) {
                return Err(Error::InvalidRequest {
                    field: "limits",
                    reason: format!("counter {:?} is named twice", take.counter),
                });
            }
        }
        let mut state = lock(&self.state);
        let now = self.clock.now_us();
        state.sweep_if_grown(now);
        let mut outcomes = Vec::with_capacity(takes.len());
        for (index, take) in takes.iter().enumerate() {
            let paused_until = state.limit_paused_until(take.counter.limit, now);
            let entry = state.entry(take.counter, now)?;
            let checked = entry
                .counter
                .check(take.policy, now, costs.of(index), priority)
                .map_err(|source| Error::Cost {
                    limit: take.counter.limit.to_owned(),
                    source,
                })?;
            let outcome = match checked {
                Some(mut denial) => {
                    if paused_until > now {
                        denial.retry_after_us = denial.retry_after_us.max(paused_until - now);
                        denial.reason = DenyReason::Paused;
                        denial.left = 0;
                    }
                    CounterOutcome::Denied(denial)
                }
                None => {
                    let (remaining, _) = entry.counter.status(take.policy, now, priority);
                    if paused_until > now {
                        CounterOutcome::Denied(Denial {
                            retry_after_us: paused_until - now,
                            remaining,
                            reason: DenyReason::Paused,
                            left: 0,
                        })
                    } else {
                        CounterOutcome::Allowed { remaining }
                    }
                }
            };
            entry.idle_at = entry.counter.idle_at(take.policy);
            outcomes.push(outcome);
        }
        let all_allowed = outcomes
            .iter()
            .all(|outcome| matches!(outcome, CounterOutcome::Allowed { .. }));
        if all_allowed {
            for (index, (take, outcome)) in takes.iter().zip(&mut outcomes).enumerate() {
                // Checked above, under the same lock and at the same `now`: tracked still.
                let entry = state.entry(take.counter, now)?;
                let grant =
                    entry
                        .counter
                        .grant(take.policy, now, costs.of(index), priority, refundable);
                entry.idle_at = entry.counter.idle_at(take.policy);
                *outcome = CounterOutcome::Granted(grant);
            }
        }
        Ok(Decision::new(now, outcomes))
    }

    fn commit_now(&self, take: Take<'_>, seq: u64, used: u64) -> Result<Committed> {
        let committed = {
            let mut state = lock(&self.state);
            let now = self.clock.now_us();
            match state.existing(take.counter) {
                Some(entry) => {
                    let committed = entry.counter.commit(take.policy, now, seq, used);
                    entry.idle_at = entry.counter.idle_at(take.policy);
                    committed?
                }
                // A forgotten counter was idle: nothing it granted still counts, and no lease
                // of it is still held.
                None if take.policy.is_concurrency() => Committed {
                    refunded: 0,
                    released: 0,
                },
                None => return Err(PermitError::Gone.into()),
            }
        };
        if committed.refunded > 0 || committed.released > 0 {
            // Outside the lock: a handler may ask this store again.
            let handlers = lock(&self.wake).clone();
            for handler in handlers {
                handler(take.counter);
            }
        }
        Ok(committed)
    }

    fn renew_now(&self, take: Take<'_>, fence: u64) -> Result<Renewed> {
        let mut state = lock(&self.state);
        let now = self.clock.now_us();
        let entry = state
            .existing(take.counter)
            .ok_or(PermitError::LeaseExpired)?;
        let renewed = entry.counter.renew(take.policy, now, fence);
        entry.idle_at = entry.counter.idle_at(take.policy);
        Ok(Renewed {
            expires_in_us: renewed?.saturating_sub(now),
        })
    }

    fn pause_now(&self, take: Take<'_>, duration_us: u64) -> Result<u64> {
        let mut state = lock(&self.state);
        let now = self.clock.now_us();
        let until = now.saturating_add(duration_us);
        state.sweep_if_grown(now);
        match take.counter.key {
            // No key: the whole limit, every key of it included.
            None => {
                let current = state
                    .limit_pauses
                    .entry(take.counter.limit.to_owned())
                    .or_insert(0);
                *current = (*current).max(until);
                Ok(*current - now)
            }
            Some(_) => {
                let entry = state.entry(take.counter, now)?;
                entry.counter.pause(until);
                entry.idle_at = entry.counter.idle_at(take.policy);
                Ok(entry.counter.paused_until().saturating_sub(now))
            }
        }
    }

    fn resume_now(&self, take: Take<'_>) -> bool {
        let mut state = lock(&self.state);
        let now = self.clock.now_us();
        match take.counter.key {
            None => state
                .limit_pauses
                .remove(take.counter.limit)
                .is_some_and(|until| until > now),
            Some(key) => {
                let id: Id = (take.counter.limit.to_owned(), Some(key.to_owned()));
                // This store holds nothing back after a loss of state: no hold to keep.
                state
                    .counters
                    .get_mut(&id)
                    .is_some_and(|entry| entry.counter.resume(now, 0))
            }
        }
    }

    fn usage_now(&self, take: Take<'_>) -> Usage {
        let mut state = lock(&self.state);
        let now = self.clock.now_us();
        let limit_paused_until = state.limit_paused_until(take.counter.limit, now);
        let id: Id = (
            take.counter.limit.to_owned(),
            take.counter.key.map(str::to_owned),
        );
        let Some(entry) = state.counters.get_mut(&id) else {
            return Usage {
                paused_for_us: limit_paused_until.saturating_sub(now),
                ..Usage::default()
            };
        };
        let (used, reset_after_us) = entry.counter.usage(take.policy, now);
        Usage {
            used,
            reset_after_us,
            paused_for_us: entry
                .counter
                .paused_until()
                .max(limit_paused_until)
                .saturating_sub(now),
            held_for_us: 0,
        }
    }
}

impl ExternalStore {
    fn charge_now(&self, take: Take<'_>, units: u64) -> Result<u64> {
        let mut state = lock(&self.state);
        let now = self.clock.now_us();
        let entry = state.entry(take.counter, now)?;
        let charged = entry.counter.debit(take.policy, now, units);
        entry.idle_at = entry.counter.idle_at(take.policy);
        Ok(charged)
    }

    fn reset_now(&self, take: Take<'_>) -> bool {
        let mut state = lock(&self.state);
        let id: Id = (
            take.counter.limit.to_owned(),
            take.counter.key.map(str::to_owned),
        );
        let held = state
            .counters
            .get_mut(&id)
            .map(|entry| entry.counter.forget());
        held.is_some()
    }

    fn set_limits(&self, limits: &LimitTable) {
        let mut state = lock(&self.state);
        let now = self.clock.now_us();
        let next: HashMap<String, bool> = limits
            .iter()
            .map(|limit| (limit.name().to_owned(), limit.policy().is_concurrency()))
            .collect();
        let State {
            limits: known,
            limit_pauses,
            counters,
            ..
        } = &mut *state;
        for (name, leases) in known.iter() {
            if next.get(name) != Some(leases) {
                limit_pauses.remove(name);
                for ((limit, _), entry) in counters.iter_mut() {
                    if limit == name {
                        entry.counter.resume(now, 0);
                    }
                }
            }
        }
        *known = next;
    }
}

impl Store for ExternalStore {
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        StoreFuture::ready(self.acquire_now(ask.takes, ask.costs, ask.priority, ask.refundable))
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        StoreFuture::ready(self.commit_now(take, seq, used))
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        StoreFuture::ready(self.renew_now(take, fence))
    }

    fn adjust<'a>(&'a self, take: Take<'a>, adjust: Adjust) -> StoreFuture<'a, Adjusted> {
        StoreFuture::ready(match adjust {
            Adjust::Pause { for_us } => {
                self.pause_now(take, for_us).map(|paused_for_us| Adjusted {
                    changed: true,
                    paused_for_us,
                    charged: 0,
                })
            }
            Adjust::Resume => Ok(Adjusted {
                changed: self.resume_now(take),
                ..Adjusted::default()
            }),
            Adjust::Reset => Ok(Adjusted {
                changed: self.reset_now(take),
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
        StoreFuture::ready(Ok(self.usage_now(take)))
    }

    fn tell(&self, news: News<'_>) {
        match news {
            News::Limits(limits) => self.set_limits(limits),
            News::Wake(wake) => lock(&self.wake).push(wake),
        }
    }
}

/// Two limiters over one fresh store, as the memory store's suite has it.
async fn external_stores(_test: &'static str) -> Option<Stores> {
    let store: Arc<dyn Store> = Arc::new(ExternalStore::new(Arc::new(MonotonicClock::new())));
    Some(Stores {
        first: store.clone(),
        second: store,
    })
}

tollgate_conformance::conformance_tests!(external_stores);

/// What the suite cannot reach on the wall clock, on a clock stepped by hand: an idle counter is
/// forgotten once enough new ones come in, and then a commit of its reservation is `Gone`, a
/// release of its lease releases nothing, and a renewal of that lease is `LeaseExpired`.
#[test]
fn forgotten_counters_answer_as_the_trait_says() {
    use tollgate::{Algorithm, ManualClock, Policy, Reserve};

    const SECOND_US: u64 = 1_000_000;
    let clock = Arc::new(ManualClock::new(1_000 * SECOND_US));
    let store = ExternalStore::new(clock.clone());
    let ready = |future: StoreFuture<'_, Decision>| -> Decision {
        future
            .into_ready()
            .expect("answers in process")
            .expect("decides")
    };
    let rate = Policy::rate(2, SECOND_US, 0, Algorithm::Sliding, Reserve::default())
        .expect("valid policy");
    let lease = Policy::concurrency(1, SECOND_US, Reserve::default()).expect("valid policy");
    let take = |limit, policy| Take {
        counter: CounterId { limit, key: None },
        policy,
    };
    let seq = |decision: Decision| match decision.outcomes() {
        [CounterOutcome::Granted(grant)] => grant.seq,
        other => panic!("expected one grant, got {other:?}"),
    };
    let reservation = seq(ready(store.acquire(
        Ask::new(&[take("rate", &rate)], 1, Priority::Normal).refundable(true),
    )));
    let fence = seq(ready(store.acquire(
        Ask::new(&[take("pool", &lease)], 1, Priority::Normal).refundable(true),
    )));

    // Past the period and the lease's TTL both counters are idle; new keys make the sweep due.
    clock.advance_us(2 * SECOND_US);
    let keys: Vec<String> = (0..SWEEP_FROM_LEN).map(|n| format!("key-{n}")).collect();
    for key in &keys {
        let keyed = Take {
            counter: CounterId {
                limit: "keyed",
                key: Some(key),
            },
            policy: &rate,
        };
        assert!(ready(store.acquire(Ask::new(&[keyed], 1, Priority::Normal))).is_granted());
    }
    let tracked = lock(&store.state).counters.len();
    assert!(
        tracked <= SWEEP_FROM_LEN,
        "{tracked} counters: nothing forgotten"
    );

    let committed = store
        .commit(take("rate", &rate), reservation, 0)
        .into_ready()
        .expect("answers in process");
    assert!(
        matches!(
            committed,
            Err(Error::Permit {
                source: PermitError::Gone
            })
        ),
        "{committed:?}"
    );
    let released = store
        .commit(take("pool", &lease), fence, 0)
        .into_ready()
        .expect("answers in process")
        .expect("a release of a forgotten lease");
    assert_eq!((released.refunded, released.released), (0, 0));
    let renewed = store
        .renew(take("pool", &lease), fence)
        .into_ready()
        .expect("answers in process");
    assert!(
        matches!(
            renewed,
            Err(Error::Permit {
                source: PermitError::LeaseExpired
            })
        ),
        "{renewed:?}"
    );
}
