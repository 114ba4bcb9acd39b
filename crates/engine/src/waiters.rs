//! The queue of requests waiting in this process, and how they are woken.
//!
//! Every waiting request has an order `(priority, ticket)`: higher priority first, then first
//! come first served. Each counter keeps its waiters sorted by that order, and only a request
//! that heads the queue of *every* counter it needs may ask the store. Because the order is one
//! total order over all waiters, the request that is smallest overall heads all its queues,
//! so some request can always proceed: no two waiters block each other in a cycle.
//!
//! A head that is denied sleeps for the store's exact retry hint; the others sleep until they
//! become head. Anything that may free capacity (a refund, a release, a head leaving, a policy
//! change) signals the head of the affected queue. A `Signal` remembers a notification that
//! arrives before its waiter sleeps, so no wake-up is lost; a waiter dropped mid-wait leaves
//! every queue and signals the new heads, so cancellation holds nothing.
//!
//! A head holds everyone of its priority or lower back, so it holds only while it can be
//! served (docs/security.md, *A waiting request*): a waiter whose store says it cannot be
//! granted before its deadline, or that has headed its queues for its hold bound (the
//! shortest memory of its limits: a rate limit's window, a lease's TTL) without a grant, is
//! *let go*: it keeps waiting and asking, ranked behind every priority, so it holds nobody
//! back. A counter whose queue was held to the bound remembers the cost that was let go
//! (`Queues::marks`), and a later waiter of that cost or more starts let go, until a waiting
//! request of that cost is granted on the counter: asking again does not buy a new hold.
//!
//! With minimum shares on (`LimiterConfig::shares`), priority stays strict but for one thing: a
//! level below `high` that has been granted less than its share of a rate limit's units over
//! the last period, and waits on that limit alone, is owed, and its first waiter heads the
//! queue ahead of every priority until the level has its share (`Served`). The waiter is not
//! moved: which waiter heads a queue is worked out whenever it is asked (`head`), and only a
//! waiter on one counter can be owed, so the heads still follow one total order and no two
//! waiters block each other. A head that finds it no longer heads (a level became owed as
//! time passed) wakes the one that does.

use std::collections::{BTreeMap, HashMap};

use indexmap::IndexMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use tollgate_core::Priority;

use crate::limiter::QueueFull;
use crate::store::{Costs, CounterId};
use std::sync::Arc;

use crate::sync::{AtomicUsize, Mutex, Ordering, lock};

/// A one-slot wake-up flag: `notify` before `notified` is polled is remembered, not lost.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    state: Mutex<SignalState>,
}

#[derive(Debug, Default)]
struct SignalState {
    notified: bool,
    waker: Option<Waker>,
}

impl Signal {
    pub(crate) fn notify(&self) {
        let waker = {
            let mut state = lock(&self.state);
            state.notified = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    pub(crate) fn notified(&self) -> Notified<'_> {
        Notified { signal: self }
    }
}

#[derive(Debug)]
pub(crate) struct Notified<'a> {
    signal: &'a Signal,
}

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = lock(&self.signal.state);
        if state.notified {
            state.notified = false;
            Poll::Ready(())
        } else {
            state.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

/// Position in every queue: lower sorts first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Order {
    /// 0 for high, 1 for normal, 2 for low; `LET_GO` more for a waiter that holds nobody
    /// back.
    rank: u8,
    ticket: u64,
}

/// Added to the rank of a waiter that was let go: behind every priority, so that no request
/// is queued behind it; among such waiters, by priority, then first come first served.
const LET_GO: u8 = 3;

/// What a counter remembers of the waiters let go after holding its queue to the bound.
#[derive(Clone, Copy, Debug)]
struct Mark {
    cost: u64,
    rank: u8,
}

/// Counters whose let-go cost is remembered at most; past it the oldest mark is forgotten,
/// which gives one more waiter one more hold bound, never a grant.
pub(crate) const MARKS_MAX: usize = 1024;

