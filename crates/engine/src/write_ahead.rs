//! Write-ahead of the memory store's budgets (`MemoryStore::with_write_ahead`): what lets a
//! process that dies without saving its counters (killed, out of memory, a panic) hold back
//! only a bounded share of each limit on its next start, rather than every limit for a period.
//!
//! Each rate counter may grant at most its **budget** past its last **record**: the counter's
//! state (`Counter::to_words`) and that budget, as a state database has made them durable. A
//! budget is an eighth of the counter's capacity (`budget_of`), or more for one request that
//! costs more. A start after a crash puts each record back and charges it its whole budget at
//! the start's time (`Counter::charge`), which counts at least what the crashed run can have
//! granted past the record (`tollgate-core`'s `tests/charge.rs` checks it for every algorithm).
//!
//! The store never writes: it keeps, per counter, the units spent since the last record
//! (`Spend`), and lists the counters due for a new record: those that have spent half their
//! budget (so a record usually lands before the budget runs out), and, first, those a request
//! waits on. Whoever keeps the state database drains the lists in batches
//! (`MemoryStore::record_batch`), writes each batch in one transaction, and says how it went
//! (`records_landed`, `records_failed`). A record in flight limits grants twice: by the last
//! record's budget, and by the new one's counted from when its state was taken, so either
//! outcome of the write leaves the store within a durable budget.
//!
//! A counter made after the last record has none: its first grant waits for its first record
//! (a counter that counts nothing, and a budget), as does any grant that would spend past a
//! budget. That request's answer is a pending future, resolved once a batch lands (or failed
//! with `StoreFailed` when the state database cannot take it, or takes longer than
//! `RECORD_WAIT_MAX`): never a denial the limit did not make. Once its record lands it is decided
//! under the limits in force then (the store keeps the last table `News::Limits` told it), not
//! those it was asked under: a limit lowered meanwhile does not grant under its old policy.
//! Concurrency counters have no budget: a renewal moves a lease without a grant, so a store
//! holds leases back after a crash instead, for one lease TTL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tollgate_core::Policy;

use crate::error::{Error, Result};
use crate::memory::{OwnedCounterId, SavedCounter};
use crate::sync::{Mutex, lock};

/// The share of a counter's capacity it may grant past its record: one eighth.
pub const WRITE_AHEAD_SHARE_OF_CAPACITY: u64 = 8;

/// Longest a request waits for the record it needs before it fails with `StoreFailed`.
pub const RECORD_WAIT_MAX: Duration = Duration::from_secs(10);

/// What a counter of `policy` may grant past its record: its capacity (the limit, or the burst
/// for GCRA) over `WRITE_AHEAD_SHARE_OF_CAPACITY`, rounded up so that every counter has one unit.
pub fn budget_of(policy: &Policy) -> u64 {
    policy.capacity().div_ceil(WRITE_AHEAD_SHARE_OF_CAPACITY)
}

/// One counter's spending since its record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Spend {
    /// Units granted since the last durable record (or since the counter was made).
    spent: u64,
    /// What that record allows past it: 0 before the first.
    budget: u64,
    /// While a record is being written: `spent` when its state was taken, and its budget.
    flight: Option<(u64, u64)>,
    /// The budget the next record asks for.
    next_budget: u64,
    /// The largest cost a request waits to spend here; 0 when none waits.
    wanted: u64,
    /// On the shard's list of counters a request waits on.
    urgent: bool,
    /// On the shard's list of counters due for a record.
    due: bool,
}

impl Spend {
    /// Whether `cost` more stays within the last record's budget and, while a record is in
    /// flight, within the new one's.
    fn allows(&self, cost: u64) -> bool {
        self.spent + cost <= self.budget
            && self
                .flight
                .is_none_or(|(mark, budget)| self.spent - mark + cost <= budget)
    }

    /// Half the budget or more is spent: time for the next record.
    fn low(&self) -> bool {
        2 * self.spent >= self.budget
    }
}

/// A shard's write-ahead bookkeeping: each counter's `Spend`, at the same index as the counter
/// in the shard's map, and the counters due for a record.
#[derive(Debug, Default)]
pub(crate) struct ShardRecords {
    spends: Vec<Spend>,
    /// Counters a request waits on: taken into a batch before the others.
    urgent: Vec<OwnedCounterId>,
    /// Counters that spent half their budget, or were restored.
    due: Vec<OwnedCounterId>,
    /// Counters the shard forgot (idle): their records may go.
    forgotten: Vec<OwnedCounterId>,
}

