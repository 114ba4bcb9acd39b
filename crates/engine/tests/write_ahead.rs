//! The memory store's write-ahead (`MemoryStore::with_write_ahead`), with the test as the
//! state database: it drains `record_batch`, keeps what it commits, and says how each batch
//! went. A grant never spends past a landed budget; a request that needs a record waits for
//! it (never denied for it), or fails when the database does; a restore from the committed
//! records after a crash keeps the limit over both runs, counted by the test.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tollgate::store::{Ask, CounterId, Store, Take};
use tollgate::{
    Algorithm, Error, Limit, Limiter, LimiterConfig, ManualClock, MemorySnapshot, MemoryStore,
    MemoryStoreConfig, Outcome, Policy, Priority, RecordBatch, Request, Reserve, SavedCounter,
    budget_of,
};

const HOUR_US: u64 = 3_600_000_000;

fn config() -> MemoryStoreConfig {
    MemoryStoreConfig {
        keys_tracked_max: 10_000,
        keys_per_limit_max: 10_000,
    }
}

fn limit(name: &str, units: u64, algorithm: Algorithm, per: Option<&str>) -> Limit {
    let policy =
        Policy::rate(units, HOUR_US, 0, algorithm, Reserve::default()).expect("valid policy");
    Limit::new(name, policy, per).expect("valid limit")
}

/// A store writing ahead and a limiter on it, on a clock the test moves.
fn ahead_store(clock: &Arc<ManualClock>) -> (Arc<MemoryStore>, Limiter) {
    let store = Arc::new(MemoryStore::with_write_ahead(config(), clock.clone()));
    let limiter = Limiter::new(store.clone(), LimiterConfig::default());
    (store, limiter)
}

/// The state database: the records committed so far, by counter.
#[derive(Default)]
struct Database {
    records: HashMap<(String, Option<String>), SavedCounter>,
    pauses: Vec<(String, u64)>,
}

impl Database {
    fn commit(&mut self, batch: &RecordBatch) {
        for forgotten in &batch.forgotten {
            self.records.remove(forgotten);
        }
        for saved in &batch.counters {
            self.records
                .insert((saved.limit.clone(), saved.key.clone()), saved.clone());
        }
        if let Some(pauses) = &batch.pauses {
            self.pauses = pauses.clone();
        }
    }

    /// Write every batch the store has due; returns how many counters were written.
    fn drain(&mut self, store: &MemoryStore) -> usize {
        let mut written = 0;
        while let Some(batch) = store.record_batch(100) {
            written += batch.counters.len();
            self.commit(&batch);
            store.records_landed(batch);
        }
        written
    }

    fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot {
            counters: self.records.values().cloned().collect(),
            pauses: self.pauses.clone(),
            taken_at_us: 0,
        }
    }
}

/// Poll once: the answer if the store gave it without waiting for a record.
fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

#[tokio::test(start_paused = true)]
async fn a_new_counter_waits_for_its_first_record_and_is_not_denied() {
    let clock = Arc::new(ManualClock::new(HOUR_US));
    let (store, limiter) = ahead_store(&clock);
    limiter.set_limit(limit("hourly", 100, Algorithm::Sliding, None));
    let mut database = Database::default();

    let request = Request::new("hourly");
    let mut pending = pin!(limiter.try_acquire(&request));
    assert!(poll_once(pending.as_mut()).is_pending(), "no record yet");
    // The record asked for: the counter as it is (nothing counted), with its budget.
    let batch = store.record_batch(100).expect("a record is due");
    assert_eq!(batch.counters.len(), 1);
    assert_eq!(batch.counters[0].budget, 13);
    database.commit(&batch);
    assert!(poll_once(pending.as_mut()).is_pending(), "not landed yet");
    store.records_landed(batch);
    let Poll::Ready(outcome) = poll_once(pending.as_mut()) else {
        panic!("granted once the record landed");
    };
    assert!(outcome.expect("answered").is_granted());
    // Within the budget, the next grants need no record.
    for _ in 0..5 {
        let outcome = limiter.try_acquire(&request).await.expect("answered");
        assert!(outcome.is_granted());
    }
}

