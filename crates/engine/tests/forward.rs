//! A wrapper built on `Forward` that writes nothing but `inner` is the store it wraps: it passes
//! the whole conformance suite, and keeps every capability of the inner store (its in-process
//! ways, its failing `ping`), so no wrapper drops one by leaving a method out.

use std::sync::Arc;

use tollgate::store::{Ask, CounterId, Forward, Store, Take};
use tollgate::{
    Algorithm, MemoryStore, MemoryStoreConfig, MonotonicClock, Policy, Priority, Reserve,
};
use tollgate_conformance::Stores;

/// Forwards everything: the least a wrapper can write.
#[derive(Debug)]
struct Bare(Arc<MemoryStore>);

impl Forward for Bare {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }
}

fn memory(write_ahead: bool) -> Arc<MemoryStore> {
    let config = MemoryStoreConfig {
        keys_tracked_max: 10_000,
        keys_per_limit_max: 10_000,
    };
    let clock = Arc::new(MonotonicClock::new());
    Arc::new(if write_ahead {
        MemoryStore::with_write_ahead(config, clock)
    } else {
        MemoryStore::new(config, clock)
    })
}

async fn bare_stores(_test: &'static str) -> Option<Stores> {
    let store: Arc<dyn Store> = Arc::new(Bare(memory(false)));
    Some(Stores {
        first: store.clone(),
        second: store,
    })
}

tollgate_conformance::conformance_tests!(bare_stores);

#[test]
fn a_bare_wrapper_offers_what_its_store_offers() {
    let inner = memory(false);
    let bare = Bare(inner.clone());
    let offered = Store::offers(&bare)
        .in_process
        .expect("the memory store's in-process ways, through the wrapper");
    assert!(std::ptr::addr_eq(offered, Arc::as_ptr(&inner)));
    assert!(Store::offers(&bare).queue.is_none());
}

#[tokio::test]
async fn a_bare_wrapper_fails_its_ping_when_its_store_does() {
    let inner = memory(true);
    let bare = Bare(inner.clone());
    assert!(Store::ping(&bare).await.is_ok());
    // A new counter needs a record before it grants; its batch fails.
    let policy =
        Policy::rate(10, 1_000_000, 0, Algorithm::Sliding, Reserve::default()).expect("a policy");
    let takes = [Take {
        counter: CounterId {
            limit: "vendor",
            key: None,
        },
        policy: &policy,
    }];
    let asked = Store::acquire(&bare, Ask::new(&takes, 1, Priority::Normal));
    assert!(asked.into_ready().is_none(), "waits for a record");
    let batch = inner.record_batch(10).expect("a batch is due");
    inner.records_failed(batch, "disk full");
    // The store says it is failing; a wrapper that answered `ping` itself would not.
    assert!(Store::ping(&*inner).await.is_err());
    assert!(Store::ping(&bare).await.is_err());
}
