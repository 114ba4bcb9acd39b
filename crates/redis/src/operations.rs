//! The calls on one slot (sent by `batch.rs`): a counter's keys and admission to its limit's
//! budget of keys, commit, renew, pause, resume, usage and charge on one counter, and a new
//! namespace's generations.

use std::sync::{Arc, PoisonError};

use futures_util::StreamExt;
use redis::Value;
use tokio::sync::OnceCell;
use tollgate::Result;
use tollgate::store::{CounterId, Renewed, Take, Usage, WaiterId};
use tollgate_core::Committed;

use crate::abi::{
    OP_ADMIT as ADMIT, OP_BEGIN, OP_CHARGE as CHARGE, OP_COMMIT as COMMIT, OP_LEAVE as LEAVE,
    OP_PAUSE as PAUSE, OP_RENEW as RENEW, OP_RESUME as RESUME, OP_USAGE as USAGE,
};
use crate::call::{Admission, Carried, Head, Numbers, PauseRef, Reply, TallyRef, policy_args, u};
use crate::errors::{failed, not_admitted, permit_error, store_error, too_many_keys, unavailable};
use crate::keys;
use crate::store::RedisStore;

/// Admissions a store keeps (`admit_key`) before it forgets them all: each is one counter's
/// cover, worth using again until its end (a few spans of its limit's window).
const ADMISSIONS_KEPT_MAX: usize = 4096;

/// Forgets an admission that never answered (every caller gave up, or the ask failed) when its
/// caller is done with it, unless another took its place.
struct Forget<'a> {
    store: &'a RedisStore,
    name: String,
    cell: Arc<OnceCell<Carried>>,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let mut admitting = self
            .store
            .admitting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.cell.get().is_none()
            && admitting
                .get(&self.name)
                .is_some_and(|cell| Arc::ptr_eq(cell, &self.cell))
        {
            admitting.remove(&self.name);
        }
    }
}

/// Calls of one operation on one slot, each after an admission the previous asked for, before
/// it fails: a cover is given two spans ahead, so the second call finds it enough unless the
/// two nodes' clocks are a span apart.
pub(crate) const ADMISSION_ATTEMPTS_MAX: usize = 3;

impl RedisStore {
    /// Take the namespace as new, if Redis holds nothing of it: its generations start in the
    /// past, so its counters are made without the hold that a namespace found empty otherwise
    /// gets (G6). For a caller that knows the namespace was never used (the server asks its
    /// rules database); one that was used and comes back empty must not call this. Returns
    /// whether the namespace was new; generations Redis already keeps are left as they are. On
    /// a cluster this writes one generation per slot (16,384), many at a time.
    pub async fn begin_new_namespace(&self) -> Result<bool> {
        let numbers = Numbers::new(OP_BEGIN);
        let slots: Vec<u16> = if self.is_cluster() {
            (0..keys::SLOTS).collect()
        } else {
            vec![0]
        };
        // One command per slot, many in flight at once: a cluster pipeline may not cross slots.
        let answers: Vec<Result<Value>> = futures_util::stream::iter(slots)
            .map(|slot| {
                let numbers = &numbers;
                async move {
                    self.caller
                        .call_value(&[self.keys.generation(slot)], &[&numbers.0])
                        .await
                }
            })
            .buffer_unordered(256)
            .collect()
            .await;
        let mut created = 0;
        for answer in answers {
            if matches!(answer?, Value::Int(1)) {
                created += 1;
            }
        }
        Ok(created > 0)
    }

    /// Run the script on one slot: one round trip. `keys` start with the slot's generation.
    pub(crate) async fn run(&self, keys: &[String], args: &[&[u8]]) -> Result<(Head, Reply)> {
        self.caller.call(keys, args).await
    }

    /// The generation and three keys of `take`'s counter, and its budget's key when in that
    /// slot: what a call on that counter alone names; and the counter's admission.
    fn counter_call(&self, take: Take<'_>) -> (Vec<String>, Admission) {
        let slot = self.keys.counter_slot(take.counter);
        let mut keys = Vec::with_capacity(6);
        keys.push(self.keys.generation(slot));
        keys.extend(self.keys.counter_keys(slot, take.counter));
        let admission = self.admission(take, slot, &mut keys);
        (keys, admission)
    }

    /// The budget of keys of `limit`: its own, or the store's.
    fn budget(&self, limit: &str) -> u64 {
        self.limits
            .lock()
            .ok()
            .and_then(|limits| limits.get(limit).and_then(|&(_, keys_max)| keys_max))
            .unwrap_or(self.config.keys_per_limit_max)
    }

