//! Sending the script, and natural batching of acquires; a call the Redis module decides
//! natively (`native.rs`) goes to it alone instead, and to the script when the module
//! refuses. `Caller` owns what a call needs (the
//! connection, the library or script, whether calls watch evictions) and, per slot, the calls
//! in flight and the acquires waiting for the next.
//!
//! An acquire that finds fewer than `CALLS_PER_SLOT` calls in flight to its slot goes at once,
//! alone, as it would without batching, so at one decision in flight nothing waits longer.
//! Acquires that arrive while those calls are in flight wait, and go together in the next call
//! (`OP_BATCH`, at most `BATCH_MAX`) as soon as one of them ends: the script decides them in
//! order, each all or nothing, at one `now`, exactly as the same acquires one after another at
//! that instant (`differential_tests.rs` compares a batch with the decision core one by one).
//! One call, one clock read and one generation read then serve many decisions: Redis spends
//! less per decision the busier it is.
//!
//! A batch runs in a task of its own, so a caller that gives up (its client gone, its own
//! deadline) never strands the others; an acquire whose caller gave up before its batch left is
//! not decided at all.
//!
//! A batch exists only because callers keep a slot busy, and callers can make it slow (many
//! acquires, each on many counters): its timeout, and an acquire's wait for its batch beyond
//! two calls' time, say Redis is slow, not that it cannot be reached, and Redis may yet decide a
//! batch it was sent. Both are `StoreFailed`, never failed open; a batch whose connection
//! fails (refused, dropped) is `StoreUnavailable`, as a lone call's timeout is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::{RedisError, Script, Value};
use tokio::sync::oneshot;
use tollgate::{Error, Result};

use crate::abi::{self, OP_BATCH, OP_WATCH_EVICTIONS};
use crate::backend::Backend;
use crate::call::{Head, Numbers, Reply, parse_reply, u};
use crate::errors::{failed, lost_library, store_error, unavailable};
use crate::keys;
use crate::native::{self, Module, Native};

/// Acquires in one call at most. Each has at most `COUNTERS_PER_REQUEST_MAX` counters, so a
/// batch names at most a few thousand keys and numbers.
pub(crate) const BATCH_MAX: usize = 64;

/// Acquire calls in flight on one slot before the next acquires wait: with two, Redis has the
/// next call in hand while it runs one, and never idles for a round trip between batches.
pub(crate) const CALLS_PER_SLOT: usize = 2;

/// What sends the script, and the acquires waiting per slot.
pub(crate) struct Caller {
    pub(crate) backend: Arc<Backend>,
    script: Script,
    /// The function library: its `FCALL` name and source, when Redis accepted it.
    pub(crate) function: Option<(String, String)>,
    /// Every call watches Redis's evictions: a master's policy may evict (seen at connect or
    /// by `ping`). Never cleared: the keys evicted meanwhile are held whatever comes next.
    pub(crate) watch_evictions: AtomicBool,
    /// The generation's birth in the last reply (for tests mirroring the script).
    pub(crate) born_seen: AtomicU64,
    timeout: Duration,
    namespace: String,
    /// The slots with an acquire call in flight.
    slots: Mutex<HashMap<u16, Slot>>,
    /// Acquires decided in a call with others, since the start.
    batched: AtomicU64,
    /// Acquires wait for a slot's call in flight (on unless turned off).
    batching: AtomicBool,
    /// The module setting, and whether the module decides what it can (`native.rs`): chosen
    /// at connect, chosen again when Redis came back (it lost the library, or the module).
    module: Module,
    using_module: AtomicBool,
    /// The protocol version the module must speak (`PROTOCOL_VERSION`; another in tests).
    expected_version: u64,
    /// The calls the module decided (by `Native`, in `Native::ALL`'s order), and the calls it
    /// refused that the library then decided.
    module_decided: [AtomicU64; Native::ALL.len()],
    module_fallbacks: AtomicU64,
    /// Those refusals by the module's reason.
    module_refusals: Mutex<HashMap<String, u64>>,
}

/// A slot's calls in flight (at most `CALLS_PER_SLOT`), and the acquires waiting for the
/// next.
#[derive(Default)]
struct Slot {
    calls: usize,
    waiting: Vec<Pending>,
}

/// An acquire waiting for its slot's next call: its keys (the generation first) and numbers
/// as a call of its own would send them.
struct Pending {
    keys: Vec<String>,
    numbers: Vec<u8>,
    answer: oneshot::Sender<Result<(Head, Reply)>>,
}

