//! The seam between the engine and where counters live: what a store implements (`Store`) and
//! the values it trades in. A store decides atomically, with its own clock, on all counters of
//! one request: every check, then every grant, or nothing. The engine knows nothing of how a
//! store keeps its counters; stores know nothing of waiting, priorities across requests, or
//! permits as guards.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use smallvec::SmallVec;
use tollgate_core::{Committed, Denial, GcraStep, Grant, Policy, Priority};

use crate::error::Result;
use crate::hot::HotCounter;
use crate::limits::LimitTable;

/// One counter: a limit, and the key for limits counted `per` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterId<'a> {
    pub limit: &'a str,
    pub key: Option<&'a str>,
}

impl CounterId<'_> {
    /// Hash limit and key as bytes, after one word that holds both lengths (and whether there
    /// is a key), so that ("ab", "c") and ("a", "bc") differ. Stores that keep the id as bytes
    /// hash those the same way, without decoding.
    pub(crate) fn hash_bytes<H: std::hash::Hasher>(
        limit: &[u8],
        key: Option<&[u8]>,
        state: &mut H,
    ) {
        let key_length = key.map_or(u64::from(u32::MAX), |key| key.len() as u64);
        state.write_u64(((limit.len() as u64) << 32) | key_length);
        state.write(limit);
        if let Some(key) = key {
            state.write(key);
        }
    }
}

impl std::hash::Hash for CounterId<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        CounterId::hash_bytes(self.limit.as_bytes(), self.key.map(str::as_bytes), state);
    }
}

/// A counter and the policy it is decided under.
#[derive(Clone, Copy, Debug)]
pub struct Take<'a> {
    pub counter: CounterId<'a>,
    pub policy: &'a Policy,
}

/// What a store answers for one counter of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterOutcome {
    Granted(Grant),
    /// This counter would have allowed the request, but another counter denied it, so nothing
    /// was taken here. `remaining` is what stays open to the request's priority.
    Allowed {
        remaining: u64,
    },
    Denied(Denial),
}

/// A store's answer to an acquire: granted on every counter, or on none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The store's clock at the decision, in microseconds.
    pub now_us: u64,
    /// One inline: a decision is moved through a few returns, and most name one limit.
    outcomes: SmallVec<[CounterOutcome; 1]>,
}

impl Decision {
    /// The answer at `now_us`: one outcome per counter, in the request's order.
    pub fn new(now_us: u64, outcomes: impl IntoIterator<Item = CounterOutcome>) -> Decision {
        Decision {
            now_us,
            outcomes: outcomes.into_iter().collect(),
        }
    }

    pub(crate) fn from_outcomes(now_us: u64, outcomes: SmallVec<[CounterOutcome; 1]>) -> Decision {
        Decision { now_us, outcomes }
    }

    pub fn outcomes(&self) -> &[CounterOutcome] {
        &self.outcomes
    }

    pub fn is_granted(&self) -> bool {
        self.outcomes
            .iter()
            .all(|outcome| matches!(outcome, CounterOutcome::Granted(_)))
    }

    /// The exact wait before the whole request could be granted: the longest of its denials.
    pub fn retry_after_us(&self) -> u64 {
        self.outcomes
            .iter()
            .map(|outcome| match outcome {
                CounterOutcome::Denied(denial) => denial.retry_after_us,
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }
}

/// A lease's new expiry after `renew`, relative to the store's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewed {
    pub expires_in_us: u64,
}

/// The future a store returns: already resolved for in-process stores (no allocation, no
/// await point), boxed for stores that do I/O. A pending future must do nothing before it is
/// first polled (as an `async` block does nothing): the limiter asks for a decision on the
/// calling thread first, and drops a pending answer unpolled to await it afresh.
pub enum StoreFuture<'a, T> {
    Ready(Option<Result<T>>),
    Pending(Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>),
}

impl<T> fmt::Debug for StoreFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreFuture::Ready(_) => f.write_str("StoreFuture::Ready"),
            StoreFuture::Pending(_) => f.write_str("StoreFuture::Pending"),
        }
    }
}