fn rank(priority: Priority) -> u8 {
    match priority {
        Priority::High => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}

type QueueKey = (Box<str>, Option<Box<str>>);

fn queue_key(counter: CounterId<'_>) -> QueueKey {
    (counter.limit.into(), counter.key.map(Into::into))
}

/// A waiter in one counter's queue: its wake-up, and whether this is the only counter it
/// waits on (only such a waiter can be owed a share).
#[derive(Clone, Debug)]
struct Entry {
    signal: Arc<Signal>,
    single: bool,
}

#[derive(Debug, Default)]
struct CounterQueue {
    waiters: BTreeMap<Order, Entry>,
    /// When the head expects to be granted, from its last denial (monotonic micros).
    head_retry_at_us: u64,
}

#[derive(Debug, Default)]
struct Queues {
    next_ticket: u64,
    by_counter: HashMap<QueueKey, CounterQueue>,
    /// Waiters per limit name, all keys together (only limits someone waits on).
    by_limit: HashMap<Box<str>, usize>,
    /// Per counter, the least cost let go after holding its queue to the bound, and the
    /// highest rank let go at it: a waiter of that cost or more, at that priority or lower,
    /// starts let go. Oldest first, at most `MARKS_MAX`.
    marks: IndexMap<QueueKey, Mark>,
    /// Per counter, what the levels below `high` were granted over its last period, while
    /// minimum shares are on. Oldest first, at most `SERVED_MAX`.
    served: IndexMap<QueueKey, Served>,
}

/// Counters whose grants to the levels below `high` are remembered at most; past it the one
/// kept longest is forgotten, which can owe its levels one more share, never a grant past a
/// limit.
pub(crate) const SERVED_MAX: usize = 4096;

/// What one counter granted to `normal` (index 0) and `low` (index 1) over its last period,
/// against each level's share of it.
/// Times are tokio's `Instant`s: the runtime's own clock (paused in tests), as waiting sleeps.
#[derive(Debug, Default)]
struct Served {
    window: Duration,
    share_units: [u64; 2],
    /// Grants as (when, units), oldest first; only as many as can still decide "owed".
    grants: [std::collections::VecDeque<(Instant, u64)>; 2],
}

impl Served {
    /// Whether `level` was granted less than its share over the period up to `now`.
    fn owed(&self, level: usize, now: Instant) -> bool {
        let share = self.share_units[level];
        if share == 0 {
            return false;
        }
        let mut granted = 0;
        for &(at, units) in self.grants[level].iter().rev() {
            if at + self.window <= now {
                break;
            }
            granted += units;
            if granted >= share {
                return false;
            }
        }
        true
    }

    fn note(&mut self, level: usize, units: u64, now: Instant) {
        if units == 0 {
            return;
        }
        let grants = &mut self.grants[level];
        grants.push_back((now, units));
        // What fell out of the period, and what the newer grants already cover, decides
        // nothing any more.
        let mut newer = 0;
        let mut keep = 0;
        for &(at, units) in grants.iter().rev() {
            if at + self.window <= now || newer >= self.share_units[level] {
                break;
            }
            newer += units;
            keep += 1;
        }
        let drop = grants.len() - keep.max(1);
        grants.drain(..drop);
    }
}

/// The level index of `Served` for `priority` (its rank less one); `high` has no share.
fn share_level(priority: Priority) -> Option<usize> {
    usize::from(rank(priority)).checked_sub(1)
}

/// Who heads `queue` now, and whether as owed: the first waiter of the highest level owed its
/// share (by `served`), else the first in priority order.
fn head<'q>(
    queue: &'q CounterQueue,
    served: Option<&Served>,
) -> Option<(&'q Order, &'q Entry, bool)> {
    if let Some(served) = served {
        let now = Instant::now();
        for priority in [Priority::Normal, Priority::Low] {
            if !share_level(priority).is_some_and(|level| served.owed(level, now)) {
                continue;
            }
            let level_rank = rank(priority);
            let first = Order {
                rank: level_rank,
                ticket: 0,
            };
            let past = Order {
                rank: level_rank + 1,
                ticket: 0,
            };
            if let Some((order, entry)) = queue
                .waiters
                .range(first..past)
                .find(|(_, entry)| entry.single)
            {
                return Some((order, entry, true));
            }
        }
    }
    queue
        .waiters
        .first_key_value()
        .map(|(order, entry)| (order, entry, false))
}

