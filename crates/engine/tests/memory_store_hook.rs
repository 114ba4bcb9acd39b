//! The limiter finds the memory store's synchronous ways through `Store::offers`, which a
//! wrapper forwards or not: a wrapper that forwards (as the server's metering does) keeps a
//! `LimitHandle`'s grants on the counter's word, off the store's `acquire`; one that does not
//! sends every decision through `acquire`. Both decide alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::store::{Ask, Decision, Forward, Offers, Store, StoreFuture};
use tollgate::{
    Algorithm, Check, Limit, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig,
    MonotonicClock, Policy, Priority, Reserve,
};

/// The memory store behind a wrapper that counts the decisions it is asked for.
#[derive(Debug)]
struct Counting {
    inner: MemoryStore,
    forwards: bool,
    acquires: AtomicU64,
}

impl Forward for Counting {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    fn offers(&self) -> Offers<'_> {
        let inner = self.inner.offers();
        if self.forwards {
            inner
        } else {
            Offers {
                in_process: None,
                ..inner
            }
        }
    }

    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(ask)
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