/// Hands what waits on a slot to a batch when the call in flight ends, or is dropped.
struct Release<'a> {
    caller: &'a Arc<Caller>,
    slot: u16,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.caller.release(self.slot);
    }
}

impl Caller {
    pub(crate) fn new(
        backend: Arc<Backend>,
        script: Script,
        function: Option<(String, String)>,
        watch_evictions: bool,
        timeout: Duration,
        namespace: String,
        module: (Module, bool, u64),
    ) -> Caller {
        let (module, using_module, expected_version) = module;
        Caller {
            backend,
            script,
            function,
            watch_evictions: AtomicBool::new(watch_evictions),
            born_seen: AtomicU64::new(0),
            timeout,
            namespace,
            slots: Mutex::new(HashMap::new()),
            batched: AtomicU64::new(0),
            batching: AtomicBool::new(true),
            module,
            using_module: AtomicBool::new(using_module),
            expected_version,
            module_decided: std::array::from_fn(|_| AtomicU64::new(0)),
            module_fallbacks: AtomicU64::new(0),
            module_refusals: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the module decides the operations it can.
    pub(crate) fn using_module(&self) -> bool {
        self.using_module.load(Ordering::Relaxed)
    }

    /// The calls of `native`'s kind the module decided, and the calls of either kind it
    /// refused (decided by the library after).
    pub(crate) fn module_counts(&self, native: Native) -> (u64, u64) {
        (
            self.module_decided[native as usize].load(Ordering::Relaxed),
            self.module_fallbacks.load(Ordering::Relaxed),
        )
    }

    /// The module's refusals so far, by its reason.
    pub(crate) fn module_refusals(&self) -> Vec<(String, u64)> {
        let refusals = self
            .module_refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut refusals: Vec<(String, u64)> =
            refusals.iter().map(|(k, v)| (k.clone(), *v)).collect();
        refusals.sort();
        refusals
    }

    /// Redis came back (it lost the library, or the module): ask the module's version again.
    /// A Redis that now has no module, or another version, is decided by the library (it cannot
    /// refuse to start any more), and said loudly.
    async fn choose_module_again(&self) {
        if self.module == Module::Off {
            return;
        }
        let chosen = match native::probe(&self.backend, self.expected_version).await {
            Ok(loaded) => native::choose(self.module, &loaded, self.expected_version),
            Err(error) => Err(format!("TOLLGATE.VERSION failed: {error}")),
        };
        let using = match chosen {
            Ok(using) => using,
            Err(reason) => {
                tracing::error!(%reason, "Redis came back unfit for the module; deciding with the function library");
                false
            }
        };
        if self.using_module.swap(using, Ordering::Relaxed) != using {
            tracing::warn!(
                module = using,
                "Redis came back: operations now go to the {}",
                if using {
                    "Redis module"
                } else {
                    "function library"
                }
            );
        }
    }

    /// Whether the module decides the acquire packed in `numbers`.
    fn native(&self, numbers: &[u8]) -> bool {
        self.using_module.load(Ordering::Relaxed) && native::native(numbers)
    }

    /// The module refused `error`'s call: counted by its reason.
    fn refused_by_module(&self, error: &redis::RedisError) {
        self.module_fallbacks.fetch_add(1, Ordering::Relaxed);
        *self
            .module_refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(native::reason(error))
            .or_default() += 1;
        tracing::debug!(%error, "the module refused a call; the library decides it");
    }

    /// The module's answer to one call it decides natively, to its slot's master on a
    /// cluster, counted; None when it refused the call (counted) or Redis lost the module.
    async fn module_answer(
        &self,
        native: Native,
        keys: &[String],
        args: &[&[u8]],
    ) -> Result<Option<Value>> {
        let command = self.command_by(Some(native), keys, args);
        let first = keys.first().map_or("", String::as_str);
        let answered = tokio::time::timeout(self.timeout, self.backend.query_key(&command, first))
            .await
            .map_err(|_| unavailable("Redis did not answer in time"))?;
        match answered {
            Ok(value) => {
                self.module_decided[native as usize].fetch_add(1, Ordering::Relaxed);
                Ok(Some(value))
            }
            Err(error) if native::refused(&error) => {
                self.refused_by_module(&error);
                Ok(None)
            }
            Err(error) if native::unknown_command(&error) => {
                self.choose_module_again().await;
                Ok(None)
            }
            Err(error) => Err(store_error(error)),
        }
    }

    /// One call of the library's, `args` as the library takes them: to the module when it
    /// decides it natively (`native::route`), else (or when it refuses) to the library. Its
    /// answer as Redis gave it (a namespace's begin answers 1 or 0, without a head).
    pub(crate) async fn call_value(&self, keys: &[String], args: &[&[u8]]) -> Result<Value> {
        if self.using_module.load(Ordering::Relaxed)
            && let Some(native) = args.first().and_then(|numbers| native::route(numbers))
            && let Some(value) = self.module_answer(native, keys, args).await?
        {
            return Ok(value);
        }
        self.query(keys, args).await
    }

    /// `call_value`, for a call whose reply has a head (every operation but a begin).
    pub(crate) async fn call(&self, keys: &[String], args: &[&[u8]]) -> Result<(Head, Reply)> {
        self.headed(self.call_value(keys, args).await?)
    }

    /// Whether acquires wait for a call in flight on their slot and go together (on), or each
    /// is its own call at once (off).
    pub(crate) fn set_batching(&self, on: bool) {
        self.batching.store(on, Ordering::Relaxed);
    }

    /// Acquires decided in a call with others, since the start.
    pub(crate) fn batched(&self) -> u64 {
        self.batched.load(Ordering::Relaxed)
    }

    /// One acquire on `slot` (`keys` and `numbers` as its own call): alone when fewer than
    /// `CALLS_PER_SLOT` calls are in flight on the slot, else in the next batch.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        slot: u16,
        keys: Vec<String>,
        numbers: Vec<u8>,
    ) -> Result<(Head, Reply)> {
        if !self.batching.load(Ordering::Relaxed) {
            return self.call(&keys, &[&numbers]).await;
        }
        let waiting = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let state = slots.entry(slot).or_default();
            if state.calls < CALLS_PER_SLOT {
                state.calls += 1;
                Err((keys, numbers))
            } else {
                let (answer, answered) = oneshot::channel();
                state.waiting.push(Pending {
                    keys,
                    numbers,
                    answer,
                });
                Ok(answered)
            }
        };
        match waiting {
            Err((keys, numbers)) => {
                let _release = Release { caller: self, slot };
                self.call(&keys, &[&numbers]).await
            }
            Ok(answered) => match tokio::time::timeout(2 * self.timeout, answered).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(unavailable("the call this acquire waited for was dropped")),
                Err(_) => Err(failed(format!(
                    "this acquire waited {:?} for its batch behind the calls in flight on its \
                     slot: Redis is busy, not unreachable, so it is not failed open",
                    2 * self.timeout
                ))),
            },
        }
    }

    /// A call on `slot` ended: what waits goes in a batch, in a task of its own, as the next
    /// call; with nothing waiting, the slot has one call fewer in flight.
    fn release(self: &Arc<Self>, slot: u16) {
        let batch = self.next_batch(slot);
        if batch.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(Arc::clone(self).drain(slot, batch));
            }
            // No runtime to run them on (it is shutting down): they are answered that the call
            // was dropped, and the slot forgets them.
            Err(_) => {
                let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
                slots.remove(&slot);
            }
        }
    }

    /// A call on `slot` ended: the acquires the next call takes in its place (the oldest
    /// first), leaving out those whose caller gave up; none, and one call fewer in flight, when
    /// nothing waits.
    fn next_batch(&self, slot: u16) -> Vec<Pending> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(state) = slots.get_mut(&slot) else {
            return Vec::new();
        };
        state.waiting.retain(|pending| !pending.answer.is_closed());
        if state.waiting.is_empty() {
            state.calls = state.calls.saturating_sub(1);
            if state.calls == 0 {
                slots.remove(&slot);
            }
            return Vec::new();
        }
        let take = state.waiting.len().min(BATCH_MAX);
        state.waiting.drain(..take).collect()
    }

    /// Decide batches on `slot` until nothing waits.
    async fn drain(self: Arc<Self>, slot: u16, mut batch: Vec<Pending>) {
        while !batch.is_empty() {
            self.decide(slot, batch).await;
            batch = self.next_batch(slot);
        }
    }

    /// One call for `batch`, and each acquire its answer: by the module when it decides
    /// every acquire of the batch, else by the library.
    async fn decide(&self, slot: u16, batch: Vec<Pending>) {
        let count = batch.len();
        if count == 1 {
            if let Some(only) = batch.into_iter().next() {
                let answer = self.call(&only.keys, &[&only.numbers]).await;
                let _ = only.answer.send(answer);
            }
            return;
        }
        let native = batch.iter().all(|pending| self.native(&pending.numbers));
        let mut keys = Vec::with_capacity(1 + batch.iter().map(|p| p.keys.len()).sum::<usize>());
        let mut numbers = Numbers::new(OP_BATCH);
        numbers.push(count as u64);
        for pending in &batch {
            let Some((generation, own)) = pending.keys.split_first() else {
                continue;
            };
            if keys.is_empty() {
                keys.push(generation.clone());
            }
            // Its own KEYS[x] (x >= 2) is the batch's KEYS[x + shift].
            numbers.extend(&[
                (keys.len() - 1) as u64,
                (pending.numbers.len() / 8 - 1) as u64,
            ]);
            numbers
                .0
                .extend_from_slice(pending.numbers.get(8..).unwrap_or_default());
            keys.extend_from_slice(own);
        }
        let answered = if native {
            let command = self.command_by(Some(Native::Acquire), &keys, &[&numbers.0]);
            tokio::time::timeout(self.timeout, self.backend.query_slot(&command, slot)).await
        } else {
            let command = self.command(&keys, &[&numbers.0]);
            tokio::time::timeout(
                self.timeout,
                self.with_library(|| self.backend.query(&command)),
            )
            .await
        };
        let mut by_module = native;
        let answered = match answered {
            // The module refused the whole batch, or Redis no longer knows it: the library
            // decides the batch, one round trip more.
            Ok(Err(error))
                if native && (native::refused(&error) || native::unknown_command(&error)) =>
            {
                by_module = false;
                if native::refused(&error) {
                    self.refused_by_module(&error);
                } else {
                    self.choose_module_again().await;
                }
                let command = self.command(&keys, &[&numbers.0]);
                tokio::time::timeout(
                    self.timeout,
                    self.with_library(|| self.backend.query(&command)),
                )
                .await
            }
            answered => answered,
        };
        let value = match answered {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) if !error.is_timeout() => Err(store_error(error)),
            // Sent, and not answered in time: Redis may still decide it.
            Ok(Err(_)) | Err(_) => Err(failed(format!(
                "Redis did not answer a batch of {count} acquires within {:?}; it may yet \
                 decide them, and callers can slow it, so they are not failed open",
                self.timeout
            ))),
        };
        let answers = value.and_then(|value| {
            let Value::Array(items) = value else {
                return Err(failed(format!("unexpected batch reply {value:?}")));
            };
            if items.len() != count {
                return Err(failed("batch reply of the wrong length"));
            }
            items
                .into_iter()
                .map(|item| match item {
                    // The module refused this acquire for what its counter holds (leases, or a
                    // value of a kind not known), having decided the others: the library
                    // decides it, after them.
                    Value::ServerError(error) => {
                        let error = redis::RedisError::from(error);
                        if native::refused(&error) {
                            self.refused_by_module(&error);
                            Ok(None)
                        } else {
                            Err(store_error(error))
                        }
                    }
                    item => head(parse_reply(item)?).map(Some),
                })
                .collect::<Result<Vec<_>>>()
        });
        match answers {
            Ok(answers) => {
                self.batched.fetch_add(count as u64, Ordering::Relaxed);
                if by_module {
                    let decided = answers.iter().flatten().count();
                    self.module_decided[Native::Acquire as usize]
                        .fetch_add(decided as u64, Ordering::Relaxed);
                }
                if let Some((head, _)) = answers.iter().flatten().next() {
                    self.saw(*head);
                }
                for (pending, answer) in batch.into_iter().zip(answers) {
                    let answer = match answer {
                        Some(answer) => Ok(answer),
                        None => self.run(&pending.keys, &[&pending.numbers]).await,
                    };
                    let _ = pending.answer.send(answer);
                }
            }
            Err(error) => {
                for pending in batch {
                    let _ = pending.answer.send(Err(again(&error)));
                }
            }
        }
    }

    /// The command that runs the script on `keys` (after the generation, which is first). When
    /// the store watches evictions, the operation carries `WATCH_EVICTIONS` and the slot's
    /// evictions record is the last key.
    pub(crate) fn command(&self, keys: &[String], args: &[&[u8]]) -> redis::Cmd {
        self.command_by(None, keys, args)
    }

    /// The library's call of `keys` and `args` (`command`'s), sent to the module's command
    /// for `module`, or the library's function (or script) when None: the module takes the
    /// library's arguments unchanged, the evictions flag and record included.
    fn command_by(&self, module: Option<Native>, keys: &[String], args: &[&[u8]]) -> redis::Cmd {
        if self.watch_evictions.load(Ordering::Relaxed)
            && let Some((numbers, rest)) = args.split_first()
            && let Some(generation) = keys.first()
        {
            let mut flagged = numbers.to_vec();
            if let Some(operation) = flagged.get_mut(..8) {
                let code = f64::from_be_bytes(operation.try_into().unwrap_or([0; 8]));
                operation.copy_from_slice(&(code + OP_WATCH_EVICTIONS as f64).to_be_bytes());
            }
            let mut keys = keys.to_vec();
            keys.push(keys::evictions_beside(generation));
            let mut args: Vec<&[u8]> = vec![&flagged];
            args.extend_from_slice(rest);
            return self.unflagged_command(module, &keys, &args);
        }
        self.unflagged_command(module, keys, args)
    }

    fn unflagged_command(
        &self,
        module: Option<Native>,
        keys: &[String],
        args: &[&[u8]],
    ) -> redis::Cmd {
        let mut command = match (module, &self.function) {
            (Some(native), _) => redis::cmd(native.command()),
            (None, Some((name, _))) => {
                let mut command = redis::cmd("FCALL");
                command.arg(name.as_str());
                command
            }
            (None, None) => {
                let mut command = redis::cmd("EVALSHA");
                command.arg(self.script.get_hash());
                command
            }
        };
        command.arg(keys.len()).arg(keys).arg(args);
        command
    }

    /// Run `send`, and once more after loading the script again if Redis lost it.
    pub(crate) async fn with_library<'s, T, F>(
        &'s self,
        send: impl Fn() -> F,
    ) -> redis::RedisResult<T>
    where
        F: Future<Output = redis::RedisResult<T>> + 's,
    {
        match send().await {
            Err(error) if lost_library(&error) => {
                self.choose_module_again().await;
                match &self.function {
                    Some((_, library)) => load_library(&self.backend, library).await?,
                    None => {
                        self.backend
                            .query(redis::cmd("SCRIPT").arg("LOAD").arg(abi::script()))
                            .await?;
                    }
                }
                send().await
            }
            answer => answer,
        }
    }

    /// The script's answer on `keys`, within the store's timeout.
    async fn query(&self, keys: &[String], args: &[&[u8]]) -> Result<Value> {
        let command = self.command(keys, args);
        tokio::time::timeout(
            self.timeout,
            self.with_library(|| self.backend.query(&command)),
        )
        .await
        .map_err(|_| unavailable("Redis did not answer in time"))?
        .map_err(store_error)
    }

    /// Run the script on one slot: one round trip. `keys` start with the slot's generation.
    pub(crate) async fn run(&self, keys: &[String], args: &[&[u8]]) -> Result<(Head, Reply)> {
        self.headed(self.query(keys, args).await?)
    }

    /// A reply's head read, and its generation kept (`saw`).
    fn headed(&self, value: Value) -> Result<(Head, Reply)> {
        let answer = head(parse_reply(value)?)?;
        self.saw(answer.0);
        Ok(answer)
    }

    /// Keep the generation a reply names, and say when the state was lost.
    fn saw(&self, head: Head) {
        self.born_seen.store(head.born_us, Ordering::Release);
        if head.lost {
            tracing::warn!(
                namespace = %self.namespace,
                "Redis lost Tollgate's state, or may have (a restart, a flush, a failover); \
                 granting nothing on a counter kept there until one period after {} (Redis's \
                 clock)",
                tollgate::utc_text(head.born_us)
            );
        }
    }
}

/// A reply with its head read.
fn head(reply: Reply) -> Result<(Head, Reply)> {
    if reply.numbers.len() < 3 {
        return Err(failed("script reply without its head"));
    }
    let head = Head {
        now_us: u(reply.numbers[0]),
        born_us: u(reply.numbers[1]),
        lost: reply.numbers[2] != 0,
    };
    Ok((head, reply))
}

/// A batch's failure, once for each of its acquires.
fn again(error: &Error) -> Error {
    match error {
        Error::StoreUnavailable { reason } => unavailable(reason),
        Error::StoreFailed { reason } => failed(reason),
        other => failed(other),
    }
}

/// `FUNCTION LOAD REPLACE`: the same source under the same name, so any number of processes may
/// load it at once (on a cluster, on every master).
pub(crate) async fn load_library(
    backend: &Backend,
    library: &str,
) -> std::result::Result<(), RedisError> {
    backend
        .query(
            redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(library),
        )
        .await
        .map(|_| ())
}