impl ShardRecords {
    /// A counter was added at the end of the shard's map.
    pub(crate) fn pushed(&mut self) {
        self.spends.push(Spend::default());
    }

    /// The counter at `index` was removed as the map's `swap_remove_index` removes it.
    pub(crate) fn removed(&mut self, index: usize, id: OwnedCounterId) {
        self.spends.swap_remove(index);
        self.forgotten.push(id);
    }

    /// Whether the counter at `index` may grant `cost` now. If not, the request waits for its
    /// next record, which is asked for first, with room for `cost`.
    pub(crate) fn allows(
        &mut self,
        index: usize,
        id: impl FnOnce() -> OwnedCounterId,
        policy: &Policy,
        cost: u64,
    ) -> bool {
        let spend = &mut self.spends[index];
        if spend.allows(cost) {
            return true;
        }
        spend.wanted = spend.wanted.max(cost);
        spend.next_budget = budget_of(policy).max(spend.wanted);
        if !spend.urgent {
            spend.urgent = true;
            self.urgent.push(id());
        }
        false
    }

    /// `cost` was granted on the counter at `index`; returns whether it became due for a
    /// record (and the writer should be woken).
    pub(crate) fn spent(
        &mut self,
        index: usize,
        id: impl FnOnce() -> OwnedCounterId,
        policy: &Policy,
        cost: u64,
    ) -> bool {
        let spend = &mut self.spends[index];
        spend.spent += cost;
        if spend.wanted <= cost {
            spend.wanted = 0;
        }
        if spend.due || spend.urgent || !spend.low() {
            return false;
        }
        spend.next_budget = budget_of(policy).max(spend.wanted);
        spend.due = true;
        self.due.push(id());
        true
    }

    /// Whether a request waits for a record of the counter at `index`.
    pub(crate) fn waited_on(&self, index: usize) -> bool {
        self.spends.get(index).is_some_and(|spend| spend.wanted > 0)
    }

    /// Ask for a record of the counter at `index` without spending (a pause to keep), with the
    /// budget it has.
    pub(crate) fn touch(&mut self, index: usize, id: impl FnOnce() -> OwnedCounterId) -> bool {
        let spend = &mut self.spends[index];
        spend.next_budget = spend.next_budget.max(spend.budget);
        if spend.due || spend.urgent {
            return false;
        }
        spend.due = true;
        self.due.push(id());
        true
    }

    /// A counter put back from a record with a budget of `budget`, `charged` of which counts on
    /// it already: due for a record of its own.
    pub(crate) fn restored(
        &mut self,
        index: usize,
        id: OwnedCounterId,
        policy: &Policy,
        charged: u64,
        budget: u64,
    ) {
        let spend = &mut self.spends[index];
        *spend = Spend {
            spent: charged,
            budget,
            flight: None,
            next_budget: budget_of(policy),
            wanted: 0,
            urgent: false,
            due: true,
        };
        self.due.push(id);
    }
}

/// Which of a shard's lists a batch is being filled from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum List {
    Urgent,
    Due,
}

impl ShardRecords {
    /// Move records of up to `room` counters of the `list` into `batch`, with `record` giving
    /// each one's id and state (`None` for a counter no longer tracked).
    pub(crate) fn take(
        &mut self,
        list: List,
        room: usize,
        shard: usize,
        batch: &mut RecordBatch,
        mut record: impl FnMut(&OwnedCounterId) -> Option<(usize, SavedCounter)>,
    ) {
        if list == List::Urgent {
            for id in self.forgotten.drain(..) {
                let (limit, key) = id.texts();
                batch.forgotten.push((limit, key));
            }
        }
        let ids = match list {
            List::Urgent => &mut self.urgent,
            List::Due => &mut self.due,
        };
        let mut taken = 0;
        while taken < room {
            let Some(id) = ids.pop() else { break };
            let Some((index, mut saved)) = record(&id) else {
                continue;
            };
            let spend = &mut self.spends[index];
            match list {
                List::Urgent => spend.urgent = false,
                List::Due => spend.due = false,
            }
            // On both lists: taken once.
            if spend.flight.is_some() {
                continue;
            }
            spend.flight = Some((spend.spent, spend.next_budget));
            saved.budget = spend.next_budget;
            batch.counters.push(saved);
            batch.flights.push(Flight { shard, id });
            taken += 1;
        }
    }

