//! The write-ahead record keeper's side of the memory store: batches of records due
//! (`record_batch`), and what landed or failed; `write_ahead.rs` keeps the budgets themselves.

use super::*;

impl MemoryStore {
    pub(super) fn wake_writer(&self) {
        if let Some(write_ahead) = &self.write_ahead {
            write_ahead.wake_writer();
        }
    }

    /// Wait until some counter is due for a record (with write-ahead on; never otherwise).
    pub async fn records_due(&self) {
        match &self.write_ahead {
            Some(write_ahead) => write_ahead.work().await,
            None => std::future::pending().await,
        }
    }

    /// The next records to write ahead, at most `rows_max` counters (those a request waits
    /// on first), or `None` when nothing is due, write-ahead is off, or a batch is still out:
    /// one batch at a time, each settled by `records_landed` or `records_failed` before the next.
    pub fn record_batch(&self, rows_max: usize) -> Option<RecordBatch> {
        let write_ahead = self.write_ahead.as_ref()?;
        if !write_ahead.begin_batch() {
            return None;
        }
        let mut batch = RecordBatch::default();
        for list in [List::Urgent, List::Due] {
            for (shard_index, shard) in self.shards.iter().enumerate() {
                let room = rows_max.saturating_sub(batch.counters.len());
                if room == 0 && list == List::Due {
                    break;
                }
                let mut guard = lock(shard);
                let Shard {
                    counters,
                    write_ahead: Some(shard_ahead),
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
        if write_ahead.take_pauses_changed() {
            let now = self.clock.now_us();
            batch.pauses = Some(self.limit_pauses(now));
        }
        if batch.is_empty() {
            write_ahead.abandon_batch();
            return None;
        }
        Some(batch)
    }

    /// The state database committed `batch`: its budgets may be spent.
    pub fn records_landed(&self, batch: RecordBatch) {
        self.settle_records(batch, None);
    }

    /// The state database did not take `batch` (`reason`): its counters are due again, and
    /// requests that wait for one of them fail with `StoreFailed` naming the reason.
    pub fn records_failed(&self, batch: RecordBatch, reason: &str) {
        self.settle_records(batch, Some(reason));
    }

    pub(super) fn settle_records(&self, batch: RecordBatch, failure: Option<&str>) {
        let Some(write_ahead) = &self.write_ahead else {
            return;
        };
        for Flight { shard, id } in batch.flights {
            let mut guard = lock(&self.shards[shard]);
            let Shard {
                counters,
                write_ahead: Some(shard_ahead),
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
            write_ahead.pauses_changed();
        }
        write_ahead.settle(failure);
    }

    /// No batch will be written any more (`reason`): requests waiting for a record fail, and
    /// so does every later request that needs one. Counters within their budget still grant.
    pub fn close_records(&self, reason: &str) {
        if let Some(write_ahead) = &self.write_ahead {
            write_ahead.close(reason);
        }
    }
}
