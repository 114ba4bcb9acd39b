//! The store conformance suite on the in-memory store: two limiters over one store.

use std::sync::Arc;

use tollgate::store::Store;
use tollgate::{MemoryStore, MemoryStoreConfig, MonotonicClock};
use tollgate_conformance::Stores;

async fn memory_stores(_test: &'static str) -> Option<Stores> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 10_000,
            keys_per_limit_max: 10_000,
        },
        Arc::new(MonotonicClock::new()),
    ));
    Some(Stores {
        first: store.clone(),
        second: store,
    })
}

tollgate_conformance::conformance_tests!(memory_stores);