    /// The admission of `take`'s counter in a call on `slot`; the budget's key joins `keys`
    /// when it is in that slot (on one Redis, always).
    pub(crate) fn admission(&self, take: Take<'_>, slot: u16, keys: &mut Vec<String>) -> Admission {
        let limit = take.counter.limit;
        let tally = if take.counter.key.is_none() {
            TallyRef::Unkeyed
        } else if !self.is_cluster() || self.keys.pause_slot(limit) == slot {
            keys.push(self.keys.limit_tally(limit));
            TallyRef::Key(keys.len())
        } else {
            TallyRef::Elsewhere
        };
        Admission {
            tally,
            budget: if take.counter.key.is_some() {
                self.budget(limit)
            } else {
                0
            },
            carried: Carried::Nothing,
        }
    }

    /// Ask `take`'s limit's budget, in its own slot, to count its key (whose counter is covered
    /// until `cover`) until at least `need` (`tally.rs`); `request`: for a request, which a
    /// budget held after a loss does not admit.
    ///
    /// The budget cannot tell one key from another: each ask for a key not yet covered counts
    /// it once more. So this process keeps what it asked for each counter (`admitting`): callers
    /// that need the same counter admitted while an ask is in flight share its answer, and a
    /// cover given is used again while it reaches as far as a caller needs. Without that, one
    /// client's burst on one new key would spend its limit's whole budget. Using a cover again
    /// is what the budget counted: this one counter, until that end. A refusal, a hold or a
    /// failure is never used again; the next caller asks anew.
    pub(crate) async fn admit_key(
        &self,
        take: Take<'_>,
        cover: u64,
        need: u64,
        request: bool,
    ) -> Result<Carried> {
        let apart = self.is_cluster();
        let name = format!("{}:{}", u8::from(request), self.keys.counter(take.counter));
        let cell = {
            let mut admitting = self
                .admitting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let kept = admitting.get(&name).filter(|cell| match cell.get() {
                None => true,
                Some(&Carried::Cover(end)) => end >= need,
                Some(_) => false,
            });
            match kept {
                Some(cell) => Arc::clone(cell),
                None => {
                    if admitting.len() >= ADMISSIONS_KEPT_MAX {
                        admitting.clear();
                    }
                    let cell = Arc::new(OnceCell::new());
                    admitting.insert(name.clone(), Arc::clone(&cell));
                    cell
                }
            }
        };
        let _forget = Forget {
            store: self,
            name,
            cell: Arc::clone(&cell),
        };
        cell.get_or_try_init(|| async { self.admit_at(take, cover, need, request, apart).await.1 })
            .await
            .copied()
    }

