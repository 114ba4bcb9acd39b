//! Hot counters: the memory store's GCRA counter of an unkeyed limit, which a `LimitHandle`
//! decides on by itself, with one compare-and-swap and no lock, while the counter needs nothing
//! but its backlog's end.
//!
//! The number lives in one atomic word, and so does who holds the truth:
//!
//! - **Published** (the top bit clear): the word is the backlog's end, and it is the truth; the
//!   store's copy of the counter may be behind. A handle decides with `tollgate_core::gcra_admit`
//!   and swaps the new end in; a swap that loses a race decides again on the winner's value.
//! - **Seized** (the top bit set): the store's counter is the truth. The store seizes the word
//!   under the counter's shard lock before it touches the counter, with one `fetch_or` that
//!   also hands it the latest end; a handle that sees the bit goes the store's way, under the
//!   same lock. After a decision on this counter alone the store publishes again, if the
//!   counter still needs nothing else (`Counter::gcra_alone`: no open reservation, no pause)
//!   and no limit-wide pause is on.
//!
//! A limit-wide pause is the one thing the counter does not hold: a handle reads the end of the
//! store's limit-wide pauses before each decision and, while one is on, goes the store's way.
//! (Seizing every word of a limit when a pause starts would mean finding every key's.) A
//! decision that read the end just before a pause began and swaps just after it is concurrent
//! with the pause's start, and so may be ordered before it.
//!
//! A word serves the emission interval of its handles' policy, and only a decision under that
//! interval publishes it: the backlog is time, and read under another interval it would count
//! other units (the store's way converts it). After a policy change, new handles get a new word.
//!
//! Only the store, under the shard lock, moves the word from seized to published, and only
//! right after seizing it under the same lock; a handle's swap expects a published value, so it
//! fails on a seized word. So at every moment exactly one copy counts grants, and no grant is
//! decided on a value that another grant has already moved. A publish that never happens (a
//! denial, a request over several counters) only costs the next decision the store's way. The
//! store never drops a counter whose word a handle holds (it could not seize it again).

use tollgate_core::{Counter, GcraStep, Kind, Policy, Priority, gcra_admit};

use std::sync::Arc;

use crate::clock::Clock;
use crate::sync::{AtomicU64, Ordering, OwnLine};

/// Set while the store's copy of the counter is the truth.
const SEIZED: u64 = 1 << 63;

/// One GCRA counter, decided without the store's lock (see the module docs).
#[derive(Debug)]
pub struct HotCounter {
    word: OwnLine<AtomicU64>,
    clock: Arc<dyn Clock>,
    /// The end of the store's latest limit-wide pause: no decision here before it.
    limit_pauses_end: Arc<OwnLine<AtomicU64>>,
    /// The emission interval of the policy the handles that hold this word decide under. The
    /// word is published only by a decision under the same interval: a backlog is time, and
    /// read under another interval it would count other units (the store's way converts it).
    emission_us: u64,
}

impl HotCounter {
    /// Seized: the store publishes when the counter allows it. `policy` is the handles'
    /// policy; `None` for one with no emission interval (a concurrency limit).
    pub(crate) fn new(
        clock: Arc<dyn Clock>,
        limit_pauses_end: Arc<OwnLine<AtomicU64>>,
        policy: &Policy,
    ) -> Option<HotCounter> {
        Some(HotCounter {
            word: OwnLine(AtomicU64::new(SEIZED)),
            clock,
            limit_pauses_end,
            emission_us: emission_of(policy)?,
        })
    }

    /// Whether handles deciding under `policy` may use this word.
    pub(crate) fn serves(&self, policy: &Policy) -> bool {
        emission_of(policy) == Some(self.emission_us)
    }

    /// A grant of `cost` at `priority` without a refund, decided here; `None` when it cannot be
    /// (the word is seized, a limit-wide pause is on, or `gcra_admit` would not grant): the
    /// caller asks the store, which decides and explains. A lost race decides again on the
    /// winner's value.
    #[inline]
    pub(crate) fn decide(
        &self,
        policy: &Policy,
        cost: u64,
        priority: Priority,
    ) -> Option<GcraStep> {
        let now = self.clock.now_us();
        if self.limit_pauses_end.load(Ordering::Acquire) > now {
            return None;
        }
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if word & SEIZED != 0 {
                return None;
            }
            let step = gcra_admit(word, policy, now, cost, priority)?;
            match self.word.compare_exchange_weak(
                word,
                step.tat,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(step),
                Err(actual) => word = actual,
            }
        }
    }

    /// Under the counter's shard lock, before anything reads or changes `counter`: take the
    /// truth back into it. Returns the backlog's end it took, if the word was published.
    pub(crate) fn seize(&self, counter: &mut Counter) -> Option<u64> {
        let word = self.word.fetch_or(SEIZED, Ordering::AcqRel);
        if word & SEIZED != 0 {
            return None;
        }
        counter.set_gcra_tat(word);
        Some(word)
    }

    /// Under the same lock hold as the `seize` before it, once the store is done with the
    /// counter: hand the truth to handles again, if the counter needs nothing but its backlog.
    /// Only a decision under the handles' interval publishes: a store decision that resolved
    /// the limit before a change of its policy may still run after it.
    pub(crate) fn publish(&self, counter: &Counter, policy: &Policy, now: u64) {
        if self.serves(policy)
            && let Some(tat) = counter.gcra_alone(policy, now)
            && tat & SEIZED == 0
        {
            self.word.store(tat, Ordering::Release);
        }
    }
}

/// The emission interval of a rate policy.
fn emission_of(policy: &Policy) -> Option<u64> {
    match policy.kind() {
        Kind::Rate(rate) => Some(rate.emission_us()),
        Kind::Concurrency(_) => None,
    }
}
