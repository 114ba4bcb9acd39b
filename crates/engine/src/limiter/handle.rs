//! `LimitHandle`: one limit looked up once, for a hot path that checks it over and over; on the
//! memory store it decides on the counter's word or tracked counter before the limiter's way.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tollgate_core::Priority;

use crate::error::Result;
use crate::hot::HotCounter;
use crate::limits::Limit;
use crate::store::{CounterId, Take};
use crate::sync::Ordering;

use super::{Check, Limiter, Request, Statuses, status};

/// One limit of a limiter, looked up once (`Limiter::handle`).
#[derive(Debug)]
pub struct LimitHandle {
    pub(super) limiter: Limiter,
    pub(super) limit: Arc<Limit>,
    /// The limiter's generation at which `limit` was last known to be the one in force. Moved
    /// forward when a change of the limits left this one as it was, so that changing another
    /// limit does not send this handle the slow way for good.
    pub(super) generation: AtomicU64,
    /// The counter's word, from the memory store (`MemoryStore::hot_counter`): decisions on
    /// it take no lock while the counter allows it.
    pub(super) hot: Option<Arc<HotCounter>>,
}

impl Clone for LimitHandle {
    fn clone(&self) -> LimitHandle {
        LimitHandle {
            limiter: self.limiter.clone(),
            limit: Arc::clone(&self.limit),
            generation: AtomicU64::new(self.generation.load(Ordering::Relaxed)),
            hot: self.hot.clone(),
        }
    }
}

impl LimitHandle {
    pub fn name(&self) -> &str {
        self.limit.name()
    }

    /// `Limiter::check` of `cost` units of this limit (for `key`, if it counts per key) at
    /// `priority`, not waiting.
    pub async fn check(&self, key: Option<&str>, cost: u64, priority: Priority) -> Result<Check> {
        if let Some(answer) = self.check_now(key, cost, priority) {
            return answer;
        }
        self.limiter.check(&self.request(key, cost, priority)).await
    }

    /// `check`, decided on the calling thread: `None` when the store must be asked (it does
    /// I/O), which `check` then does. With the memory store it always answers, and needs no
    /// executor.
    #[inline]
    pub fn check_now(
        &self,
        key: Option<&str>,
        cost: u64,
        priority: Priority,
    ) -> Option<Result<Check>> {
        // The memory store's own ways for a counter that needs nothing but its GCRA backlog: an
        // unkeyed limit's word, a keyed one's tracked counter. A request that waits may be
        // ahead of this one in the queue, and only the limiter's way checks the queue.
        let shared = &self.limiter.shared;
        if !shared.waiters.anyone_waiting() && self.in_force() {
            let policy = self.limit.policy();
            let step = match (key, &self.hot, shared.store.offers().in_process) {
                (None, Some(hot), _) => hot.decide(policy, cost, priority),
                (Some(key), _, Some(memory)) if self.limit.per().is_some() => {
                    let counter = CounterId {
                        limit: self.limit.name(),
                        key: Some(key),
                    };
                    memory.grant_tracked(Take { counter, policy }, cost, priority)
                }
                _ => None,
            };
            if let Some(step) = step {
                let mut allowed = Statuses::default();
                allowed.0.push(status(step.remaining, step.reset_after_us));
                return Some(Ok(Check::Allowed(allowed)));
            }
        }
        self.limiter
            .decide_now(&self.request(key, cost, priority), Some(self))
    }

    fn request<'r>(&'r self, key: Option<&'r str>, cost: u64, priority: Priority) -> Request<'r> {
        let request = Request::new(self.limit.name())
            .cost(cost)
            .priority(priority);
        match key {
            Some(key) => request.key(key),
            None => request,
        }
    }

    /// Whether `limit` is the limit in force: the limits have not changed since it was known
    /// to be, or they have and it is unchanged (then it is known to be again).
    #[inline]
    pub(super) fn in_force(&self) -> bool {
        let generation = self.limiter.shared.generation.load(Ordering::Acquire);
        generation == self.generation.load(Ordering::Relaxed) || self.in_force_since(generation)
    }

    /// `in_force` after a change of the limits, at `generation`.
    #[cold]
    fn in_force_since(&self, generation: u64) -> bool {
        let shared = &self.limiter.shared;
        // The table read now is at `generation` or later (a change bumps the generation after
        // putting its table in place), so if it still holds this limit, the limit was in force
        // at `generation`.
        let unchanged = shared
            .table_guard()
            .get(self.limit.name())
            .is_some_and(|limit| **limit == *self.limit);
        if unchanged {
            self.generation.store(generation, Ordering::Relaxed);
        }
        unchanged
    }
}