impl<'a, T> StoreFuture<'a, T> {
    pub fn ready(result: Result<T>) -> StoreFuture<'a, T> {
        StoreFuture::Ready(Some(result))
    }

    pub fn boxed(future: impl Future<Output = Result<T>> + Send + 'a) -> StoreFuture<'a, T> {
        StoreFuture::Pending(Box::pin(future))
    }

    /// The result, if the store answered without waiting.
    pub fn into_ready(self) -> Option<Result<T>> {
        match self {
            StoreFuture::Ready(result) => result,
            StoreFuture::Pending(_) => None,
        }
    }
}

// Neither variant is structurally pinned: the value is moved out whole, the boxed future is
// pinned by its box.
impl<T> Unpin for StoreFuture<'_, T> {}

impl<T> Future for StoreFuture<'_, T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        match self.get_mut() {
            StoreFuture::Ready(result) => match result.take() {
                Some(result) => Poll::Ready(result),
                None => panic!("StoreFuture polled after completion"),
            },
            StoreFuture::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

/// A counter as it stands, for people and dashboards: never an input to a decision, since it
/// may have changed by the time it is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Units (rate) or lease slots (concurrency) counted now.
    pub used: u64,
    /// Until every unit counted now stops counting, in microseconds.
    pub reset_after_us: u64,
    /// Until nothing is granted any more because of a pause (the counter's, its limit's, or a
    /// hold after a loss of state), in microseconds; 0 when none is on.
    pub paused_for_us: u64,
    /// Of that, until the store's hold after a loss of state ends (a crash of the memory
    /// store's server, a Redis that came back empty), in microseconds; 0 when none is on.
    /// A hold is not a pause: nobody asked for it, and `resume` does not lift it.
    pub held_for_us: u64,
}

/// A waiting request, as a store that queues waiters across processes knows it: random, so
/// that ids from different processes do not meet; never 0, and below 2^53 (stores may keep
/// it as a double).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaiterId(u64);

impl WaiterId {
    /// A new id, unlike any other this or another process draws (53 random bits).
    pub fn random() -> WaiterId {
        use std::hash::BuildHasher;
        // The process's random hasher keys, over a count: distinct within a process, and
        // unrelated between processes.
        static DRAWN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let count = DRAWN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bits = std::collections::hash_map::RandomState::new().hash_one(count) & ((1 << 53) - 1);
        WaiterId(bits.max(1))
    }

    /// `id` as a waiter's id, if it is one (1 to 2^53 - 1).
    pub fn new(id: u64) -> Option<WaiterId> {
        (1..1 << 53).contains(&id).then_some(WaiterId(id))
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

/// Called with a counter on which capacity came back.
pub type WakeFn = std::sync::Arc<dyn Fn(CounterId<'_>) + Send + Sync>;

/// The units a request asks of each of its takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Costs<'a> {
    /// The same on every take.
    Same(u64),
    /// One per take, in the takes' order: a language model's requests, input tokens and output
    /// tokens, taken all or none in one decision.
    Each(&'a [u64]),
}

impl Costs<'_> {
    /// The units asked of the take at `index`.
    #[inline]
    pub fn of(self, index: usize) -> u64 {
        match self {
            Costs::Same(cost) => cost,
            // A missing entry asks for nothing that could be granted by mistake: the limiter
            // gives one cost per take, and a store never grants a cost above its limit.
            Costs::Each(costs) => costs.get(index).copied().unwrap_or(u64::MAX),
        }
    }

    /// The one cost of every take, when they are all the same.
    pub fn same(self) -> Option<u64> {
        match self {
            Costs::Same(cost) => Some(cost),
            Costs::Each([first, rest @ ..]) if rest.iter().all(|cost| cost == first) => {
                Some(*first)
            }
            Costs::Each(_) => None,
        }
    }
}

/// One request to a store: check every take, and grant its cost on all of them only if all
/// allow it.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    pub takes: &'a [Take<'a>],
    pub costs: Costs<'a>,
    pub priority: Priority,
    /// Record the rate reservations, so that `commit` can refund what was not used; a request
    /// that will never be committed for a refund says `false`, and its units count the same.
    pub refundable: bool,
    /// A request that waits (`Limiter::acquire` with a wait) asks again as this waiter: a store
    /// that keeps a queue across processes (`Offers::queue`) keeps its place, so that a lower
    /// priority elsewhere leaves it the units it waits for. Other stores ignore it.
    pub waiter: Option<WaiterId>,
}

impl<'a> Ask<'a> {
    /// `cost` on every take, at `priority`, not refundable and not waiting.
    pub fn new(takes: &'a [Take<'a>], cost: u64, priority: Priority) -> Ask<'a> {
        Ask {
            takes,
            costs: Costs::Same(cost),
            priority,
            refundable: false,
            waiter: None,
        }
    }

    /// A cost per take, in `takes`' order.
    pub fn costs(self, costs: &'a [u64]) -> Ask<'a> {
        self.with_costs(Costs::Each(costs))
    }

    pub fn with_costs(self, costs: Costs<'a>) -> Ask<'a> {
        Ask { costs, ..self }
    }

    pub fn refundable(self, refundable: bool) -> Ask<'a> {
        Ask { refundable, ..self }
    }

    pub fn waiter(self, waiter: WaiterId) -> Ask<'a> {
        Ask {
            waiter: Some(waiter),
            ..self
        }
    }
}

