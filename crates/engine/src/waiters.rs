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

use std::collections::{BTreeMap, HashMap};

use indexmap::IndexMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tollgate_core::Priority;

use crate::limiter::QueueFull;
use crate::store::CounterId;
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

#[derive(Debug, Default)]
struct CounterQueue {
    waiters: BTreeMap<Order, Arc<Signal>>,
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
    cost: u64,
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
                && let Some((order, _)) = queue.waiters.first_key_value()
                && order.rank <= rank(priority)
            {
                blocked_until = Some(blocked_until.unwrap_or(0).max(queue.head_retry_at_us));
            }
        }
        blocked_until
    }

    /// Queue a request on `counters`, unless `caps` are full: then it is not queued, and the
    /// answer says which cap.
    /// A waiter of `cost` starts let go where a counter remembers a cost as large let go,
    /// or when `let_go` says so.
    pub(crate) fn register(
        &self,
        counters: &[CounterId<'_>],
        priority: Priority,
        cost: u64,
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
        let marked = keys.iter().any(|key| {
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
        for key in &keys {
            queues
                .by_counter
                .entry(key.clone())
                .or_default()
                .waiters
                .insert(order, signal.clone());
        }
        self.waiting.fetch_add(1, Ordering::Release);
        Ok(Waiter {
            queue: self,
            order,
            cost,
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
                .by_counter
                .get(key)
                .and_then(|queue| queue.waiters.first_key_value())
                .is_some_and(|(order, _)| *order == waiter.order)
        })
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
            for key in &waiter.keys {
                if let Some(queue) = queues.by_counter.get_mut(key)
                    && let Some(signal) = queue.waiters.remove(&waiter.order)
                {
                    queue.waiters.insert(moved, signal);
                    if let Some((order, next)) = queue.waiters.first_key_value()
                        && *order != moved
                    {
                        heads.push(next.clone());
                    }
                }
                if held_to_bound {
                    let mark = match queues.marks.get(key) {
                        None => Mark {
                            cost: waiter.cost,
                            rank: waiter.order.rank,
                        },
                        Some(mark) => Mark {
                            cost: mark.cost.min(waiter.cost),
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
        for key in &waiter.keys {
            if queues
                .marks
                .get(key)
                .is_some_and(|mark| waiter.cost >= mark.cost)
            {
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
                .by_counter
                .get(&queue_key(counter))
                .and_then(|queue| queue.waiters.first_key_value())
                .map(|(_, signal)| signal.clone())
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
                .flat_map(|queue| queue.waiters.values().cloned())
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
                if let Some(queue) = queues.by_counter.get_mut(key) {
                    let was_head = queue
                        .waiters
                        .first_key_value()
                        .is_some_and(|(order, _)| *order == waiter.order);
                    queue.waiters.remove(&waiter.order);
                    match queue.waiters.first_key_value() {
                        None => {
                            queues.by_counter.remove(key);
                        }
                        Some((_, next)) if was_head => heads.push(next.clone()),
                        Some(_) => {}
                    }
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
/// keep one, `Store::acquire_waiting`): the counters it last asked for, and whether the store
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
        if self.store.queue_renewal().is_none() {
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
            let _ = store.leave_queue(&ids, id).await;
        });
    }
}
