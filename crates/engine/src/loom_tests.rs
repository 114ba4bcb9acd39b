//! Loom models of the engine's concurrent parts: the sharded memory store (no double grant,
//! all-or-nothing across shards, no lock-order deadlock, the key cap under racing inserts, a
//! hot counter's lock-free grants against the store's own, a key's word held through a racing
//! sweep) and the wait queue's wake-ups (no
//! lost wake-up, the turn passes on when a waiter leaves).
//!
//! Run with `RUSTFLAGS="--cfg tollgate_loom" cargo test -p tollgate --lib --release loom`.

use std::sync::Arc;

use loom::thread;
use tollgate_core::{Algorithm, Policy, Priority, Reserve};

use crate::clock::ManualClock;
use crate::error::Error;
use crate::memory::{MemoryStore, MemoryStoreConfig};
use crate::store::{Costs, CounterId, Take};
use crate::waiters::{Caps, WaitQueue};

/// No cap on waiting requests: the models are about wake-ups, not caps.
const UNCAPPED: Caps = Caps {
    waiters_max: usize::MAX,
    waiters_per_limit_max: usize::MAX,
};

fn store(keys_tracked_max: u64) -> MemoryStore {
    MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max,
            // The store-wide cap alone: these cases are about it.
            keys_per_limit_max: u64::MAX,
        },
        Arc::new(ManualClock::new(1_000_000)),
    )
}

fn one_per_second() -> Policy {
    Policy::rate(1, 1_000_000, 0, Algorithm::Fixed, Reserve::default()).expect("valid")
}

fn take<'a>(limit: &'a str, key: Option<&'a str>, policy: &'a Policy) -> Take<'a> {
    Take {
        counter: CounterId { limit, key },
        policy,
    }
}

/// One unit of the unkeyed limit "vendor", asked of the store directly: whether it was granted.
fn grant_one(store: &MemoryStore, policy: &Policy, refundable: bool) -> bool {
    let takes = [take("vendor", None, policy)];
    store
        .acquire_now(&takes, Costs::Same(1), Priority::Normal, refundable)
        .expect("store answers")
        .is_granted()
}

/// One unit of `take`'s counter asked of the store alone, not refundable (a decision on one
/// counter publishes its word again): whether it was granted.
fn grant_final(store: &MemoryStore, take: Take<'_>) -> bool {
    let takes = [take];
    store
        .acquire_now(&takes, Costs::Same(1), Priority::Normal, false)
        .is_ok_and(|decision| decision.is_granted())
}

#[test]
fn loom_two_racing_acquires_never_both_take_the_last_unit() {
    loom::model(|| {
        let store = Arc::new(store(100));
        let policy = one_per_second();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let store = store.clone();
                thread::spawn(move || grant_one(&store, &policy, true))
            })
            .collect();
        let granted = handles
            .into_iter()
            .map(|handle| handle.join().expect("thread"))
            .filter(|granted| *granted)
            .count();
        assert_eq!(granted, 1);
    });
}

/// A handle's grant on the hot word races the store's grant under the lock (which seizes the
/// word, decides, and publishes again): one unit left, so exactly one of them gets it, and the
/// store sees the handle's grant afterwards whichever won.
#[test]
fn loom_a_hot_grant_and_a_locked_grant_never_both_take_the_last_unit() {
    loom::model(|| {
        let store = Arc::new(store(100));
        let policy = Policy::rate(
            1,
            1_000_000,
            0,
            Algorithm::Gcra { burst: 2 },
            Reserve::default(),
        )
        .expect("valid");
        let hot = store
            .hot_counter(take("vendor", None, &policy))
            .expect("an unkeyed GCRA counter has a hot word");
        assert!(
            grant_final(&store, take("vendor", None, &policy)),
            "the first of two units, which publishes the word"
        );
        let by_handle = thread::spawn(move || hot.decide(&policy, 1, Priority::Normal).is_some());
        let by_store = {
            let store = store.clone();
            thread::spawn(move || grant_final(&store, take("vendor", None, &policy)))
        };
        let by_handle = by_handle.join().expect("thread");
        let by_store = by_store.join().expect("thread");
        assert!(by_handle ^ by_store, "handle {by_handle}, store {by_store}");
        assert!(!grant_one(&store, &policy, false), "both units are counted");
    });
}