/// An administrator's or a vendor's change to one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adjust {
    /// Grant nothing on this counter for this long from the store's now; with no key on a limit
    /// counted per key, on every key of the limit. Pauses only extend.
    Pause { for_us: u64 },
    /// Lift the pause on this counter; with no key, the limit-wide pause (a limit counted per
    /// key keeps its keys' own pauses: lift each by its key). A hold after a loss of state is
    /// not a pause and stays.
    Resume,
    /// Forget what this rate counter counts (`Counter::forget`: its usage, its open
    /// reservations, its own pause), in every process sharing the store: a reset after a
    /// mistaken lockout. A hold after a loss of state stays.
    Reset,
    /// Count `units` spent beyond any grant on this rate counter at the store's now, even past
    /// the limit (`Counter::debit`): a debt that every later grant, in every process sharing
    /// the store, waits out. At most one capacity past the limit is counted. Leases: nothing.
    Charge { units: u64 },
}

/// What an `Adjust` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adjusted {
    /// A pause: always; a resume: whether a pause was on; a reset: whether the store held the
    /// counter; a charge: whether it counted any unit.
    pub changed: bool,
    /// After a pause, the time until it ends; otherwise 0.
    pub paused_for_us: u64,
    /// After a charge, the units counted; otherwise 0.
    pub charged: u64,
}

/// What the limiter tells its store.
#[derive(Clone)]
pub enum News<'a> {
    /// The limits in force, after every change. A store that bounds keys per limit reads each
    /// limit's budget here (`Limit::keys_max`), and a limit that is gone or changed kind loses
    /// its pauses, so that a limit made again under an old name starts unpaused. Limits decided
    /// on the store outside a limiter (Envoy's counters) are never named, and get the store's
    /// own budget.
    Limits(&'a LimitTable),
    /// The limiter's wake-up: a store shared between processes calls it when another process
    /// gave capacity back on a counter (a refund, a release), so that waiters here ask again at
    /// once instead of sleeping out their retry hint. The in-process store calls it on its own
    /// refunds and releases.
    Wake(WakeFn),
}

impl fmt::Debug for News<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            News::Limits(limits) => f.debug_tuple("Limits").field(limits).finish(),
            News::Wake(_) => f.write_str("Wake"),
        }
    }
}

/// A queue of waiting requests that a store keeps across processes.
pub trait Queue: Send + Sync {
    /// How often a waiter must ask again to keep its place: it stops counting three times this
    /// after its last ask.
    fn renewal(&self) -> Duration;

    /// A waiting request gives up (its deadline passed, it was cancelled): its place goes at
    /// once, and whoever it held back may be woken.
    fn leave<'a>(&'a self, counters: &'a [CounterId<'a>], waiter: WaiterId) -> StoreFuture<'a, ()>;
}

