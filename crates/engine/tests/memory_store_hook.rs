//! The limiter finds the memory store's synchronous ways through `Store::memory_store`, which a
//! wrapper forwards or not: a wrapper that forwards (as the server's metering does) keeps a
//! `LimitHandle`'s grants on the counter's word, off the store's `acquire`; one that does not
//! sends every decision through `acquire`. Both decide alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::store::{Decision, Renewed, Store, StoreFuture, Take, Usage};
use tollgate::{
    Algorithm, Check, Committed, Limit, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig,
    MonotonicClock, Policy, Priority, Reserve,
};

/// The memory store behind a wrapper that counts the decisions it is asked for.
#[derive(Debug)]
struct Counting {
    inner: MemoryStore,
    forwards: bool,
    acquires: AtomicU64,
}

impl Store for Counting {
    fn memory_store(&self) -> Option<&MemoryStore> {
        if self.forwards {
            self.inner.memory_store()
        } else {
            None
        }
    }

    fn acquire<'a>(
        &'a self,
        takes: &'a [Take<'a>],
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> StoreFuture<'a, Decision> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(takes, cost, priority, refundable)
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        self.inner.commit(take, seq, used)
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        self.inner.renew(take, fence)
    }

    fn pause<'a>(&'a self, take: Take<'a>, duration_us: u64) -> StoreFuture<'a, u64> {
        self.inner.pause(take, duration_us)
    }

    fn resume<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, bool> {
        self.inner.resume(take)
    }

    fn reset<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, bool> {
        self.inner.reset(take)
    }

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, Usage> {
        self.inner.usage(take)
    }

    fn set_limits(&self, limits: &tollgate::LimitTable) {
        self.inner.set_limits(limits);
    }
}

/// Checks of a GCRA limit with a burst of 10 through a handle: how many of the first 10 were
/// allowed and how many of them reached the wrapper's `acquire`; then whether the 11th was
/// refused (a refusal is explained the usual way, through the store).
fn run(forwards: bool) -> (usize, u64, bool) {
    let store = Arc::new(Counting {
        inner: MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 1_000,
                keys_per_limit_max: 100,
            },
            Arc::new(MonotonicClock::new()),
        ),
        forwards,
        acquires: AtomicU64::new(0),
    });
    let limiter = Limiter::new(store.clone(), LimiterConfig::default());
    let policy = Policy::rate(
        10,
        3_600_000_000,
        0,
        Algorithm::Gcra { burst: 10 },
        Reserve::default(),
    )
    .expect("policy");
    limiter.set_limit(Limit::new("vendor-x", policy, None).expect("limit"));
    let handle = limiter.handle("vendor-x").expect("handle");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let check = || {
        let answer = runtime
            .block_on(handle.check(None, 1, Priority::Normal))
            .expect("decided");
        matches!(answer, Check::Allowed(_))
    };
    let allowed = (0..10).filter(|_| check()).count();
    let acquires = store.acquires.load(Ordering::Relaxed);
    (allowed, acquires, !check())
}

#[test]
fn a_wrapper_that_forwards_the_memory_store_keeps_the_handles_fast_way() {
    let (allowed, acquires, refused) = run(true);
    assert_eq!(allowed, 10);
    // At most the first goes through the store; the rest are decided on the counter's word.
    assert!(acquires <= 1, "{acquires} grants went through acquire");
    assert!(refused);
}

#[test]
fn a_wrapper_that_does_not_forward_sends_every_decision_through_acquire() {
    let (allowed, acquires, refused) = run(false);
    assert_eq!(allowed, 10);
    assert_eq!(acquires, 10);
    assert!(refused);
}