    /// The record of the counter at `index` landed (`true`) or did not; returns whether it is
    /// due again, and whether a request waits on it.
    pub(crate) fn settled(&mut self, index: usize, id: OwnedCounterId, landed: bool) -> bool {
        let spend = &mut self.spends[index];
        let Some((mark, budget)) = spend.flight.take() else {
            // A counter made again after the one in flight was forgotten: not this record's.
            return false;
        };
        if landed {
            spend.spent = spend.spent.saturating_sub(mark);
            spend.budget = budget;
            // The request waiting for this record goes now, or went away.
            if spend.allows(spend.wanted) {
                spend.wanted = 0;
            }
        } else {
            // A write that failed may still have committed (a timeout after the commit): the
            // counter stays within both records' budgets, whichever is durable.
            spend.budget = spend.budget.min(budget.saturating_add(mark));
        }
        if spend.wanted > 0 && !spend.allows(spend.wanted) {
            if spend.urgent {
                return false;
            }
            spend.urgent = true;
            self.urgent.push(id);
            return true;
        }
        // A record that did not land is asked for again.
        if spend.due || spend.urgent || (landed && !spend.low()) {
            return false;
        }
        spend.due = true;
        self.due.push(id);
        true
    }
}

/// A counter whose record is in a batch: where to tell it how the write went.
#[derive(Debug)]
pub(crate) struct Flight {
    pub(crate) shard: usize,
    pub(crate) id: OwnedCounterId,
}

/// Records for the state database to make durable in one transaction, before the budgets they
/// carry may be spent (`MemoryStore::record_batch`). Hand it back with `records_landed` once
/// committed, or `records_failed`.
#[derive(Debug, Default)]
pub struct RecordBatch {
    /// Each counter's state with the budget it may spend past it; insert or replace by
    /// limit and key.
    pub counters: Vec<SavedCounter>,
    /// Counters the store forgot (they count nothing any more): their records may be deleted.
    /// Deleted before `counters` are written (a counter forgotten and made again is in both).
    pub forgotten: Vec<(String, Option<String>)>,
    /// Every limit-wide pause, when they changed since the last batch: replace them all.
    pub pauses: Option<Vec<(String, u64)>>,
    pub(crate) flights: Vec<Flight>,
}

impl RecordBatch {
    pub(crate) fn is_empty(&self) -> bool {
        self.counters.is_empty() && self.forgotten.is_empty() && self.pauses.is_none()
    }
}

/// The store-wide part of the write-ahead: the writer's wake-up, the batch count that requests
/// waiting for a record watch, and the last failure.
#[derive(Debug)]
pub(crate) struct WriteAhead {
    /// Woken when a counter becomes due.
    work: Notify,
    /// Moves on after every batch, landed or failed.
    settled: watch::Sender<u64>,
    /// Why the last batch failed, until one lands; for good once `close`d.
    failing: Mutex<Option<String>>,
    closed: AtomicBool,
    /// A batch is out: the next waits for it to settle (one in flight at a time).
    out: AtomicBool,
    /// Limit-wide pauses changed since the last batch.
    pauses_changed: AtomicBool,
}

impl WriteAhead {
    pub(crate) fn new() -> WriteAhead {
        WriteAhead {
            work: Notify::new(),
            settled: watch::Sender::new(0),
            failing: Mutex::new(None),
            closed: AtomicBool::new(false),
            out: AtomicBool::new(false),
            pauses_changed: AtomicBool::new(false),
        }
    }

    pub(crate) fn wake_writer(&self) {
        self.work.notify_one();
    }

    pub(crate) async fn work(&self) {
        self.work.notified().await;
    }

    /// The batch count, read before a decision that may have to wait for the next one.
    pub(crate) fn batches(&self) -> u64 {
        *self.settled.borrow()
    }