/// Decisions a store makes on the calling thread, with no lock a decision elsewhere could hold
/// for long: the limiter's synchronous ways in (a `LimitHandle` on a hot path). Only a store
/// that keeps its counters in this process offers them.
pub trait InProcess: Send + Sync {
    /// The word an unkeyed GCRA counter is decided on by a handle alone; `None` when this
    /// counter cannot be (another algorithm, a full store).
    fn hot_counter(&self, take: Take<'_>) -> Option<Arc<HotCounter>>;

    /// Grant `cost` on a keyed counter the store tracks by itself, when the counter needs
    /// nothing but its GCRA backlog; `None` sends the caller the store's full way.
    fn grant_tracked(&self, take: Take<'_>, cost: u64, priority: Priority) -> Option<GcraStep>;
}

/// What a store offers beyond the decisions every store makes.
#[derive(Clone, Copy, Default)]
pub struct Offers<'a> {
    pub queue: Option<&'a dyn Queue>,
    pub in_process: Option<&'a dyn InProcess>,
}

impl fmt::Debug for Offers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Offers")
            .field("queue", &self.queue.is_some())
            .field("in_process", &self.in_process.is_some())
            .finish()
    }
}

/// Where counters live. Every method is one atomic step on the store's side, on the store's
/// clock. A store written anywhere implements all of it and can prove itself with
/// `tollgate_conformance::conformance_tests!`; a store that wraps another implements `Forward`
/// instead, and writes only what it changes.
pub trait Store: Any + Send + Sync + fmt::Debug {
    /// Check every take of `ask`, and grant its cost on all of them only if all allow it.
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision>;

    /// Commit a reservation (refund `cost - used`) or release a lease.
    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed>;

    /// Extend a lease by its policy's TTL from the store's now.
    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed>;

    /// Pause, resume or reset one counter.
    fn adjust<'a>(&'a self, take: Take<'a>, adjust: Adjust) -> StoreFuture<'a, Adjusted>;

    /// What the counter holds now, changing nothing it counts.
    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, Usage>;

    /// Take in what the limiter tells (`News`). A store that needs none of it ignores it.
    fn tell(&self, news: News<'_>) {
        let _ = news;
    }

    /// What the store offers beyond decisions: none by default.
    fn offers(&self) -> Offers<'_> {
        Offers::default()
    }

    /// Whether the store answers: one round trip for a remote store (readiness checks), nothing
    /// for an in-process one.
    fn ping(&self) -> StoreFuture<'_, ()> {
        StoreFuture::ready(Ok(()))
    }
}

/// A store that wraps another: every method forwards to `inner` unless the wrapper writes it, so
/// a wrapper writes only what it changes and cannot drop a capability by forgetting a method.
/// A wrapper that decides differently from its inner store (one that leases blocks of units)
/// must write `offers`, and keep no `in_process` way, which would decide without it.
pub trait Forward: Any + Send + Sync + fmt::Debug {
    fn inner(&self) -> &dyn Store;

    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        self.inner().acquire(ask)
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        self.inner().commit(take, seq, used)
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        self.inner().renew(take, fence)
    }

    fn adjust<'a>(&'a self, take: Take<'a>, adjust: Adjust) -> StoreFuture<'a, Adjusted> {
        self.inner().adjust(take, adjust)
    }

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, Usage> {
        self.inner().usage(take)
    }

    fn tell(&self, news: News<'_>) {
        self.inner().tell(news);
    }

    fn offers(&self) -> Offers<'_> {
        self.inner().offers()
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        self.inner().ping()
    }
}

impl<F: Forward> Store for F {
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        Forward::acquire(self, ask)
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        Forward::commit(self, take, seq, used)
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        Forward::renew(self, take, fence)
    }

    fn adjust<'a>(&'a self, take: Take<'a>, adjust: Adjust) -> StoreFuture<'a, Adjusted> {
        Forward::adjust(self, take, adjust)
    }

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, Usage> {
        Forward::usage(self, take)
    }

    fn tell(&self, news: News<'_>) {
        Forward::tell(self, news);
    }

    fn offers(&self) -> Offers<'_> {
        Forward::offers(self)
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Forward::ping(self)
    }
}
