//! A background sweep of the memory store, so that counters of users who went quiet are
//! dropped even when no traffic touches their shard (G7: memory must come back).

use std::sync::Arc;
use std::time::Duration;

use tollgate::MemoryStore;

/// Every `interval`, examine up to `budget_per_shard` counters in each shard of `store` and
/// drop the idle ones. The task ends when the store is dropped everywhere else.
///
/// Needs a tokio runtime with the time driver; the sweep itself is short and bounded (it
/// never holds a shard's lock for more than `budget_per_shard` counters).
pub fn spawn_sweeper(
    store: &Arc<MemoryStore>,
    interval: Duration,
    budget_per_shard: usize,
) -> tokio::task::JoinHandle<()> {
    let store = Arc::downgrade(store);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(store) = store.upgrade() else {
                break;
            };
            store.sweep(budget_per_shard);
        }
    })
}