/// With no record landing, a counter grants its budget and then waits; the waiting request is
/// granted once a record lands. Never more than the budget past the last landed record.
#[tokio::test(start_paused = true)]
async fn a_counter_never_spends_past_its_landed_budget() {
    let clock = Arc::new(ManualClock::new(HOUR_US));
    let (store, limiter) = ahead_store(&clock);
    limiter.set_limit(limit("hourly", 100, Algorithm::Gcra { burst: 100 }, None));
    let mut database = Database::default();
    let request = Request::new("hourly").refundable(false);
    {
        let mut first = pin!(limiter.try_acquire(&request));
        assert!(poll_once(first.as_mut()).is_pending());
        database.drain(&store);
        assert!(matches!(
            poll_once(first.as_mut()),
            Poll::Ready(Ok(Outcome::Granted(_)))
        ));
    }
    // Half the budget spent: a record is due, and taken, but does not land yet.
    let mut granted = 1;
    let mut in_flight = None;
    let held = loop {
        let mut next = Box::pin(limiter.try_acquire(&request));
        match poll_once(next.as_mut()) {
            Poll::Ready(outcome) => {
                assert!(outcome.expect("answered").is_granted());
                granted += 1;
            }
            Poll::Pending => break next,
        }
        if granted == 7 {
            // Held in flight while the counter spends on.
            in_flight = Some(store.record_batch(100).expect("due at half the budget"));
        }
        assert!(granted <= 13, "past the budget");
    };
    assert_eq!(granted, 13, "the whole budget, and no more");
    // A handle decides on the store too (its lock-free word steps aside): it must ask.
    let handle = limiter.handle("hourly").expect("handle");
    assert!(handle.check_now(None, 1, Priority::Normal).is_none());
    let mut held = held;
    database.commit(in_flight.as_ref().expect("taken"));
    store.records_landed(in_flight.take().expect("taken"));
    // Landed: 7 units were in the record, 6 spent past it, 7 of its budget left; the
    // waiting request goes at once.
    assert!(matches!(
        poll_once(held.as_mut()),
        Poll::Ready(Ok(Outcome::Granted(_)))
    ));
    let checked = handle
        .check_now(None, 1, Priority::Normal)
        .expect("answered at once");
    assert!(checked.expect("decided").is_allowed());
}

