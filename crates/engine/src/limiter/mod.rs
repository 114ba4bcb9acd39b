//! The limiter: resolves limit names to policies, asks the store, waits when asked to, and
//! hands out permits. Waiting is ordered by `waiters` (priority, then arrival) and sleeps on
//! exact retry hints or wake-ups, never on a polling interval.

mod config;
mod handle;
mod learn;
mod permit;
mod request;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tokio::time::Instant;
use tollgate_core::{Committed, DenyReason, Kind, Priority, UNITS_MAX};

use crate::clock::MonotonicClock;
use crate::error::{Error, Result};
use crate::limits::{Limit, LimitTable, check_key};
use crate::memory::{COUNTERS_PER_REQUEST_MAX, MemoryStore, MemoryStoreConfig};
use crate::permit_id::{LimitStatus, Part, decode};
use crate::store::{
    Adjust, Ask, CounterId, CounterOutcome, Decision, News, Store, StoreFuture, Take, Usage,
};

use crate::sync::Ordering;
use crate::waiters::{Caps, StorePlace, WaitQueue};

pub use config::{
    DEFAULT_PAUSE_MS_MAX, DEFAULT_WAITERS_MAX, DEFAULT_WAITERS_PER_LIMIT_MAX, LimiterConfig,
    PAUSE_MS_MAX, QueueFull, Shares,
};
pub use handle::LimitHandle;
pub use permit::Permit;
pub use request::{Charged, Check, Denied, Kept, Outcome, Request, Status, Statuses};

pub use permit::Used;
use permit::{GrantedPart, renew_parts, settle_parts};
use request::{Answer, status};

#[derive(Debug)]
struct Shared {
    /// A `LimitHandle` on a store that offers an `InProcess` way decides on the counter's
    /// word (`HotCounter`) of its GCRA limits without the store's lock.
    store: Arc<dyn Store>,
    /// Read on every decision, replaced whole on a change: readers take no lock and write no
    /// cache line another thread reads (a read lock would be both, on every decision).
    limits: ArcSwap<LimitTable>,
    /// Serialises changes, so that two concurrent `set_limit`s both land.
    limits_writer: Mutex<()>,
    /// Moves on every change of `limits`, after the new table is in place: a `LimitHandle`
    /// made at an equal generation holds the limit in force.
    generation: AtomicU64,
    waiters: WaitQueue,
    config: LimiterConfig,
    shutting_down: AtomicBool,
    /// Whether the store has answered every decision at once so far (it is in-process):
    /// cleared by the first that it did not.
    answers_now: AtomicBool,
    /// What vendors taught of the limits (`learn.rs`), laid over the configured limits on
    /// every change of the table.
    learning: Mutex<learn::Learning>,
}

impl Shared {
    /// The limits table in force now, borrowed for a short decision.
    fn table_guard(&self) -> arc_swap::Guard<Arc<LimitTable>> {
        self.limits.load()
    }

    /// The limits table in force now.
    fn table(&self) -> Arc<LimitTable> {
        self.limits.load_full()
    }
}

/// The handle applications use: cheap to clone, all clones share one state.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::{Algorithm, Limit, Limiter, Policy, Priority, Request, Reserve};
///
/// let limiter = Limiter::in_memory();
/// let policy = Policy::rate(2, 1_000_000, 0, Algorithm::Sliding, Reserve::default())?;
/// limiter.set_limit(Limit::new("vendor-x", policy, None)?);
///
/// let permit = limiter.acquire(&Request::new("vendor-x")).await?.granted().expect("room");
/// // ... call the vendor ...
/// permit.commit(1).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Limiter {
    shared: Arc<Shared>,
}

/// A request's limits, borrowed from the table in force when it was resolved.
/// Inline for a chain of three limits (user concurrency, user frequency, endpoint).
struct Resolved<'t> {
    limits: SmallVec<[&'t Limit; 3]>,
}

impl<'t> Resolved<'t> {
    fn counter<'r>(&self, index: usize, key: Option<&'r str>) -> CounterId<'r>
    where
        't: 'r,
    {
        let limit = self.limits[index];
        CounterId {
            limit: limit.name(),
            key: limit.per().and(key),
        }
    }

    fn takes<'r>(&self, key: Option<&'r str>) -> SmallVec<[Take<'r>; 3]>
    where
        't: 'r,
    {
        let mut takes = SmallVec::new();
        for (index, limit) in self.limits.iter().enumerate() {
            takes.push(Take {
                counter: self.counter(index, key),
                policy: limit.policy(),
            });
        }
        takes
    }
}

/// A request the limiter's own steps have passed: its limits resolved, and the counters it
/// takes, ready to be asked of the store.
struct Asking<'t> {
    resolved: Resolved<'t>,
    takes: SmallVec<[Take<'t>; 3]>,
}

