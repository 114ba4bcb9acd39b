//! Natural batching (`batch.rs`) under load and when callers give up: a burst past `BATCH_MAX`
//! never grants past its limit and is decided in fewer calls than acquires; an acquire whose
//! call in flight is dropped is not stranded; one whose caller gave up before its batch left
//! counts nothing; with batching off every acquire is its own call. Whether a batch decides as
//! the same acquires one by one is `differential_tests.rs`'s.
//!
//! Needs `TOLLGATE_TEST_REDIS`; skipped (loudly) without it.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tollgate::store::{Costs, CounterId, CounterOutcome, Decision, Take};
use tollgate_core::{Algorithm, Policy, Priority, Reserve};

use crate::RedisStore;
use crate::batch::{BATCH_MAX, CALLS_PER_SLOT};
use crate::differential_tests::{connect, redis_url};

type Acquire<'a> = Pin<Box<dyn Future<Output = tollgate::Result<Decision>> + 'a>>;

/// A store on a namespace of its own, declared new so that grants start at once.
fn store(runtime: &tokio::runtime::Runtime, test: &str) -> Option<RedisStore> {
    let store = connect(runtime, redis_url()?, &format!("batch-{test}"), 100_000);
    runtime
        .block_on(store.begin_new_namespace())
        .expect("declare the namespace new");
    Some(store)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A window far longer than any test: nothing granted stops counting while it runs.
fn fixed(limit: u64) -> Policy {
    Policy::rate(
        limit,
        3_600_000_000,
        0,
        Algorithm::Fixed,
        Reserve::default(),
    )
    .expect("valid")
}

/// `count` acquires of one unit each on `take`, made but not yet polled.
fn acquires<'a>(store: &'a RedisStore, take: &'a [Take<'a>], count: usize) -> Vec<Acquire<'a>> {
    (0..count)
        .map(|_| {
            Box::pin(store.acquire_remote(take, Costs::Same(1), Priority::Normal, false, None))
                as Acquire<'a>
        })
        .collect()
}

/// Poll each once, in order: the first two find room on their slot and their calls go; the
/// others find both in flight and wait.
fn poll_once(acquires: &mut [Acquire<'_>]) {
    let mut context = Context::from_waker(std::task::Waker::noop());
    for acquire in acquires {
        assert!(
            acquire.as_mut().poll(&mut context).is_pending(),
            "an acquire answered before Redis could"
        );
    }
}

fn granted(decisions: &[tollgate::Result<Decision>]) -> usize {
    decisions
        .iter()
        .filter(|decision| {
            decision
                .as_ref()
                .is_ok_and(|decision| matches!(decision.outcomes()[0], CounterOutcome::Granted(_)))
        })
        .count()
}

async fn used(store: &RedisStore, take: Take<'_>) -> u64 {
    store.usage_remote(take).await.expect("usage").used
}

#[test]
fn a_burst_past_the_batch_size_is_batched_and_never_grants_past_its_limit() {
    let runtime = runtime();
    let Some(store) = store(&runtime, "burst") else {
        return;
    };
    let policy = fixed(100);
    let take = [Take {
        counter: CounterId {
            limit: "burst",
            key: Some("k"),
        },
        policy: &policy,
    }];
    let burst = 3 * BATCH_MAX + 10;
    let decisions = runtime.block_on(async {
        let acquires = acquires(&store, &take, burst);
        futures_util::future::join_all(acquires).await
    });
    assert!(decisions.iter().all(Result::is_ok), "every acquire decided");
    assert_eq!(granted(&decisions), 100, "exactly the limit granted");
    assert_eq!(runtime.block_on(used(&store, take[0])), 100);
    // Everything but the first two calls' acquires waited for a call in flight.
    assert!(
        store.batched_acquires() >= (burst - CALLS_PER_SLOT - BATCH_MAX) as u64,
        "{} of {burst} acquires batched",
        store.batched_acquires()
    );
}

#[test]
fn acquires_waiting_on_a_call_that_is_dropped_are_still_decided() {
    let runtime = runtime();
    let Some(store) = store(&runtime, "dropped") else {
        return;
    };
    let policy = fixed(100);
    let take = [Take {
        counter: CounterId {
            limit: "dropped",
            key: Some("k"),
        },
        policy: &policy,
    }];
    let decisions = runtime.block_on(async {
        let mut acquires = acquires(&store, &take, 6);
        poll_once(&mut acquires);
        // The acquire whose call is in flight gives up (its client went away).
        drop(acquires.remove(0));
        let rest = futures_util::future::join_all(acquires);
        tokio::time::timeout(Duration::from_secs(30), rest)
            .await
            .expect("the waiting acquires are not stranded")
    });
    assert_eq!(granted(&decisions), 5, "{decisions:?}");
    assert_eq!(store.batched_acquires(), 4);
    // The dropped call may or may not have reached Redis: at most one unit more counted.
    let used = runtime.block_on(used(&store, take[0]));
    assert!((5..=6).contains(&used), "{used} units counted");
}

#[test]
fn an_acquire_given_up_before_its_batch_left_counts_nothing() {
    let runtime = runtime();
    let Some(store) = store(&runtime, "given-up") else {
        return;
    };
    let policy = fixed(100);
    let take = [Take {
        counter: CounterId {
            limit: "given-up",
            key: Some("k"),
        },
        policy: &policy,
    }];
    let decisions = runtime.block_on(async {
        let mut acquires = acquires(&store, &take, 6);
        poll_once(&mut acquires);
        // Two waiting acquires give up while the first call is in flight.
        drop(acquires.remove(4));
        drop(acquires.remove(2));
        futures_util::future::join_all(acquires).await
    });
    assert_eq!(granted(&decisions), 4, "{decisions:?}");
    assert_eq!(runtime.block_on(used(&store, take[0])), 4);
    assert_eq!(store.batched_acquires(), 2);
}

#[test]
fn with_batching_off_every_acquire_is_its_own_call() {
    let runtime = runtime();
    let Some(store) = store(&runtime, "off") else {
        return;
    };
    store.set_batching(false);
    let policy = fixed(10);
    let take = [Take {
        counter: CounterId {
            limit: "off",
            key: Some("k"),
        },
        policy: &policy,
    }];
    let decisions = runtime.block_on(async {
        let acquires = acquires(&store, &take, 30);
        futures_util::future::join_all(acquires).await
    });
    assert_eq!(granted(&decisions), 10);
    assert_eq!(store.batched_acquires(), 0);
}