/// A batch that fails: requests that wait for its records fail with `StoreFailed`, which
/// names the state database; counters within their budget still grant; the next batch that
/// lands lets the waiting counter grant again.
#[tokio::test(start_paused = true)]
async fn a_failed_batch_fails_only_the_requests_that_need_it() {
    let clock = Arc::new(ManualClock::new(HOUR_US));
    let (store, limiter) = ahead_store(&clock);
    limiter.set_limit(limit("per-user", 16, Algorithm::Sliding, Some("user")));
    let mut database = Database::default();
    let known = Request::new("per-user").key("known");
    let new = Request::new("per-user").key("new");
    {
        let mut first = pin!(limiter.try_acquire(&known));
        assert!(poll_once(first.as_mut()).is_pending());
        database.drain(&store);
        assert!(matches!(
            poll_once(first.as_mut()),
            Poll::Ready(Ok(Outcome::Granted(_)))
        ));
    }
    database.drain(&store);
    let mut waiting = pin!(limiter.try_acquire(&new));
    assert!(poll_once(waiting.as_mut()).is_pending());
    let batch = store.record_batch(100).expect("the new counter's record");
    store.records_failed(batch, "disk full");
    match poll_once(waiting.as_mut()) {
        Poll::Ready(Err(Error::StoreFailed { reason })) => {
            assert!(reason.contains("state database"), "{reason}");
            assert!(reason.contains("disk full"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Within its budget, the known counter still grants.
    assert!(
        limiter
            .try_acquire(&known)
            .await
            .expect("answered")
            .is_granted()
    );
    // The store says it is failing until a batch lands.
    assert!(store.ping().await.is_err());
    let mut again = pin!(limiter.try_acquire(&new));
    assert!(poll_once(again.as_mut()).is_pending());
    database.drain(&store);
    assert!(matches!(
        poll_once(again.as_mut()),
        Poll::Ready(Ok(Outcome::Granted(_)))
    ));
    assert!(store.ping().await.is_ok());
    // Once no batch will be written any more, a request that needs a record fails at once.
    store.close_records("another server took over");
    let third = Request::new("per-user").key("third");
    let mut closed = pin!(limiter.try_acquire(&third));
    match poll_once(closed.as_mut()) {
        Poll::Ready(Err(Error::StoreFailed { reason })) => {
            assert!(reason.contains("took over"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// A crash after random traffic on every algorithm, with the records of whatever batches
/// landed: the restored store, with each record charged its budget, grants the rest of the
/// limit and not one unit more, counted by the test over both runs.
#[tokio::test(start_paused = true)]
async fn a_crash_keeps_the_limit_over_both_runs() {
    for algorithm in [
        Algorithm::Sliding,
        Algorithm::Fixed,
        Algorithm::Gcra { burst: 40 },
    ] {
        for landed_every in [1, 3, 7] {
            let clock = Arc::new(ManualClock::new(10 * HOUR_US));
            let (store, limiter) = ahead_store(&clock);
            let hourly = limit("hourly", 40, algorithm, Some("user"));
            limiter.set_limit(hourly.clone());
            let mut database = Database::default();
            let mut granted = HashMap::<&str, u64>::new();
            let keys = ["a", "b", "c"];
            for step in 0..120usize {
                let key = keys[step % keys.len()];
                let request = Request::new("hourly").key(key);
                let mut answer = pin!(limiter.try_acquire(&request));
                if let Poll::Ready(outcome) = poll_once(answer.as_mut())
                    && outcome.expect("answered").is_granted()
                {
                    *granted.entry(key).or_default() += 1;
                }
                if step % landed_every == 0 {
                    database.drain(&store);
                }
                clock.advance_us(1_000);
            }
            // The process dies; batches taken but not landed are lost with it.
            let _lost = store.record_batch(100);
            let (restored_store, restored) = ahead_store(&clock);
            restored.set_limit(hourly.clone());
            clock.advance_us(5_000_000);
            let policy = *hourly.policy();
            let report = restored_store.restore(&database.snapshot(), |name| {
                (name == "hourly").then_some(policy)
            });
            assert!(report.held.is_empty());
            let mut after_database = Database::default();
            for key in keys {
                let request = Request::new("hourly").key(key);
                let mut more = 0;
                loop {
                    let mut answer = pin!(restored.try_acquire(&request));
                    let outcome = match poll_once(answer.as_mut()) {
                        Poll::Ready(outcome) => outcome,
                        Poll::Pending => {
                            after_database.drain(&restored_store);
                            match poll_once(answer.as_mut()) {
                                Poll::Ready(outcome) => outcome,
                                Poll::Pending => panic!("still waiting after the records landed"),
                            }
                        }
                    };
                    if !outcome.expect("answered").is_granted() {
                        break;
                    }
                    more += 1;
                }
                let before = granted.get(key).copied().unwrap_or(0);
                assert!(
                    before + more <= 40,
                    "{algorithm:?} every {landed_every}: {key} {before} + {more}"
                );
                assert!(
                    before + more + budget_of(&policy) >= 40,
                    "{algorithm:?} every {landed_every}: {key} only {before} + {more}"
                );
            }
        }
    }
}

/// Without write-ahead the store answers at once, as it always did, and asks for no records.
#[test]
fn without_write_ahead_nothing_is_recorded_or_waited_for() {
    let clock = Arc::new(ManualClock::new(HOUR_US));
    let store = MemoryStore::new(config(), clock);
    let policy =
        Policy::rate(2, HOUR_US, 0, Algorithm::Sliding, Reserve::default()).expect("valid policy");
    let takes = [Take {
        counter: CounterId {
            limit: "hourly",
            key: None,
        },
        policy: &policy,
    }];
    let answer = store
        .acquire(Ask::new(&takes, 1, Priority::Normal))
        .into_ready()
        .expect("answered at once");
    assert!(answer.expect("decided").is_granted());
    assert!(store.record_batch(100).is_none());
}

/// A request that waits for a record is decided under the limits in force when it is decided:
/// a limit lowered while it waited (an administrator, a vendor's lesson) does not grant under
/// its old policy.
#[tokio::test(start_paused = true)]
async fn a_request_that_waited_for_a_record_is_decided_under_the_limits_in_force() {
    let clock = Arc::new(ManualClock::new(HOUR_US));
    let (store, limiter) = ahead_store(&clock);
    limiter.set_limit(limit("hourly", 16, Algorithm::Sliding, None));
    let mut database = Database::default();
    let request = Request::new("hourly");
    let mut held = Vec::new();
    // Eight units taken, each record landing as it is due.
    while held.len() < 8 {
        let mut pending = pin!(limiter.try_acquire(&request));
        let permit = loop {
            if let Poll::Ready(outcome) = poll_once(pending.as_mut()) {
                break outcome.expect("answered").granted().expect("room under 16");
            }
            database.drain(&store);
        };
        held.push(permit);
    }
    // Spend the budget until a request waits for its record.
    let mut pending = pin!(limiter.try_acquire(&request));
    while let Poll::Ready(outcome) = poll_once(pending.as_mut()) {
        held.push(outcome.expect("answered").granted().expect("room under 16"));
        pending.set(limiter.try_acquire(&request));
    }
    let taken = held.len();
    assert!(taken < 16, "the budget ran out before the limit: {taken}");
    // Lowered to what is taken, while that request waits: once its record lands, no room.
    limiter.set_limit(limit("hourly", taken as u64, Algorithm::Sliding, None));
    database.drain(&store);
    let Poll::Ready(outcome) = poll_once(pending.as_mut()) else {
        panic!("answered once the record landed");
    };
    assert!(
        !outcome.expect("answered").is_granted(),
        "granted under the limit in force when it was asked, not the one in force now"
    );
}
