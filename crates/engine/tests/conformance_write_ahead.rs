//! The store conformance suite on the in-memory store writing its budgets ahead
//! (`MemoryStore::with_write_ahead`), with a task that lands every batch at once: waiting for a
//! record changes when an answer comes, never what it is.

use std::sync::Arc;

use tollgate::store::Store;
use tollgate::{MemoryStore, MemoryStoreConfig, MonotonicClock};
use tollgate_conformance::Stores;

async fn write_ahead_stores(_test: &'static str) -> Option<Stores> {
    let memory = Arc::new(MemoryStore::with_write_ahead(
        MemoryStoreConfig {
            keys_tracked_max: 10_000,
            keys_per_limit_max: 10_000,
        },
        Arc::new(MonotonicClock::new()),
    ));
    let writer = memory.clone();
    // The state database: every batch committed as soon as it is taken.
    tokio::spawn(async move {
        loop {
            while let Some(batch) = writer.record_batch(1_000) {
                writer.records_landed(batch);
            }
            writer.records_due().await;
        }
    });
    let store: Arc<dyn Store> = memory;
    Some(Stores {
        first: store.clone(),
        second: store,
    })
}

tollgate_conformance::conformance_tests!(write_ahead_stores);