impl Queues {
    /// Who heads `key`'s queue now, and whether as owed (see `head`).
    fn head_of(&self, key: &QueueKey) -> Option<(&Order, &Entry, bool)> {
        let queue = self.by_counter.get(key)?;
        head(queue, self.served.get(key))
    }
}

/// The caps on waiting requests (`LimiterConfig`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    pub(crate) waiters_max: usize,
    pub(crate) waiters_per_limit_max: usize,
}

#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    queues: Mutex<Queues>,
    /// Waiters registered now; lets requests skip the lock when nobody waits.
    waiting: AtomicUsize,
}

/// A registered waiter. Leaves every queue when dropped.
#[derive(Debug)]
pub(crate) struct Waiter<'q> {
    queue: &'q WaitQueue,
    order: Order,
    /// What it asks of each counter, in `keys`' order.
    costs: Vec<u64>,
    keys: Vec<QueueKey>,
    /// The limits it counts on, each once.
    limits: Vec<Box<str>>,
    pub(crate) signal: Arc<Signal>,
}

impl WaitQueue {
    /// Whether any request waits in this process: while none does, nothing can block another.
    #[inline]
    pub(crate) fn anyone_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire) != 0
    }

    /// Whether a request of `priority` on `counters` must queue behind someone: a waiter of the
    /// same or higher priority already waits on one of them.
    #[inline]
    pub(crate) fn blocked<'c>(
        &self,
        counters: impl IntoIterator<Item = CounterId<'c>>,
        priority: Priority,
    ) -> Option<u64> {
        if !self.anyone_waiting() {
            return None;
        }
        self.blocked_in_queues(counters, priority)
    }

    fn blocked_in_queues<'c>(
        &self,
        counters: impl IntoIterator<Item = CounterId<'c>>,
        priority: Priority,
    ) -> Option<u64> {
        let queues = lock(&self.queues);
        let mut blocked_until = None;
        for counter in counters {
            let key = queue_key(counter);
            if let Some(queue) = queues.by_counter.get(&key)
                && let Some((order, _, owed)) = queues.head_of(&key)
                // A head ranked below the request holds it back only when owed its share.
                && (owed || order.rank <= rank(priority))
            {
                blocked_until = Some(blocked_until.unwrap_or(0).max(queue.head_retry_at_us));
            }
        }
        blocked_until
    }

    /// Queue a request on `counters`, unless `caps` are full: then it is not queued, and the
    /// answer says which cap.
    /// A waiter starts let go where a counter remembers a cost as large as its own there let
    /// go, or when `let_go` says so.
    pub(crate) fn register(
        &self,
        counters: &[CounterId<'_>],
        priority: Priority,
        costs: Costs<'_>,
        let_go: bool,
        caps: Caps,
    ) -> Result<Waiter<'_>, QueueFull> {
        let mut queues = lock(&self.queues);
        // Changed under this lock only, so it is exact here.
        if self.waiting.load(Ordering::Acquire) >= caps.waiters_max {
            return Err(QueueFull::Overall {
                waiters_max: caps.waiters_max,
            });
        }
        let mut limits: Vec<Box<str>> = Vec::with_capacity(counters.len());
        for counter in counters {
            if limits.iter().any(|limit| **limit == *counter.limit) {
                continue;
            }
            let waiting = queues.by_limit.get(counter.limit).copied().unwrap_or(0);
            if waiting >= caps.waiters_per_limit_max {
                return Err(QueueFull::Limit {
                    limit: counter.limit.to_owned(),
                    waiters_per_limit_max: caps.waiters_per_limit_max,
                });
            }
            limits.push(counter.limit.into());
        }
        for limit in &limits {
            *queues.by_limit.entry(limit.clone()).or_default() += 1;
        }
        let keys: Vec<QueueKey> = counters.iter().map(|c| queue_key(*c)).collect();
        let costs: Vec<u64> = (0..keys.len()).map(|index| costs.of(index)).collect();
        let marked = keys.iter().zip(&costs).any(|(key, &cost)| {
            queues
                .marks
                .get(key)
                .is_some_and(|mark| cost >= mark.cost && rank(priority) >= mark.rank)
        });
        let order = Order {
            rank: if let_go || marked {
                LET_GO + rank(priority)
            } else {
                rank(priority)
            },
            ticket: queues.next_ticket,
        };
        queues.next_ticket += 1;
        let signal = Arc::new(Signal::default());
        let single = keys.len() == 1;
        for key in &keys {
            queues
                .by_counter
                .entry(key.clone())
                .or_default()
                .waiters
                .insert(
                    order,
                    Entry {
                        signal: signal.clone(),
                        single,
                    },
                );
        }
        self.waiting.fetch_add(1, Ordering::Release);
        Ok(Waiter {
            queue: self,
            order,
            costs,
            keys,
            limits,
            signal,
        })
    }

    /// Requests queued on `limit` now, every key together.
    pub(crate) fn waiting_on(&self, limit: &str) -> usize {
        if !self.anyone_waiting() {
            return 0;
        }
        lock(&self.queues).by_limit.get(limit).copied().unwrap_or(0)
    }

    /// Whether `waiter` heads the queue of every counter it needs.
    pub(crate) fn is_head(&self, waiter: &Waiter<'_>) -> bool {
        let queues = lock(&self.queues);
        waiter.keys.iter().all(|key| {
            queues
                .head_of(key)
                .is_some_and(|(order, _, _)| *order == waiter.order)
        })
    }

    /// For a waiter that found it does not head its queues: wake whoever heads them, which
    /// may have changed with no one told (a level became owed its share as time passed).
    pub(crate) fn wake_heads_of(&self, waiter: &Waiter<'_>) {
        let heads: Vec<Arc<Signal>> = {
            let queues = lock(&self.queues);
            if queues.served.is_empty() {
                return;
            }
            waiter
                .keys
                .iter()
                .filter_map(|key| queues.head_of(key))
                .filter(|(order, _, _)| **order != waiter.order)
                .map(|(_, entry, _)| entry.signal.clone())
                .collect()
        };
        for signal in heads {
            signal.notify();
        }
    }

    /// A grant of `units` at `priority` on `counter`, a rate limit whose window is
    /// `window` and whose levels' shares are `share_units` (normal, low): counted towards
    /// the level's share. Only with minimum shares on. With `units` 0 (a request about to
    /// wait), the counter's shares are only kept from now on: a level never granted is owed.
    pub(crate) fn note_grant(
        &self,
        counter: CounterId<'_>,
        priority: Priority,
        units: u64,
        window: Duration,
        share_units: [u64; 2],
    ) {
        let Some(level) = share_level(priority) else {
            return;
        };
        let now = Instant::now();
        let mut queues = lock(&self.queues);
        let key = queue_key(counter);
        if !queues.served.contains_key(&key) && queues.served.len() >= SERVED_MAX {
            queues.served.shift_remove_index(0);
        }
        let served = queues.served.entry(key).or_default();
        served.window = window;
        served.share_units = share_units;
        served.note(level, units, now);
    }

    /// Whether `waiter` was let go: it holds nobody back.
    pub(crate) fn is_let_go(waiter: &Waiter<'_>) -> bool {
        waiter.order.rank >= LET_GO
    }

    /// Let `waiter` go: it moves behind every priority in each of its queues, and whoever
    /// heads one now is signalled. `held_to_bound`: it headed its queues for its whole hold
    /// bound, so each counter remembers its cost (`Queues::marks`).
    pub(crate) fn let_go(&self, waiter: &mut Waiter<'_>, held_to_bound: bool) {
        if WaitQueue::is_let_go(waiter) {
            return;
        }
        let moved = Order {
            rank: LET_GO + waiter.order.rank,
            ..waiter.order
        };
        let mut heads = Vec::new();
        {
            let mut queues = lock(&self.queues);
            for (key, &cost) in waiter.keys.iter().zip(&waiter.costs) {
                if let Some(queue) = queues.by_counter.get_mut(key)
                    && let Some(entry) = queue.waiters.remove(&waiter.order)
                {
                    queue.waiters.insert(moved, entry);
                }
                if let Some((order, next, _)) = queues.head_of(key)
                    && *order != moved
                {
                    heads.push(next.signal.clone());
                }
                if held_to_bound {
                    let mark = match queues.marks.get(key) {
                        None => Mark {
                            cost,
                            rank: waiter.order.rank,
                        },
                        Some(mark) => Mark {
                            cost: mark.cost.min(cost),
                            rank: mark.rank.min(waiter.order.rank),
                        },
                    };
                    queues.marks.shift_remove(key);
                    if queues.marks.len() >= MARKS_MAX {
                        queues.marks.shift_remove_index(0);
                    }
                    queues.marks.insert(key.clone(), mark);
                }
            }
        }
        waiter.order = moved;
        for signal in heads {
            signal.notify();
        }
    }

    /// A waiting request of `cost` was granted on `waiter`'s counters: those counters can
    /// serve that cost, so they forget a mark it covers.
    pub(crate) fn served(&self, waiter: &Waiter<'_>) {
        let mut queues = lock(&self.queues);
        if queues.marks.is_empty() {
            return;
        }
        for (key, &cost) in waiter.keys.iter().zip(&waiter.costs) {
            if queues.marks.get(key).is_some_and(|mark| cost >= mark.cost) {
                queues.marks.shift_remove(key);
            }
        }
    }

    /// Record when the head of `waiter`'s queues expects its grant (for requests that will not
    /// wait and ask when to come back).
    pub(crate) fn set_retry_at(&self, waiter: &Waiter<'_>, retry_at_us: u64) {
        let mut queues = lock(&self.queues);
        for key in &waiter.keys {
            if let Some(queue) = queues.by_counter.get_mut(key) {
                queue.head_retry_at_us = retry_at_us;
            }
        }
    }

    /// Signal the head waiter of `counter`'s queue, if any: capacity may have come back.
    pub(crate) fn wake_head(&self, counter: CounterId<'_>) {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let head = {
            let queues = lock(&self.queues);
            queues
                .head_of(&queue_key(counter))
                .map(|(_, entry, _)| entry.signal.clone())
        };
        if let Some(signal) = head {
            signal.notify();
        }
    }

    /// Signal every waiter (limits changed, or shutting down).
    pub(crate) fn wake_all(&self) {
        let signals: Vec<Arc<Signal>> = {
            let queues = lock(&self.queues);
            queues
                .by_counter
                .values()
                .flat_map(|queue| queue.waiters.values().map(|entry| entry.signal.clone()))
                .collect()
        };
        for signal in signals {
            signal.notify();
        }
    }

    fn leave(&self, waiter: &Waiter<'_>) {
        let mut heads = Vec::new();
        {
            let mut queues = lock(&self.queues);
            for key in &waiter.keys {
                let was_head = queues
                    .head_of(key)
                    .is_some_and(|(order, _, _)| *order == waiter.order);
                let Some(queue) = queues.by_counter.get_mut(key) else {
                    continue;
                };
                queue.waiters.remove(&waiter.order);
                if queue.waiters.is_empty() {
                    queues.by_counter.remove(key);
                } else if (was_head || queues.served.contains_key(key))
                    && let Some((_, next, _)) = queues.head_of(key)
                {
                    // With shares, the grant that ends a wait may end its level's debt as
                    // well, so who heads next can change even when it did not head: tell them.
                    heads.push(next.signal.clone());
                }
            }
            for limit in &waiter.limits {
                if let Some(waiting) = queues.by_limit.get_mut(limit) {
                    *waiting -= 1;
                    if *waiting == 0 {
                        queues.by_limit.remove(limit);
                    }
                }
            }
            self.waiting.fetch_sub(1, Ordering::Release);
        }
        for signal in heads {
            signal.notify();
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.queue.leave(self);
    }
}