/// A key handle's grant on its key's word races a sweep followed by the store's own grant on
/// the same key. The counter is idle when they start, so a sweep that dropped it while the
/// word is held would let the store make a fresh counter beside the word, and both would
/// grant the one unit there is room for.
#[test]
fn loom_a_held_key_word_keeps_its_counter_through_a_racing_sweep() {
    loom::model(|| {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store = Arc::new(MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 100,
                keys_per_limit_max: 100,
            },
            clock.clone(),
        ));
        // One unit a second, one at once.
        let policy = Policy::rate(
            1,
            1_000_000,
            0,
            Algorithm::Gcra { burst: 1 },
            Reserve::default(),
        )
        .expect("valid");
        let hot = store
            .hot_counter(take("api", Some("ada"), &policy))
            .expect("a keyed GCRA counter has a word");
        assert!(
            grant_final(&store, take("api", Some("ada"), &policy)),
            "the first unit, which publishes the word"
        );
        clock.advance_us(10_000_000);
        assert!(
            hot.decide(&policy, 1, Priority::Normal).is_some(),
            "the next, on the word alone"
        );
        // Long past: the counter is idle (the store last moved it two grants ago), and its
        // one unit open again.
        clock.advance_us(10_000_000);
        let by_handle = thread::spawn(move || hot.decide(&policy, 1, Priority::Normal).is_some());
        let by_store = {
            let store = store.clone();
            thread::spawn(move || {
                store.sweep(100);
                grant_final(&store, take("api", Some("ada"), &policy))
            })
        };
        let by_handle = by_handle.join().expect("thread");
        let by_store = by_store.join().expect("thread");
        assert!(by_handle ^ by_store, "handle {by_handle}, store {by_store}");
    });
}

#[test]
fn loom_requests_over_shards_in_opposite_orders_neither_deadlock_nor_split() {
    loom::model(|| {
        let store = Arc::new(store(100));
        let policy = one_per_second();
        let spawn = |names: [&'static str; 2]| {
            let store = store.clone();
            thread::spawn(move || {
                let takes = [take(names[0], None, &policy), take(names[1], None, &policy)];
                store
                    .acquire_now(&takes, Costs::Same(1), Priority::Normal, true)
                    .expect("store answers")
                    .is_granted()
            })
        };
        // Under loom "a" and "b" land on different shards, so the two requests lock both
        // shards in opposite request orders.
        let first = spawn(["a", "b"]);
        let second = spawn(["b", "a"]);
        let granted = [first, second]
            .into_iter()
            .map(|handle| handle.join().expect("thread"))
            .filter(|granted| *granted)
            .count();
        assert_eq!(granted, 1, "exactly one request gets both units");
        // All or nothing: neither limit has a unit left, and neither was half-taken.
        let takes = [take("a", None, &policy)];
        assert!(
            !store
                .acquire_now(&takes, Costs::Same(1), Priority::Normal, true)
                .expect("answers")
                .is_granted()
        );
        let takes = [take("b", None, &policy)];
        assert!(
            !store
                .acquire_now(&takes, Costs::Same(1), Priority::Normal, true)
                .expect("answers")
                .is_granted()
        );
    });
}

#[test]
fn loom_the_key_cap_holds_under_racing_inserts() {
    loom::model(|| {
        let store = Arc::new(store(1));
        let policy = one_per_second();
        let handles: Vec<_> = ["k1", "k2"]
            .into_iter()
            .map(|key| {
                let store = store.clone();
                thread::spawn(move || {
                    let takes = [take("per-user", Some(key), &policy)];
                    match store.acquire_now(&takes, Costs::Same(1), Priority::Normal, true) {
                        Ok(decision) => decision.is_granted(),
                        Err(Error::TooManyKeys { .. }) => false,
                        Err(other) => panic!("unexpected {other:?}"),
                    }
                })
            })
            .collect();
        let granted = handles
            .into_iter()
            .map(|handle| handle.join().expect("thread"))
            .filter(|granted| *granted)
            .count();
        assert_eq!(granted, 1);
        assert_eq!(store.len(), 1);
    });
}

#[test]
fn loom_a_notify_before_the_wait_is_not_lost() {
    loom::model(|| {
        let queue = Arc::new(WaitQueue::default());
        let counters = [CounterId {
            limit: "vendor",
            key: None,
        }];
        let waiter = queue
            .register(&counters, Priority::Normal, Costs::Same(1), false, UNCAPPED)
            .expect("uncapped");
        let signal = waiter.signal.clone();
        let notifier = {
            let queue = queue.clone();
            thread::spawn(move || {
                queue.wake_head(CounterId {
                    limit: "vendor",
                    key: None,
                })
            })
        };
        loom::future::block_on(signal.notified());
        notifier.join().expect("thread");
        drop(waiter);
    });
}

#[test]
fn loom_a_leaving_head_wakes_the_next_waiter() {
    loom::model(|| {
        // Waiters borrow their queue; the spawned thread needs a 'static one.
        let queue: &'static WaitQueue = Box::leak(Box::new(WaitQueue::default()));
        let counters = [CounterId {
            limit: "vendor",
            key: None,
        }];
        let head = queue
            .register(&counters, Priority::High, Costs::Same(1), false, UNCAPPED)
            .expect("uncapped");
        let next = queue
            .register(&counters, Priority::Normal, Costs::Same(1), false, UNCAPPED)
            .expect("uncapped");
        assert!(queue.is_head(&head));
        assert!(!queue.is_head(&next));
        let signal = next.signal.clone();
        // `head` leaves on another thread (granted, timed out or cancelled).
        let leaver = thread::spawn(move || drop(head));
        loom::future::block_on(signal.notified());
        leaver.join().expect("thread");
        assert!(queue.is_head(&next));
    });
}