    pub(crate) fn pauses_changed(&self) {
        self.pauses_changed.store(true, Ordering::Release);
        self.wake_writer();
    }

    pub(crate) fn take_pauses_changed(&self) -> bool {
        self.pauses_changed.swap(false, Ordering::AcqRel)
    }

    /// Start a batch: `false` while another is out.
    pub(crate) fn begin_batch(&self) -> bool {
        !self.out.swap(true, Ordering::AcqRel)
    }

    /// A batch that turned out empty.
    pub(crate) fn abandon_batch(&self) {
        self.out.store(false, Ordering::Release);
    }

    /// The batch out settled: `failure` is why it did not land.
    pub(crate) fn settle(&self, failure: Option<&str>) {
        {
            let mut failing = lock(&self.failing);
            if !self.closed.load(Ordering::Acquire) {
                *failing = failure.map(str::to_owned);
            }
        }
        self.out.store(false, Ordering::Release);
        self.settled.send_modify(|count| *count += 1);
        // Another batch may be due already (counters spent past half while this one flew).
        self.wake_writer();
    }

    /// No batch will land any more (the writer stopped): every request waiting for a record
    /// fails with `reason`, and so does every later one that needs a record.
    pub(crate) fn close(&self, reason: &str) {
        *lock(&self.failing) = Some(reason.to_owned());
        self.closed.store(true, Ordering::Release);
        self.settled.send_modify(|count| *count += 1);
    }

    /// Wait until a batch settles after the one counted `seen`; then the error to answer, if
    /// the request should not try again: the state database failed, or took too long.
    pub(crate) async fn wait_after(&self, seen: u64, deadline: tokio::time::Instant) -> Result<()> {
        let mut settled = self.settled.subscribe();
        if *settled.borrow_and_update() != seen {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, settled.changed()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(self.failed("the write-write_ahead writer is gone")),
            Err(_) => Err(self.failed(&format!(
                "no record of the budget landed in the state database within {} s",
                RECORD_WAIT_MAX.as_secs()
            ))),
        }
    }

    /// The failure every request that needs a record gets at once: no batch will be written
    /// any more (`close`).
    pub(crate) fn closed(&self) -> Option<Error> {
        if !self.closed.load(Ordering::Acquire) {
            return None;
        }
        self.failure()
    }

    /// The failure of the last batch, if it failed.
    pub(crate) fn failure(&self) -> Option<Error> {
        lock(&self.failing)
            .as_deref()
            .map(|reason| self.failed(reason))
    }

    fn failed(&self, reason: &str) -> Error {
        Error::StoreFailed {
            reason: format!(
                "the state database could not record this counter's budget write_ahead of the grant: \
                 {reason}"
            ),
        }
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;
    use crate::store::CounterId;
    use tollgate_core::{Algorithm, Reserve};

    fn id() -> OwnedCounterId {
        OwnedCounterId::new(CounterId {
            limit: "api",
            key: None,
        })
    }

    /// A record whose write failed may have committed all the same (a timeout after the
    /// commit): the counter then spends within its budget counted from that record too, so a
    /// restore from either record bounds what it granted.
    #[test]
    fn a_failed_record_still_bounds_what_is_spent() {
        let policy = Policy::rate(64, 1_000_000, 0, Algorithm::Sliding, Reserve::default())
            .expect("valid policy");
        let mut shard = ShardRecords::default();
        shard.pushed();
        // A record with room for one large request landed earlier, and 5 were spent past it;
        // the next record asks for the policy's budget, 8.
        shard.spends[0] = Spend {
            spent: 5,
            budget: 20,
            next_budget: budget_of(&policy),
            due: true,
            ..Spend::default()
        };
        shard.due.push(id());
        let mut batch = RecordBatch::default();
        shard.take(List::Due, 10, 0, &mut batch, |_| {
            Some((
                0,
                SavedCounter {
                    limit: "api".into(),
                    key: None,
                    state: Vec::new(),
                    budget: 0,
                },
            ))
        });
        assert_eq!(batch.counters[0].budget, 8);
        let _ = shard.settled(0, id(), false);
        // Past the failed record's state (5 units), at most its budget of 8: 13 in all.
        assert!(shard.spends[0].allows(8));
        assert!(!shard.spends[0].allows(9));
    }
}