/// A waiting request's place in the store's own queue (a store shared between processes may
/// keep one, `Offers::queue`): the counters it last asked for, and whether the store
/// may hold a place for it. Dropped without a grant (the deadline passed, the caller went
/// away), it gives the place up in a task of its own, so a cancelled request holds nothing in
/// the store either; with no runtime to run that task, the place lapses on its own.
pub(crate) struct StorePlace {
    store: Arc<dyn crate::store::Store>,
    pub(crate) id: crate::store::WaiterId,
    /// The counters of the last ask, owned: `None` while the store holds no place.
    counters: Option<Vec<OwnedCounter>>,
}

/// A counter's limit and key, owned.
type OwnedCounter = (Box<str>, Option<Box<str>>);

impl StorePlace {
    pub(crate) fn new(store: &Arc<dyn crate::store::Store>) -> StorePlace {
        StorePlace {
            store: Arc::clone(store),
            id: crate::store::WaiterId::random(),
            counters: None,
        }
    }

    /// About to ask for `takes`: a denial may leave a place on each.
    pub(crate) fn stand(&mut self, takes: &[crate::store::Take<'_>]) {
        if self.store.offers().queue.is_none() {
            return;
        }
        let same = self.counters.as_ref().is_some_and(|counters| {
            counters.len() == takes.len()
                && counters.iter().zip(takes).all(|((limit, key), take)| {
                    **limit == *take.counter.limit && key.as_deref() == take.counter.key
                })
        });
        if !same {
            // The first ask, or limits changed while waiting (places on counters no longer
            // asked for lapse on their own): the counters to give up.
            self.counters = Some(
                takes
                    .iter()
                    .map(|take| (take.counter.limit.into(), take.counter.key.map(Box::from)))
                    .collect(),
            );
        }
    }

    /// The request was let go: it gives its place up now, as when dropped, and keeps no
    /// other.
    pub(crate) fn give_up(&mut self) {
        let store = Arc::clone(&self.store);
        *self = StorePlace::new(&store);
    }

    /// The store granted the request: a grant takes the place with it.
    pub(crate) fn granted(&mut self) {
        self.counters = None;
    }
}

impl Drop for StorePlace {
    fn drop(&mut self) {
        let Some(counters) = self.counters.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, id) = (Arc::clone(&self.store), self.id);
        runtime.spawn(async move {
            let ids: Vec<CounterId<'_>> = counters
                .iter()
                .map(|(limit, key)| CounterId {
                    limit,
                    key: key.as_deref(),
                })
                .collect();
            // A place that cannot be given up (the store is down) lapses on its own.
            if let Some(queue) = store.offers().queue {
                let _ = queue.leave(&ids, id).await;
            }
        });
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    /// The counters whose shares are kept are bounded, whatever the keys callers bring: past
    /// `SERVED_MAX` the one kept longest goes.
    #[test]
    fn the_shares_kept_are_bounded_by_served_max() {
        let queue = WaitQueue::default();
        for key in 0..SERVED_MAX + 100 {
            let key = key.to_string();
            queue.note_grant(
                CounterId {
                    limit: "per-user",
                    key: Some(&key),
                },
                Priority::Low,
                1,
                Duration::from_secs(60),
                [0, 1],
            );
        }
        let queues = lock(&queue.queues);
        assert_eq!(queues.served.len(), SERVED_MAX);
        assert!(
            !queues
                .served
                .contains_key(&("per-user".into(), Some("0".into())))
        );
        assert!(queues.served.contains_key(&(
            "per-user".into(),
            Some((SERVED_MAX + 99).to_string().into())
        )));
    }
}