    /// `admit_key`, and the store's clock at the decision (0 when Redis did not answer);
    /// `apart`: the budget may be lost apart from its counters (to test that rule on one Redis).
    pub(crate) async fn admit_at(
        &self,
        take: Take<'_>,
        cover: u64,
        need: u64,
        request: bool,
        apart: bool,
    ) -> (u64, Result<Carried>) {
        let limit = take.counter.limit;
        let slot = self.keys.pause_slot(limit);
        let keys = [self.keys.generation(slot), self.keys.limit_tally(limit)];
        let mut numbers = Numbers::new(ADMIT);
        numbers.extend(&policy_args(take.policy)).extend(&[
            self.budget(limit),
            cover,
            need,
            u64::from(request),
            u64::from(apart),
        ]);
        let (head, reply) = match self.run(&keys, &[&numbers.0]).await {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let value = u(reply.numbers.get(3).copied().unwrap_or(0));
        let answer = match reply.status.as_str() {
            "ok" => Ok(Carried::Cover(value)),
            "held" => Ok(Carried::Held(value)),
            "keys" => Err(too_many_keys(limit, value)),
            other => Err(failed(format!("unexpected script status {other}"))),
        };
        (head.now_us, answer)
    }

    /// Run an operation on `take`'s counter: the policy, its `admission` and then `own` numbers,
    /// with `rest` arguments after them. When the script asks for the key to be admitted in
    /// its budget's slot, that is one call there and this one again.
    async fn run_counter(
        &self,
        take: Take<'_>,
        operation: u64,
        keys: &[String],
        mut admission: Admission,
        own: &[f64],
        rest: &[&[u8]],
    ) -> Result<(Head, Reply)> {
        for _ in 0..ADMISSION_ATTEMPTS_MAX {
            let mut numbers = Numbers::new(operation);
            numbers
                .extend(&policy_args(take.policy))
                .admission(&admission, self.is_cluster());
            for &number in own {
                numbers.push_f64(number);
            }
            let mut args: Vec<&[u8]> = vec![&numbers.0];
            args.extend_from_slice(rest);
            let (head, reply) = self.caller.call(keys, &args).await?;
            let number = |index: usize| u(reply.numbers.get(index).copied().unwrap_or(0));
            match reply.status.as_str() {
                "admit" => {
                    admission.carried = self.admit_key(take, number(4), number(5), false).await?
                }
                "keys" => return Err(too_many_keys(take.counter.limit, number(4))),
                _ => return Ok((head, reply)),
            }
        }
        Err(not_admitted(take.counter.limit))
    }

    /// The end of `limit`'s pause, read from its own slot (0 for none): for a counter in
    /// another slot, whose call cannot read it.
    /// One plain command (no script), within the store's timeout.
    pub(crate) async fn query(&self, command: &redis::Cmd) -> Result<Value> {
        tokio::time::timeout(self.config.timeout, self.caller.backend.query(command))
            .await
            .map_err(|_| unavailable("Redis did not answer in time"))?
            .map_err(store_error)
    }

    pub(crate) async fn read_pause(&self, limit: &str) -> Result<u64> {
        let value = self
            .query(redis::cmd("GET").arg(self.keys.limit_pause(limit)))
            .await?;
        Ok(match value {
            Value::BulkString(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.parse::<f64>().ok())
                .map_or(0, |until| until as u64),
            _ => 0,
        })
    }

    pub(crate) async fn commit_remote(
        &self,
        take: Take<'_>,
        seq: u64,
        used: u64,
    ) -> Result<Committed> {
        self.commit_at(take, seq, used).await.1
    }

    /// Commit, and the store's clock at the decision (0 when Redis did not answer).
    pub(crate) async fn commit_at(
        &self,
        take: Take<'_>,
        seq: u64,
        used: u64,
    ) -> (u64, Result<Committed>) {
        let (keys, admission) = self.counter_call(take);
        let channel = self.keys.wake_channel().as_bytes();
        let own = [seq as f64, used as f64];
        let answer = self
            .run_counter(take, COMMIT, &keys, admission, &own, &[channel])
            .await;
        let (head, reply) = match answer {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => Ok(Committed {
                refunded: u(reply.numbers.get(3).copied().unwrap_or(0)),
                released: u(reply.numbers.get(4).copied().unwrap_or(0)),
            }),
            status => Err(permit_error(status, &reply.numbers, used)),
        };
        (head.now_us, result)
    }

    pub(crate) async fn renew_remote(&self, take: Take<'_>, fence: u64) -> Result<Renewed> {
        let (now, result) = self.renew_at(take, fence).await;
        result.map(|expires_at| Renewed {
            expires_in_us: expires_at.saturating_sub(now),
        })
    }

    /// Renew, and the store's clock at the decision; the result is the absolute expiry.
    pub(crate) async fn renew_at(&self, take: Take<'_>, fence: u64) -> (u64, Result<u64>) {
        let (keys, admission) = self.counter_call(take);
        let answer = self
            .run_counter(take, RENEW, &keys, admission, &[fence as f64], &[])
            .await;
        let (head, reply) = match answer {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => Ok(u(reply.numbers.get(3).copied().unwrap_or(0))),
            status => Err(permit_error(status, &reply.numbers, 0)),
        };
        (head.now_us, result)
    }

    pub(crate) async fn pause_remote(&self, take: Take<'_>, duration_us: u64) -> Result<u64> {
        let (now, result) = self.pause_at(take, duration_us).await;
        result.map(|until| until.saturating_sub(now))
    }

    /// Pause, and the store's clock at the decision; the result is the absolute end.
    pub(crate) async fn pause_at(&self, take: Take<'_>, duration_us: u64) -> (u64, Result<u64>) {
        let keyed = take.counter.key.is_some();
        let (keys, admission) = self.pause_call(take);
        let own = [duration_us as f64, f64::from(u8::from(keyed))];
        let answer = self
            .run_counter(take, PAUSE, &keys, admission, &own, &[])
            .await;
        let (head, reply) = match answer {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => Ok(u(reply.numbers.get(3).copied().unwrap_or(0))),
            other => Err(failed(format!("unexpected script status {other}"))),
        };
        (head.now_us, result)
    }

    /// The keys and admission of a call on `take`'s own pause: its counter's for a key, else
    /// the limit's pause.
    fn pause_call(&self, take: Take<'_>) -> (Vec<String>, Admission) {
        if take.counter.key.is_some() {
            return self.counter_call(take);
        }
        let slot = self.keys.pause_slot(take.counter.limit);
        let mut keys = vec![
            self.keys.generation(slot),
            self.keys.limit_pause(take.counter.limit),
        ];
        let admission = self.admission(take, slot, &mut keys);
        (keys, admission)
    }

    pub(crate) async fn resume_remote(&self, take: Take<'_>) -> Result<bool> {
        self.resume_at(take).await.1
    }

    /// Resume, and the store's clock at the decision (0 when Redis did not answer).
    pub(crate) async fn resume_at(&self, take: Take<'_>) -> (u64, Result<bool>) {
        let keyed = take.counter.key.is_some();
        let (keys, admission) = self.pause_call(take);
        let own = [f64::from(u8::from(keyed))];
        let answer = self
            .run_counter(take, RESUME, &keys, admission, &own, &[])
            .await;
        let (head, reply) = match answer {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => Ok(reply.numbers.get(3).copied().unwrap_or(0) >= 1),
            other => Err(unavailable(format!("unexpected script status {other}"))),
        };
        (head.now_us, result)
    }

    /// Forget a counter (`Adjust::Reset`): its three keys go, in one command (they share a
    /// slot). Made again, it is a new counter: its numbers start at Redis's clock, past any it
    /// handed out (`Counter::new`), and it starts under the namespace's hold, if one is on.
    pub(crate) async fn reset_remote(&self, take: Take<'_>) -> Result<bool> {
        let slot = self.keys.counter_slot(take.counter);
        let mut command = redis::cmd("DEL");
        for key in self.keys.counter_keys(slot, take.counter) {
            command.arg(key);
        }
        let value = self.query(&command).await?;
        Ok(matches!(value, Value::Int(deleted) if deleted > 0))
    }

    pub(crate) async fn usage_remote(&self, take: Take<'_>) -> Result<Usage> {
        self.usage_at(take).await.1
    }

    /// Usage, and the store's clock at the decision (0 when Redis did not answer).
    pub(crate) async fn usage_at(&self, take: Take<'_>) -> (u64, Result<Usage>) {
        let (mut keys, admission) = self.counter_call(take);
        let pause = if !self.is_cluster()
            || self.keys.pause_slot(take.counter.limit) == self.keys.counter_slot(take.counter)
        {
            keys.push(self.keys.limit_pause(take.counter.limit));
            PauseRef::Key(keys.len())
        } else {
            match self.read_pause(take.counter.limit).await {
                Ok(until) => PauseRef::Read(until),
                Err(error) => return (0, Err(error)),
            }
        };
        let answer = self
            .run_counter(take, USAGE, &keys, admission, &[pause.arg()], &[])
            .await;
        let (head, reply) = match answer {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => {
                let number = |index: usize| u(reply.numbers.get(index).copied().unwrap_or(0));
                Ok(Usage {
                    used: number(3),
                    reset_after_us: number(4),
                    paused_for_us: number(5).saturating_sub(head.now_us),
                    held_for_us: number(6).saturating_sub(head.now_us),
                })
            }
            other => Err(failed(format!("unexpected script status {other}"))),
        };
        (head.now_us, result)
    }

    /// Count `units` spent beyond any grant on `take`'s counter (`Adjust::Charge`, the core's
    /// `Counter::debit`): the units counted. A lease counts nothing, and asks nothing of Redis.
    pub(crate) async fn charge_remote(&self, take: Take<'_>, units: u64) -> Result<u64> {
        if take.policy.is_concurrency() {
            return Ok(0);
        }
        self.charge_at(take, units).await.1
    }

    /// Charge, and the store's clock at the decision (0 when Redis did not answer).
    pub(crate) async fn charge_at(&self, take: Take<'_>, units: u64) -> (u64, Result<u64>) {
        let (keys, admission) = self.counter_call(take);
        let answer = self
            .run_counter(take, CHARGE, &keys, admission, &[units as f64], &[])
            .await;
        let (head, reply) = match answer {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => Ok(u(reply.numbers.get(3).copied().unwrap_or(0))),
            other => Err(failed(format!("unexpected script status {other}"))),
        };
        (head.now_us, result)
    }

    /// A waiting request gives up its place in each counter's queue: one call per counter (a
    /// rare path; a counter's queue is in its slot), all at once. A call that fails leaves the
    /// place to expire (`PLACE_TTL_US`).
    pub(crate) async fn leave_remote(
        &self,
        counters: &[CounterId<'_>],
        waiter: WaiterId,
    ) -> Result<()> {
        let calls = counters.iter().map(|&counter| async move {
            let slot = self.keys.counter_slot(counter);
            let keys = [
                self.keys.generation(slot),
                self.keys.counter_queue(slot, counter),
            ];
            let mut numbers = Numbers::new(LEAVE);
            numbers.extend(&[waiter.get()]);
            let message = self.keys.counter(counter);
            self.run(&keys, &[&numbers.0, message.as_bytes()]).await
        });
        for answer in futures_util::future::join_all(calls).await {
            answer?;
        }
        Ok(())
    }
}