/// Where a decision stands once the limiter's own steps are done.
enum Step<'t, A> {
    /// Answered without asking the store: waiters of the same or higher priority are ahead.
    Answered(A),
    /// The store is to be asked.
    Ask(Asking<'t>),
}

/// Whether waiters refuse a request: a new request queues behind those of the same or higher
/// priority; the one heading the queue is the request they all wait on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    BehindWaiters,
    Heading,
}

/// How long a waiting request may hold its queues without a grant: the shortest memory of its
/// limits (`Policy::memory_us`: a rate limit's window or GCRA's burst, a lease's TTL). After
/// it, everything granted before the request began to hold has stopped counting, so a request
/// still denied is held back by grants since (a higher priority's, or its own caller's
/// renewed leases), not by the past.
fn hold_bound(resolved: &Resolved<'_>) -> Duration {
    let micros = resolved
        .limits
        .iter()
        .map(|limit| limit.policy().memory_us())
        .min()
        .unwrap_or(0);
    Duration::from_micros(micros)
}

/// Whether a request on `resolved` denied `denied` could still be granted within `left`, as
/// its store sees it. Only a rate limit's denial for room says when room comes at the earliest
/// (a lease may be released at any moment, and a queue's or a pause's denial says nothing of
/// this request's own chances).
fn serviceable(resolved: &Resolved<'_>, denied: &Denied, left: Duration) -> bool {
    denied.reason != DenyReason::Capacity
        || denied.retry_after <= left
        || resolved
            .limits
            .iter()
            .any(|limit| limit.policy().is_concurrency())
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The limits `names` in `table`, checked: at least one, no more than a request may name, none
/// twice, a key for every limit counted per key, a valid key.
/// What `request` asks of the store on `takes`.
fn asked<'a>(takes: &'a [Take<'a>], request: &'a Request<'_>) -> Ask<'a> {
    Ask::new(takes, request.cost, request.priority).with_costs(request.costs_asked())
}

fn resolve<'t>(table: &'t LimitTable, names: &[&str], key: Option<&str>) -> Result<Resolved<'t>> {
    resolve_each(names, key, |name| {
        table
            .get(name)
            .map(|limit| &**limit)
            .ok_or_else(|| Error::UnknownLimit {
                name: name.to_owned(),
            })
    })
}

/// `resolve` with each name's limit found by `find` (in the table, or a handle's own).
fn resolve_each<'t>(
    names: &[&str],
    key: Option<&str>,
    mut find: impl FnMut(&str) -> Result<&'t Limit>,
) -> Result<Resolved<'t>> {
    if names.is_empty() {
        return Err(Error::invalid("limits", "name at least one limit"));
    }
    if names.len() > COUNTERS_PER_REQUEST_MAX {
        return Err(Error::invalid(
            "limits",
            format!("at most {COUNTERS_PER_REQUEST_MAX} limits per request"),
        ));
    }
    check_request_key(key)?;
    let mut limits = SmallVec::new();
    for (index, name) in names.iter().enumerate() {
        if names[..index].contains(name) {
            return Err(Error::invalid(
                "limits",
                format!("limit {name:?} is named twice"),
            ));
        }
        let limit = find(name)?;
        check_key_given(limit, key)?;
        limits.push(limit);
    }
    Ok(Resolved { limits })
}

/// A request's key, if it names one, is a valid key.
#[inline]
fn check_request_key(key: Option<&str>) -> Result<()> {
    match key.map(check_key) {
        Some(Err(reason)) => Err(key_refused(reason)),
        _ => Ok(()),
    }
}

#[cold]
fn key_refused(reason: String) -> Error {
    Error::invalid("key", reason)
}

/// A limit counted per key is asked with a key.
#[inline]
fn check_key_given(limit: &Limit, key: Option<&str>) -> Result<()> {
    match limit.per() {
        Some(per) if key.is_none() => Err(key_missing(limit, per)),
        _ => Ok(()),
    }
}

#[cold]
fn key_missing(limit: &Limit, per: &str) -> Error {
    Error::invalid(
        "key",
        format!("limit {:?} counts per {per}; give a key", limit.name()),
    )
}

impl Limiter {
    pub fn new(store: Arc<dyn Store>, config: LimiterConfig) -> Limiter {
        let shared = Arc::new(Shared {
            store,
            limits: ArcSwap::from_pointee(LimitTable::default()),
            limits_writer: Mutex::new(()),
            generation: AtomicU64::new(0),
            waiters: WaitQueue::default(),
            config,
            shutting_down: AtomicBool::new(false),
            answers_now: AtomicBool::new(true),
            learning: Mutex::new(learn::Learning::new()),
        });
        // Weak: the store lives inside `Shared`, and must not keep it alive.
        let weak = Arc::downgrade(&shared);
        shared.store.tell(News::Wake(Arc::new(move |counter| {
            if let Some(shared) = weak.upgrade() {
                shared.waiters.wake_head(counter);
            }
        })));
        Limiter { shared }
    }

