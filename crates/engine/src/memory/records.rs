//! The write-ahead record keeper's side of the memory store: batches of records due
//! (`ahead_batch`), and what landed or failed; `ahead.rs` keeps the budgets themselves.

use super::*;

impl MemoryStore {
    pub(super) fn wake_writer(&self) {
        if let Some(ahead) = &self.ahead {
            ahead.wake_writer();
        }
    }

    /// Wait until some counter is due for a record (with write-ahead on; never otherwise).
    pub async fn ahead_due(&self) {
        match &self.ahead {
            Some(ahead) => ahead.work().await,
            None => std::future::pending().await,
        }
    }

    /// The next records to write ahead, at most `rows_max` counters (those a request waits
    /// on first), or `None` when nothing is due, write-ahead is off, or a batch is still out:
    /// one batch at a time, each settled by `ahead_landed` or `ahead_failed` before the next.
    pub fn ahead_batch(&self, rows_max: usize) -> Option<AheadBatch> {
        let ahead = self.ahead.as_ref()?;
        if !ahead.begin_batch() {
            return None;
        }
        let mut batch = AheadBatch::default();
        for list in [List::Urgent, List::Due] {
            for (shard_index, shard) in self.shards.iter().enumerate() {
                let room = rows_max.saturating_sub(batch.counters.len());
                if room == 0 && list == List::Due {
                    break;
                }
                let mut guard = lock(shard);
                let Shard {
                    counters,
                    ahead: Some(shard_ahead),
                    ..
                } = &mut *guard
                else {
                    continue;
                };
                // With write-ahead on, no handle holds a counter's word: the counter is the
                // truth.
                shard_ahead.take(list, room, shard_index, &mut batch, |id| {
                    let index = counters.get_index_of(id)?;
                    let (limit, key) = id.texts();
                    let state = counters[index].counter.to_words();
                    Some((
                        index,
                        SavedCounter {
                            limit,
                            key,
                            state,
                            budget: 0,
                        },
                    ))
                });
            }
        }
        if ahead.take_pauses_changed() {
            let now = self.clock.now_us();
            batch.pauses = Some(self.limit_pauses(now));
        }
        if batch.is_empty() {
            ahead.abandon_batch();
            return None;
        }
        Some(batch)
    }

    /// The state database committed `batch`: its budgets may be spent.
    pub fn ahead_landed(&self, batch: AheadBatch) {
        self.settle_ahead(batch, None);
    }

    /// The state database did not take `batch` (`reason`): its counters are due again, and
    /// requests that wait for one of them fail with `StoreFailed` naming the reason.
    pub fn ahead_failed(&self, batch: AheadBatch, reason: &str) {
        self.settle_ahead(batch, Some(reason));
    }

    pub(super) fn settle_ahead(&self, batch: AheadBatch, failure: Option<&str>) {
        let Some(ahead) = &self.ahead else {
            return;
        };
        for Flight { shard, id } in batch.flights {
            let mut guard = lock(&self.shards[shard]);
            let Shard {
                counters,
                ahead: Some(shard_ahead),
                ..
            } = &mut *guard
            else {
                continue;
            };
            if let Some(index) = counters.get_index_of(&id) {
                shard_ahead.settled(index, id, failure.is_none());
            }
        }
        if failure.is_some() && batch.pauses.is_some() {
            ahead.pauses_changed();
        }
        ahead.settle(failure);
    }

    /// No batch will be written any more (`reason`): requests waiting for a record fail, and
    /// so does every later request that needs one. Counters within their budget still grant.
    pub fn ahead_close(&self, reason: &str) {
        if let Some(ahead) = &self.ahead {
            ahead.close(reason);
        }
    }
}