    /// A limiter on a fresh in-memory store: at most a million counters (a hundred thousand keys
    /// per limit), waits up to a minute, pauses up to an hour, a random permit secret,
    /// decisions on this process's monotonic clock.
    pub fn in_memory() -> Limiter {
        let store = MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 1_000_000,
                keys_per_limit_max: 100_000,
            },
            Arc::new(MonotonicClock::new()),
        );
        Limiter::new(Arc::new(store), LimiterConfig::default())
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    pub fn config(&self) -> &LimiterConfig {
        &self.shared.config
    }

    /// Requests waiting in this limiter's queue on `limit` now (every key together): those
    /// that `acquire` queued after a denial, until they are granted or give up.
    pub fn waiting(&self, limit: &str) -> usize {
        self.shared.waiters.waiting_on(limit)
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<LimitTable> {
        self.shared.table()
    }

    fn update_limits(&self, change: impl FnOnce(&LimitTable) -> Option<LimitTable>) -> bool {
        let changed = {
            // A poisoned writer lock guards nothing but the order of writers.
            let _writer = match self.shared.limits_writer.lock() {
                Ok(writer) => writer,
                Err(poisoned) => poisoned.into_inner(),
            };
            match change(&self.shared.limits.load()) {
                Some(next) => {
                    let next = self.overlay_learned(next);
                    // Told under the writer lock, so the store sees the tables in order.
                    self.shared.store.tell(News::Limits(&next));
                    self.shared.limits.store(Arc::new(next));
                    self.shared.generation.fetch_add(1, Ordering::Release);
                    true
                }
                None => false,
            }
        };
        if changed {
            // A new policy may have room where the old had none.
            self.shared.waiters.wake_all();
        }
        changed
    }

    /// Add or replace one limit. Counters keep their state across a policy change.
    pub fn set_limit(&self, limit: Limit) {
        self.update_limits(|table| Some(table.with(limit)));
    }

    /// Remove a limit; returns whether it existed.
    pub fn remove_limit(&self, name: &str) -> bool {
        self.update_limits(|table| table.without(name))
    }

    /// Put a whole new table in force at once (a rules reload).
    pub fn replace_limits(&self, table: LimitTable) {
        self.update_limits(|_| Some(table));
    }

    #[inline]
    fn check_cost(request: &Request<'_>) -> Result<()> {
        let within = |cost: &u64| (1..=UNITS_MAX).contains(cost);
        if request.costs.is_empty() {
            if !within(&request.cost) {
                return Err(Error::invalid(
                    "cost",
                    format!("must be between 1 and {UNITS_MAX}"),
                ));
            }
            return Ok(());
        }
        if request.costs.len() != request.limits.len() {
            return Err(Error::invalid(
                "costs",
                format!(
                    "one cost per limit: {} costs for {} limits",
                    request.costs.len(),
                    request.limits.len()
                ),
            ));
        }
        if let Some(position) = request.costs.iter().position(|cost| !within(cost)) {
            return Err(Error::invalid(
                "costs",
                format!(
                    "the cost of {:?} must be between 1 and {UNITS_MAX}",
                    request.limits[position]
                ),
            ));
        }
        Ok(())
    }

    /// Ask once, without waiting.
    pub async fn try_acquire(&self, request: &Request<'_>) -> Result<Outcome> {
        self.decide_once(request).await
    }

    /// "May I go now": the request's units are granted for good, with nothing to settle
    /// afterwards (no permit, no commit, no refund). The same decision as `acquire` with
    /// `refundable(false)`, waiting up to the request's `wait` likewise; every limit must be a
    /// rate limit, since a lease needs a permit to be released.
    pub async fn check(&self, request: &Request<'_>) -> Result<Check> {
        if request.wait.is_zero() {
            return self.decide_once(request).await;
        }
        // Refused as `check` refuses, before the wait.
        self.resolve_for::<Check>(&self.shared.table_guard(), request, None)?;
        let mut request = request.clone();
        request.refundable = false;
        match self.acquire(&request).await? {
            Outcome::Granted(mut permit) => {
                permit.settled = true;
                let statuses = permit
                    .parts
                    .iter()
                    .map(|granted| status(granted.remaining, granted.reset_after_us));
                Ok(Check::Allowed(statuses.collect()))
            }
            Outcome::Denied(denied) => Ok(Check::Denied(denied)),
        }
    }

    /// One decision without waiting: on the calling thread if the store answers at once,
    /// else awaited.
    async fn decide_once<A: Answer>(&self, request: &Request<'_>) -> Result<A> {
        if self.shared.answers_now.load(Ordering::Relaxed) {
            match self.decide_now(request, None) {
                Some(answer) => return answer,
                // A store that does I/O: no use trying on this thread again.
                None => self.shared.answers_now.store(false, Ordering::Relaxed),
            }
        }
        // A store that does I/O: the same steps, on a table owned across the await.
        let table = self.shared.table();
        let asking =
            match self.prepare::<A>(&table, request, request.key, None, Queue::BehindWaiters)? {
                Step::Answered(answer) => return Ok(answer),
                Step::Ask(asking) => asking,
            };
        let decision = self.ask(&asking, request, A::refundable(request)).await?;
        Ok(A::decided(self, &asking.resolved, request, decision))
    }

    /// One decision without waiting, on the calling thread: `None` when the store cannot
    /// answer at once (it does I/O), with nothing counted. The limits come from the table in
    /// force, borrowed, or from `handle` while its limit is the one in force.
    fn decide_now<A: Answer>(
        &self,
        request: &Request<'_>,
        handle: Option<&LimitHandle>,
    ) -> Option<Result<A>> {
        let table = self.shared.table_guard();
        let asking =
            match self.prepare::<A>(&table, request, request.key, handle, Queue::BehindWaiters) {
                Ok(Step::Answered(answer)) => return Some(Ok(answer)),
                Ok(Step::Ask(asking)) => asking,
                Err(error) => return Some(Err(error)),
            };
        let decision = self
            .ask(&asking, request, A::refundable(request))
            .into_ready()?;
        Some(decision.map(|decision| A::decided(self, &asking.resolved, request, decision)))
    }

    /// The limiter's part of every decision, written once: the request's limits resolved
    /// (from `table`, or from `handle` while its limit is in force) and checked as `A` needs
    /// them, the counters they take, and, for a request that is not `Queue::Heading`, a
    /// `Queued` answer when waiters of the same or higher priority are ahead on any of them.
    /// `key` is the request's own, borrowed for as long as the table.
    fn prepare<'t, A: Answer>(
        &self,
        table: &'t LimitTable,
        request: &Request<'_>,
        key: Option<&'t str>,
        handle: Option<&'t LimitHandle>,
        queue: Queue,
    ) -> Result<Step<'t, A>> {
        let resolved = self.resolve_for::<A>(table, request, handle)?;
        let takes = resolved.takes(key);
        if queue == Queue::BehindWaiters
            && let Some(denied) = self.queued(&resolved, &takes, request.priority)
        {
            return Ok(Step::Answered(A::denied(denied)));
        }
        Ok(Step::Ask(Asking { resolved, takes }))
    }

    /// The store's part: every take granted, or none.
    fn ask<'s>(
        &'s self,
        asking: &'s Asking<'_>,
        request: &'s Request<'_>,
        refundable: bool,
    ) -> StoreFuture<'s, Decision> {
        self.shared
            .store
            .acquire(asked(&asking.takes, request).refundable(refundable))
    }

    /// The store's part for a request that waits: as `ask`, and a denial keeps the request's
    /// place in the store's own queue, if it keeps one (`place`, which gives it up when
    /// dropped unless a grant took it).
    fn ask_waiting<'s>(
        &'s self,
        asking: &'s Asking<'_>,
        request: &'s Request<'_>,
        place: &mut StorePlace,
    ) -> StoreFuture<'s, Decision> {
        place.stand(&asking.takes);
        self.shared.store.acquire(
            asked(&asking.takes, request)
                .refundable(request.refundable)
                .waiter(place.id),
        )
    }

    /// `request`'s limits, checked as `A` needs them.
    fn resolve_for<'t, A: Answer>(
        &self,
        table: &'t LimitTable,
        request: &Request<'_>,
        handle: Option<&'t LimitHandle>,
    ) -> Result<Resolved<'t>> {
        Limiter::check_cost(request)?;
        let resolved = match handle.filter(|handle| handle.in_force()) {
            Some(handle) => resolve_each(&request.limits, request.key, |_| Ok(&*handle.limit))?,
            None => resolve(table, &request.limits, request.key)?,
        };
        resolved
            .limits
            .iter()
            .try_for_each(|limit| A::admits(limit))?;
        Ok(resolved)
    }

    /// A denial for a request that waiters of the same or higher priority are ahead of.
    fn queued(
        &self,
        resolved: &Resolved<'_>,
        takes: &[Take<'_>],
        priority: Priority,
    ) -> Option<Denied> {
        let counters = takes.iter().map(|take| take.counter);
        let retry_at_us = self.shared.waiters.blocked(counters, priority)?;
        Some(self.queued_denial(resolved, retry_at_us))
    }

    /// A handle on the limit `name`, for a hot path that checks it over and over: the name is
    /// looked up once, not on every decision (as governor's limiters are one object per quota).
    /// The handle follows changes to the limits: after a change that leaves its limit as it
    /// was, it goes on as before; once its limit itself changed or went, it looks the name up
    /// on every decision, as `check` does, until it is made again.
    pub fn handle(&self, name: &str) -> Result<LimitHandle> {
        // The generation first: a change between the two reads leaves the handle behind, which
        // only makes it look the name up again.
        let generation = self.shared.generation.load(Ordering::Acquire);
        let table = self.shared.table_guard();
        let limit = table.get(name).ok_or_else(|| Error::UnknownLimit {
            name: name.to_owned(),
        })?;
        // Only an unkeyed limit has one counter a handle can hold.
        let hot = match (self.shared.store.offers().in_process, limit.per()) {
            (Some(memory), None) => memory.hot_counter(Take {
                counter: CounterId {
                    limit: limit.name(),
                    key: None,
                },
                policy: limit.policy(),
            }),
            _ => None,
        };
        Ok(LimitHandle {
            limiter: self.clone(),
            limit: Arc::clone(limit),
            generation: AtomicU64::new(generation),
            hot,
        })
    }

    /// Acquire, waiting up to the request's `wait` for room. Cancel-safe: dropping the future
    /// leaves the queue and holds nothing (with a remote store, a grant whose answer was lost
    /// mid-flight stays counted until it expires, which errs on the safe side).
    pub async fn acquire(&self, request: &Request<'_>) -> Result<Outcome> {
        let wait = request.wait.min(self.shared.config.wait_max);
        if wait.is_zero() {
            return self.try_acquire(request).await;
        }
        Limiter::check_cost(request)?;
        let deadline = Instant::now() + wait;
        let mut last_denial = None;
        let mut place = StorePlace::new(&self.shared.store);
        // When this request first found its counters without room as the head of their
        // queues: from then on it holds others back, for at most its hold bound.
        let mut holding_since: Option<Instant> = None;
        let mut waiter = {
            let table = self.shared.table();
            // Waiters ahead do not answer this request: it joins them instead.
            let Step::Ask(asking) =
                self.prepare::<Outcome>(&table, request, request.key, None, Queue::Heading)?
            else {
                unreachable!("only a request behind waiters is answered before the store")
            };
            let resolved = &asking.resolved;
            let counters: SmallVec<[CounterId<'_>; COUNTERS_PER_REQUEST_MAX]> =
                asking.takes.iter().map(|t| t.counter).collect();
            if self
                .shared
                .waiters
                .blocked(counters.iter().copied(), request.priority)
                .is_none()
            {
                let decision = self.ask_waiting(&asking, request, &mut place).await?;
                match self.outcome(resolved, request, decision) {
                    Outcome::Granted(permit) => {
                        place.granted();
                        return Ok(Outcome::Granted(permit));
                    }
                    Outcome::Denied(denied) => {
                        let now = Instant::now();
                        if denied.reason == DenyReason::Capacity {
                            holding_since = Some(now);
                        }
                        last_denial = Some((denied, now));
                    }
                }
            }
            // A request its store cannot serve before its deadline starts let go.
            let hopeless = last_denial.as_ref().is_some_and(|(denied, at)| {
                !serviceable(resolved, denied, deadline.saturating_duration_since(*at))
            });
            if hopeless {
                place.give_up();
            }
            // Queue behind everyone of the same or higher priority on these counters, if the
            // caps on waiting requests leave room; else the answer is the one found now.
            self.keep_shares(resolved, request, false);
            let caps = Caps {
                waiters_max: self.shared.config.waiters_max,
                waiters_per_limit_max: self.shared.config.waiters_per_limit_max,
            };
            match self.shared.waiters.register(
                &counters,
                request.priority,
                request.costs_asked(),
                hopeless,
                caps,
            ) {
                Ok(waiter) => waiter,
                Err(full) => {
                    let mut denied = match last_denial {
                        Some((denied, _)) => denied,
                        None => {
                            let retry_at_us = self
                                .shared
                                .waiters
                                .blocked(counters.iter().copied(), request.priority)
                                .unwrap_or(0);
                            self.queued_denial(resolved, retry_at_us)
                        }
                    };
                    denied.not_queued = Some(full);
                    return Ok(Outcome::Denied(denied));
                }
            }
        };
        loop {
            if self.shared.shutting_down.load(Ordering::Acquire) {
                return Err(Error::ShuttingDown);
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let mut wake_at = deadline;
            if self.shared.waiters.is_head(&waiter) {
                // Limits may have changed while waiting: resolve again every time.
                let table = self.shared.table();
                let Step::Ask(asking) =
                    self.prepare::<Outcome>(&table, request, request.key, None, Queue::Heading)?
                else {
                    unreachable!("the head of the queue is never answered before the store")
                };
                let let_go = WaitQueue::is_let_go(&waiter);
                // A request let go asks as one that does not wait: behind every place of its
                // priority or higher in the store's queue, holding none of its own.
                let decision = if let_go {
                    self.ask(&asking, request, request.refundable).await?
                } else {
                    self.ask_waiting(&asking, request, &mut place).await?
                };
                let hold_max = hold_bound(&asking.resolved);
                match self.outcome(&asking.resolved, request, decision) {
                    Outcome::Granted(permit) => {
                        place.granted();
                        self.shared.waiters.served(&waiter);
                        // Leaving the queue signals whoever heads it next.
                        drop(waiter);
                        return Ok(Outcome::Granted(permit));
                    }
                    Outcome::Denied(denied) => {
                        let now = Instant::now();
                        if !let_go {
                            if denied.reason == DenyReason::Capacity {
                                holding_since.get_or_insert(now);
                            }
                            let held_to_bound = holding_since
                                .is_some_and(|since| now.duration_since(since) >= hold_max);
                            if held_to_bound
                                || !serviceable(
                                    &asking.resolved,
                                    &denied,
                                    deadline.saturating_duration_since(now),
                                )
                            {
                                self.shared.waiters.let_go(&mut waiter, held_to_bound);
                                place.give_up();
                            }
                        }
                        let retry_at = now + denied.retry_after;
                        wake_at = deadline.min(retry_at);
                        if let Some(since) = holding_since
                            && !WaitQueue::is_let_go(&waiter)
                        {
                            // Wake at the bound, to let go then if still denied.
                            wake_at = wake_at.min(since + hold_max);
                        }
                        // Asking again keeps the place in the store's queue (a request let go
                        // holds none).
                        if !WaitQueue::is_let_go(&waiter)
                            && let Some(renewal) = self
                                .shared
                                .store
                                .offers()
                                .queue
                                .map(|queue| queue.renewal())
                        {
                            wake_at = wake_at.min(Instant::now() + renewal);
                        }
                        self.shared
                            .waiters
                            .set_retry_at(&waiter, micros(retry_at.elapsed_since_origin()));
                        last_denial = Some((denied, Instant::now()));
                    }
                }
            } else {
                // Someone went ahead of it: it holds nothing until it heads its queues again.
                holding_since = None;
                self.shared.waiters.wake_heads_of(&waiter);
            }
            let _ = tokio::time::timeout_at(wake_at, waiter.signal.notified()).await;
        }
        drop(waiter);
        let denied = match last_denial {
            // The hint was for the moment of that denial; count the time spent since.
            Some((mut denied, denied_at)) => {
                denied.retry_after = denied.retry_after.saturating_sub(denied_at.elapsed());
                denied
            }
            None => {
                let table = self.shared.table();
                let resolved = resolve(&table, &request.limits, request.key)?;
                self.queued_denial(&resolved, 0)
            }
        };
        Ok(Outcome::Denied(denied))
    }

    /// With minimum shares on, a grant to a level below `high` counts towards its share of
    /// each rate limit it took (`waiters.rs`). Every decision reaches its answer through
    /// `outcome` or `Check`'s `decided`, which call this.
    fn note_shares(&self, resolved: &Resolved<'_>, request: &Request<'_>, decision: &Decision) {
        if decision.is_granted() {
            self.keep_shares(resolved, request, true);
        }
    }

    /// `request`'s units granted (`false`: none, it is about to wait) on the rate limits of
    /// `resolved`, for their shares, with minimum shares on and below `high`.
    fn keep_shares(&self, resolved: &Resolved<'_>, request: &Request<'_>, granted: bool) {
        let shares = self.shared.config.shares;
        if shares.is_off() || request.priority == Priority::High {
            return;
        }
        for (index, limit) in resolved.limits.iter().enumerate() {
            if let Kind::Rate(rate) = limit.policy().kind() {
                self.shared.waiters.note_grant(
                    resolved.counter(index, request.key),
                    request.priority,
                    if granted {
                        request.costs_asked().of(index)
                    } else {
                        0
                    },
                    Duration::from_micros(rate.window_us()),
                    shares.units_of(rate.limit()),
                );
            }
        }
    }

    fn queued_denial(&self, resolved: &Resolved<'_>, retry_at_us: u64) -> Denied {
        let now_us = micros(Instant::now().elapsed_since_origin());
        Denied {
            // Not exact: it depends on the requests ahead; the head's own hint, at least 1 ms.
            retry_after: Duration::from_micros(retry_at_us.saturating_sub(now_us).max(1_000)),
            reason: DenyReason::Queued,
            limits: resolved
                .limits
                .iter()
                .map(|limit| LimitStatus {
                    name: limit.name().to_owned(),
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    fence: None,
                    lease_expires_in: None,
                })
                .collect(),
            not_queued: None,
            kept: None,
        }
    }

    fn outcome(
        &self,
        resolved: &Resolved<'_>,
        request: &Request<'_>,
        decision: Decision,
    ) -> Outcome {
        self.note_shares(resolved, request, &decision);
        let key = request.key;
        if decision.is_granted() {
            // Sized once: a chain's parts spill from the one held inline, and growing by
            // doubling would move them twice.
            let mut parts = SmallVec::with_capacity(decision.outcomes().len());
            for (index, outcome) in decision.outcomes().iter().enumerate() {
                if let CounterOutcome::Granted(grant) = outcome {
                    let limit = &resolved.limits[index];
                    parts.push(GrantedPart {
                        part: Part {
                            limit: limit.name().into(),
                            key: resolved.counter(index, key).key.map(Box::from),
                            seq: grant.seq,
                            lease: limit.policy().is_concurrency(),
                        },
                        refundable: request.refundable,
                        remaining: grant.remaining,
                        reset_after_us: grant.reset_after_us,
                        lease_expires_in_us: grant
                            .lease_expires_at
                            .map(|at| at.saturating_sub(decision.now_us)),
                    });
                }
            }
            return Outcome::Granted(Permit {
                shared: self.shared.clone(),
                parts,
                decided_at_us: decision.now_us,
                settled: false,
            });
        }
        Outcome::Denied(Limiter::denied(resolved, &decision))
    }

    /// What a caller sees of a denial.
    fn denied(resolved: &Resolved<'_>, decision: &Decision) -> Denied {
        let mut reason = DenyReason::Capacity;
        let mut kept: Option<Kept> = None;
        let limits = decision
            .outcomes()
            .iter()
            .zip(&resolved.limits)
            .map(|(outcome, limit)| {
                let (remaining, wait_us) = match outcome {
                    CounterOutcome::Denied(denial) => {
                        reason = reason.most_telling(denial.reason);
                        // Units left beyond what is open to the request: a reserve keeps them.
                        if denial.reason == DenyReason::Capacity
                            && denial.left > denial.remaining
                            && kept.is_none()
                        {
                            kept = Some(Kept {
                                limit: limit.name().to_owned(),
                                left: denial.left,
                            });
                        }
                        (denial.remaining, denial.retry_after_us)
                    }
                    CounterOutcome::Allowed { remaining } => (*remaining, 0),
                    CounterOutcome::Granted(grant) => (grant.remaining, grant.reset_after_us),
                };
                LimitStatus {
                    name: limit.name().to_owned(),
                    remaining,
                    reset_after: Duration::from_micros(wait_us),
                    fence: None,
                    lease_expires_in: None,
                }
            })
            .collect();
        Denied {
            retry_after: Duration::from_micros(decision.retry_after_us()),
            // Only when capacity is the reason given: a pause or hold is the news otherwise.
            kept: kept.filter(|_| reason == DenyReason::Capacity),
            reason,
            limits,
            not_queued: None,
        }
    }

    /// Commit a permit by id: refund `cost - used` of its rate units, release its leases.
    pub async fn commit(&self, id: &str, used: u64) -> Result<Committed> {
        self.commit_used(id, Used::All(used)).await
    }

    /// `commit` with what was used of each rate limit, by name (`Permit::commit_used`).
    pub async fn commit_used(&self, id: &str, used: Used<'_>) -> Result<Committed> {
        let parts = decode(&self.shared.config.permit_secret, id)?;
        used.check(parts.iter())?;
        settle_parts(&self.shared, parts.iter(), used).await
    }

    /// Renew every lease of a permit, by id. Returns the time until the earliest expiry.
    pub async fn renew(&self, id: &str) -> Result<Duration> {
        let parts = decode(&self.shared.config.permit_secret, id)?;
        renew_parts(&self.shared, parts.iter()).await
    }

    /// Grant nothing on `limit` (and `key`, for a limit counted per key; without a key, on every
    /// key) for `duration`, cut to `LimiterConfig::pause_max`, in every process sharing the
    /// store. Pauses only extend. Returns the time until the pause ends.
    pub async fn pause(
        &self,
        limit: &str,
        key: Option<&str>,
        duration: Duration,
    ) -> Result<Duration> {
        if duration.is_zero() {
            return Err(Error::invalid("retry_after_ms", "must be at least 1"));
        }
        let duration = duration.min(self.pause_max());
        let (target, key) = self.pause_target(limit, key)?;
        let take = target.take(key);
        let paused = self
            .shared
            .store
            .adjust(
                take,
                Adjust::Pause {
                    for_us: micros(duration),
                },
            )
            .await?;
        Ok(Duration::from_micros(paused.paused_for_us))
    }

    /// The longest pause this limiter grants: its configured `pause_max`, at most a day.
    pub fn pause_max(&self) -> Duration {
        self.shared
            .config
            .pause_max
            .min(Duration::from_millis(PAUSE_MS_MAX))
    }

    /// Lift the pause on `limit` (with `key`, that key's own pause; without, the limit-wide
    /// pause), in every process sharing the store: an administrator's undo of `pause`. A hold
    /// after a loss of state is not a pause and stays. Returns whether a pause was on.
    pub async fn resume(&self, limit: &str, key: Option<&str>) -> Result<bool> {
        let (target, key) = self.pause_target(limit, key)?;
        let take = target.take(key);
        Ok(self
            .shared
            .store
            .adjust(take, Adjust::Resume)
            .await?
            .changed)
    }

    /// The limit a pause or resume is about, and its key, checked: a key only for a limit
    /// counted per key, and a valid one; none stands for the whole limit.
    fn pause_target<'k>(
        &self,
        limit: &str,
        key: Option<&'k str>,
    ) -> Result<(Arc<Limit>, Option<&'k str>)> {
        // Without a key, a limit counted per key stands for every key.
        let target =
            self.shared
                .table()
                .get(limit)
                .cloned()
                .ok_or_else(|| Error::UnknownLimit {
                    name: limit.to_owned(),
                })?;
        if let Some(key) = key {
            if target.per().is_none() {
                return Err(Error::invalid(
                    "key",
                    format!("limit {limit:?} is not counted per key"),
                ));
            }
            check_key(key).map_err(|reason| Error::invalid("key", reason))?;
        }
        Ok((target, key))
    }

    /// Forget what `limit`'s counter (the key's, for a limit counted per key, which must be
    /// given) counts, in every process sharing the store: its usage, its open reservations
    /// and the key's own pause (`Adjust::Reset`), after a mistaken lockout. An administrator's
    /// power: it grants what the limit had counted. A rate limit only: a concurrency limit's
    /// leases end when released or when their TTL runs out, and forgetting them would let
    /// more holders in than it allows. Returns whether the store held the counter.
    pub async fn reset(&self, limit: &str, key: Option<&str>) -> Result<bool> {
        let table = self.shared.table();
        let resolved = resolve(&table, &[limit], key)?;
        let target = resolved.limits[0];
        if target.policy().is_concurrency() {
            return Err(Error::invalid(
                "limit",
                format!(
                    "limit {limit:?} is a concurrency limit: its leases end when released or \
                     when their TTL runs out, and a reset would let more holders in than it \
                     allows"
                ),
            ));
        }
        let take = target.take(key.filter(|_| target.per().is_some()));
        let held = self.shared.store.adjust(take, Adjust::Reset).await?.changed;
        // Its units are free: whoever waits on it may be granted now.
        self.shared.waiters.wake_head(take.counter);
        Ok(held)
    }

    /// Count units spent beyond any grant (`Adjust::Charge`): `request`'s cost (or costs, one
    /// per limit) on each of its limits, at the store's now, even past the limit, in every
    /// process sharing the store. What a vendor counted over what was reserved (a language
    /// model's answer longer than its estimate, a top-up that could not be had) becomes a
    /// debt that every later grant waits out, rather than a local note one process pays.
    /// Never denied; at most one capacity is counted past each limit (`Counter::debit`).
    /// Rate limits only: a lease is held, never spent. Returns, per limit, the units counted
    /// and the counter's usage after.
    pub async fn charge(&self, request: &Request<'_>) -> Result<Vec<Charged>> {
        Limiter::check_cost(request)?;
        let table = self.shared.table();
        let resolved = resolve(&table, &request.limits, request.key)?;
        if let Some(lease) = resolved
            .limits
            .iter()
            .find(|limit| limit.policy().is_concurrency())
        {
            return Err(Error::invalid(
                "limits",
                format!(
                    "limit {:?} is a concurrency limit: a lease is held and released, never \
                     spent, so it cannot be charged",
                    lease.name()
                ),
            ));
        }
        let costs = request.costs_asked();
        let mut charged = Vec::with_capacity(resolved.limits.len());
        for (index, take) in resolved.takes(request.key).into_iter().enumerate() {
            let adjusted = self
                .shared
                .store
                .adjust(
                    take,
                    Adjust::Charge {
                        units: costs.of(index),
                    },
                )
                .await?;
            let usage = self.shared.store.usage(take).await?;
            charged.push(Charged {
                name: take.counter.limit.to_owned(),
                charged: adjusted.charged,
                usage,
            });
        }
        Ok(charged)
    }

    /// What `limit`'s counter (the key's, for a limit counted per key) holds now, for people
    /// and dashboards: it changes nothing, and may be stale by the time it is read.
    pub async fn usage(&self, limit: &str, key: Option<&str>) -> Result<Usage> {
        let table = self.shared.table();
        let resolved = resolve(&table, &[limit], key)?;
        let target = resolved.limits[0];
        let take = target.take(key.filter(|_| target.per().is_some()));
        self.shared.store.usage(take).await
    }

    /// Stop taking waits: every waiting acquire returns `ShuttingDown` now, and so does every
    /// new one that would wait. Requests that do not wait are still answered.
    pub fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        self.shared.waiters.wake_all();
    }
}

trait ElapsedSinceOrigin {
    fn elapsed_since_origin(&self) -> Duration;
}

impl ElapsedSinceOrigin for Instant {
    /// Monotonic microseconds relative to a process-wide origin, for queue hints.
    fn elapsed_since_origin(&self) -> Duration {
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let origin = *ORIGIN.get_or_init(Instant::now);
        self.saturating_duration_since(origin)
    }
}
