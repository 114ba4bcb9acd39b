//! The Redis store: counters shared by any number of processes and machines.
//!
//! Every operation (acquire over several counters, commit, renew, pause) is one call of
//! `tollgate.lua` per Redis Cluster slot it touches, which decides atomically with the same
//! arithmetic as the decision core, on Redis's clock (`TIME`), never a worker's (G5). On Redis 7
//! and later the script is loaded as a function library named after its hash and each call is
//! one `FCALL` (its helpers are then made once, not on every call); where `FUNCTION LOAD` is
//! refused (older Redis, ACLs) it is one `EVALSHA`. A Redis that lost the library (restart
//! without persistence, a node new to a cluster) gets it again on the first call that misses it.
//!
//! Where: one Redis (`redis://`), a Redis Cluster (`redis-cluster://`), or the master a set of
//! Sentinels names (`redis-sentinel://`), see `backend.rs`. Keys (`keys.rs`): each counter's
//! hash tag comes from its namespace, limit and key, so counters spread over a cluster's slots;
//! a request whose counters sit in several slots is decided slot by slot (`plan`): reserved
//! in ascending slot order and rolled back on a denial, so it stays all or nothing and never
//! overdraws. Every key is written with its expiry in the same script, so no key lives without
//! a TTL and Redis's memory follows live state (G7).
//!
//! Lost state (G6): a generation hash per slot (per namespace on one Redis) names its birth and
//! the Redis process that owns it. Every call reads it; a missing hash or another owner
//! (restart, flush, failover to a replica that may have missed writes) starts a new generation,
//! and every counter not written since waits out whatever it may have counted. A slot moved by
//! resharding keeps its generation. Unreachable Redis: `store_unavailable`, unless `fail_open`
//! is set. A Redis that answered with a failure (out of memory, a script error, `READONLY`) is
//! `StoreFailed` and never failed open: a caller who can fill Redis must not gain by it
//! (`store_error` tells the two apart).
//!
//! Keys (G7, G10): each limit counted per key has a budget of keys (`keys_per_limit_max`, or the
//! limit's `keys_max`), kept by a tally in the limit's own slot (`tally.rs`). A counter of a key
//! carries its cover, until when the tally counts it, and the script never writes it to live
//! longer: a new key, or one whose cover runs out, is admitted first, by the script itself when
//! the tally is in the call's slot (always on one Redis), else by one call in the tally's slot
//! and the counter's call again. A full budget refuses that limit's new keys
//! (`TooManyKeysForLimit`), nothing else; a limit's one counter (not counted per key) is never
//! refused.
//!
//! Waiting across processes: the script publishes a counter's key on the namespace's wake
//! channel whenever capacity comes back (a refund, a release); a subscriber task turns that into
//! the limiter's wake-up, so a waiter in one process wakes when another releases.

mod abi;
mod backend;
mod eviction;
mod keys;
mod leasing;
pub mod tally;

#[cfg(test)]
mod differential_tests;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::{RedisError, Script, Value};
use tollgate::store::{
    CounterId, CounterOutcome, Decision, Renewed, Store, StoreFuture, Take, Usage, WakeFn,
};
use tollgate::{Error, Result};
use tollgate_core::{Algorithm, Committed, Denial, Grant, Kind, PermitError, Policy, Priority};

use backend::{Backend, Target};

pub use keys::check_namespace;
pub use leasing::{LeasingConfig, LeasingStats, LeasingStore};
/// The cross-slot plan and the loss check this store runs, as plain functions.
pub use tollgate_redis_protocol::{loss, plan};

/// How a Redis store connects and behaves.
#[derive(Clone, Debug)]
pub struct RedisStoreConfig {
    /// `redis://host:port/db` (one Redis), `redis-cluster://host:port[,host:port...]` (a Redis
    /// Cluster, by seed nodes), or `redis-sentinel://host:port[,host:port...]/master[/db]` (the
    /// master the Sentinels name, followed through failovers).
    pub url: String,
    /// The namespace every key carries: stores on different namespaces share nothing.
    /// `[a-z0-9_-]`, at most 64 bytes.
    pub namespace: String,
    /// Grant when Redis cannot be reached. Off (fail-closed) unless the operator decides that
    /// overdrawing a quota is better than stopping; then every grant made while Redis is down is
    /// a grant no limit counted. Never when Redis answers with a failure (out of memory, a
    /// script error): that is `StoreFailed`, refused whatever this says.
    pub fail_open: bool,
    /// Start on a Redis whose `maxmemory-policy` may evict Tollgate's keys (any but
    /// `noeviction`). Off, such a Redis is refused at connect and `ping` reports one that
    /// changes to it. Either way, once the store sees such a policy every call watches Redis's
    /// evictions (`INFO stats`, a few microseconds a call), and a counter found missing after
    /// one is held for a period: an evicted counter is never read as a fresh one.
    pub allow_eviction: bool,
    /// How long one operation may take, retries and redirections included, before it counts as
    /// unreachable.
    pub timeout: Duration,
    /// Keys one limit counted per key may have counters of at once, unless the limit says
    /// otherwise (`Limit::keys_max`); past it, that limit's new keys get `TooManyKeysForLimit`
    /// and no other limit is affected (`tally.rs`). Bounds what one limit can make Redis hold.
    pub keys_per_limit_max: u64,
}

/// Counters in Redis, shared by every process on the same namespace.
pub struct RedisStore {
    backend: Arc<Backend>,
    target: Target,
    script: Script,
    /// The function library: its `FCALL` name and source, when Redis accepted it.
    function: Option<(String, String)>,
    keys: keys::Keys,
    config: RedisStoreConfig,
    /// The generation's birth in the last reply (for tests mirroring the script).
    born_seen: AtomicU64,
    /// Every call watches Redis's evictions: a master's policy may evict (seen at connect or
    /// by `ping`). Never cleared: the keys evicted meanwhile are held whatever comes next.
    watch_evictions: AtomicBool,
    wake: Arc<Mutex<Option<WakeFn>>>,
    subscriber: Option<tokio::task::JoinHandle<()>>,
    /// The limits in force as last told (`Store::set_limits`): whether each counts leases, and
    /// its own budget of keys.
    limits: Mutex<std::collections::HashMap<String, (bool, Option<u64>)>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("namespace", &self.config.namespace)
            .field("cluster", &self.target.is_cluster())
            .field("fail_open", &self.config.fail_open)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if let Some(subscriber) = self.subscriber.take() {
            subscriber.abort();
        }
    }
}

/// Redis cannot be reached (no connection, no answer in time).
fn unavailable(error: impl fmt::Display) -> Error {
    Error::StoreUnavailable {
        reason: error.to_string(),
    }
}

/// Redis answered, with a failure (a reply the store cannot read, a status it does not know).
fn failed(error: impl fmt::Display) -> Error {
    Error::StoreFailed {
        reason: error.to_string(),
    }
}

/// What a Redis error means: unreachable (no connection, the connection dropped, no answer in
/// time, no master for the slot or the name, a node still loading its data or moving a slot),
/// or an answer that is a failure (`OOM`, a script error, `READONLY`, `NOPERM`, a reply that
/// does not parse). Only the first may fail open, so anything not known to be unreachable is
/// a failure.
fn store_error(error: RedisError) -> Error {
    use redis::{ErrorKind, ServerErrorKind};
    let unreachable = error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::NoValidReplicasFoundBySentinel
                | ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                )
        );
    if unreachable {
        unavailable(error)
    } else if error.code() == Some("OOM") {
        failed(format!(
            "Redis is out of memory (its maxmemory is reached), so it decides nothing: {error}"
        ))
    } else {
        failed(error)
    }
}

use abi::{
    ALG_FIXED, ALG_GCRA, ALG_SLIDING, KIND_CONCURRENCY, KIND_RATE, OP_ACQUIRE as ACQUIRE,
    OP_ADMIT as ADMIT, OP_BEGIN, OP_COMMIT as COMMIT, OP_PAUSE as PAUSE, OP_RENEW as RENEW,
    OP_RESUME as RESUME, OP_USAGE as USAGE, OP_WATCH_EVICTIONS as WATCH_EVICTIONS, OUTCOME_ALLOWED,
    OUTCOME_GRANTED,
};
/// Calls of one operation on one slot, each after an admission the previous asked for, before
/// it fails: a cover is given two spans ahead, so the second call finds it enough unless the
/// two nodes' clocks are a span apart.
const ADMISSION_ATTEMPTS_MAX: usize = 3;

/// The nine numbers the script reads for a policy.
fn policy_args(policy: &Policy) -> [u64; 9] {
    let reserve = policy.reserve();
    match policy.kind() {
        Kind::Rate(rate) => {
            let (algorithm, burst) = match rate.algorithm() {
                Algorithm::Sliding => (ALG_SLIDING, 0),
                Algorithm::Fixed => (ALG_FIXED, 0),
                Algorithm::Gcra { burst } => (ALG_GCRA, burst),
            };
            [
                KIND_RATE,
                rate.limit(),
                rate.period_us(),
                rate.margin_us(),
                algorithm,
                burst,
                0,
                reserve.high,
                reserve.normal,
            ]
        }
        Kind::Concurrency(concurrency) => [
            KIND_CONCURRENCY,
            concurrency.limit(),
            0,
            0,
            0,
            0,
            concurrency.lease_ttl_us(),
            reserve.high,
            reserve.normal,
        ],
    }
}

fn priority_arg(priority: Priority) -> u64 {
    abi::priority_code(priority)
}

/// The script's reply, read as a list of integers after its leading status word.
struct Reply {
    status: String,
    numbers: Vec<i64>,
}

fn parse_reply(value: Value) -> Result<Reply> {
    let Value::Array(items) = value else {
        return Err(failed(format!("unexpected script reply {value:?}")));
    };
    let mut items = items.into_iter();
    let status = match items.next() {
        Some(Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Some(Value::SimpleString(text)) => text,
        other => {
            return Err(failed(format!("unexpected script status {other:?}")));
        }
    };
    let numbers = items
        .map(|item| match item {
            Value::Int(number) => Ok(number),
            other => Err(failed(format!("unexpected script value {other:?}"))),
        })
        .collect::<Result<Vec<i64>>>()?;
    Ok(Reply { status, numbers })
}

fn u(number: i64) -> u64 {
    u64::try_from(number).unwrap_or(0)
}

/// The head every successful reply starts with.
#[derive(Clone, Copy, Debug)]
struct Head {
    now_us: u64,
    born_us: u64,
    lost: bool,
}

/// Where a counter's limit-wide pause is, for the script: at `KEYS[index]` (its key is in the
/// call's slot), or already read (its end, 0 for none), from another slot.
#[derive(Clone, Copy, Debug)]
enum PauseRef {
    Key(usize),
    Read(u64),
}

impl PauseRef {
    fn arg(self) -> f64 {
        match self {
            PauseRef::Key(index) => index as f64,
            PauseRef::Read(until) => -(until as f64),
        }
    }
}

/// Where a counter's limit keeps its budget of keys, for the script (`T.read_admission`).
#[derive(Clone, Copy, Debug)]
enum TallyRef {
    /// A counter without a key: never admitted.
    Unkeyed,
    /// At `KEYS[index]`, in the call's slot: the script admits the key itself.
    Key(usize),
    /// In another slot: the script answers `admit`, and the caller asks there (`admit_key`).
    Elsewhere,
}

/// What a caller brings to the script from a budget in another slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carried {
    Nothing,
    /// The key is counted until then.
    Cover(u64),
    /// The budget admits no new key until then (held after a loss).
    Held(u64),
}

/// A counter's admission, as the script reads it after its policy.
#[derive(Clone, Copy, Debug)]
struct Admission {
    tally: TallyRef,
    budget: u64,
    carried: Carried,
}

fn too_many_keys(limit: &str, keys_max: u64) -> Error {
    Error::TooManyKeysForLimit {
        limit: limit.to_owned(),
        keys_max,
    }
}

/// The numbers of a call, packed as one argument of big-endian doubles: one Lua string to make
/// instead of one per number. Every number the script reads is an integer below 2^53, exact as
/// a double (a pause read elsewhere travels negated).
#[derive(Default)]
struct Numbers(Vec<u8>);

impl Numbers {
    fn new(operation: u64) -> Numbers {
        let mut numbers = Numbers(Vec::with_capacity(128));
        numbers.push(operation);
        numbers
    }

    fn push(&mut self, number: u64) -> &mut Numbers {
        self.push_f64(number as f64)
    }

    fn push_f64(&mut self, number: f64) -> &mut Numbers {
        self.0.extend_from_slice(&number.to_be_bytes());
        self
    }

    fn extend(&mut self, numbers: &[u64]) -> &mut Numbers {
        for &number in numbers {
            self.push(number);
        }
        self
    }

    /// A counter's admission: its four numbers (`apart`: on a cluster).
    fn admission(&mut self, admission: &Admission, apart: bool) -> &mut Numbers {
        let tally = match admission.tally {
            TallyRef::Unkeyed => 0.0,
            TallyRef::Key(index) => index as f64,
            TallyRef::Elsewhere => -1.0,
        };
        let carried = match admission.carried {
            Carried::Nothing => 0.0,
            Carried::Cover(end) => end as f64,
            Carried::Held(until) => -(until as f64),
        };
        self.push_f64(tally)
            .push(admission.budget)
            .push_f64(carried)
            .push(u64::from(apart))
    }
}

/// What one slot's call answered for its counters.
struct SlotAnswer {
    now_us: u64,
    outcomes: Vec<CounterOutcome>,
}

impl RedisStore {
    /// Connect, load the script, and subscribe to the namespace's wake-ups.
    pub async fn connect(config: RedisStoreConfig) -> Result<RedisStore> {
        keys::check_namespace(&config.namespace).map_err(|reason| Error::InvalidRequest {
            field: "namespace",
            reason,
        })?;
        let target = Target::parse(&config.url).map_err(|reason| Error::InvalidRequest {
            field: "store",
            reason,
        })?;
        let backend =
            tokio::time::timeout(config.timeout, Backend::connect(&target, config.timeout))
                .await
                .map_err(|_| unavailable("timed out connecting to Redis"))?
                .map_err(|error| match error.kind() {
                    redis::ErrorKind::InvalidClientConfig => Error::InvalidRequest {
                        field: "store",
                        reason: format!("not a usable Redis URL: {error}"),
                    },
                    _ => store_error(error),
                })?;
        let policies = eviction::policies(&backend).await.map_err(store_error)?;
        let evicting = eviction::evicting(&policies);
        if !evicting.is_empty() {
            if !config.allow_eviction {
                return Err(Error::InvalidRequest {
                    field: "store",
                    reason: eviction::refusal(&evicting),
                });
            }
            tracing::warn!(
                policy = %evicting.join(", "),
                "Redis may evict Tollgate's keys (allowed by redis_allow_eviction): every call \
                 watches evictions, and a counter missing after one is held for a period"
            );
        }
        let script = Script::new(abi::script());
        let name = format!("tollgate_{}", &script.get_hash()[..16]);
        let library = format!(
            "#!lua name={name}\n{}",
            abi::script().replace("__TOLLGATE_FUNCTION__", &name)
        );
        let function = match load_library(&backend, &library).await {
            Ok(()) => Some((name, library)),
            Err(error) => {
                tracing::debug!(%error, "FUNCTION LOAD refused; deciding by EVALSHA");
                backend
                    .query(redis::cmd("SCRIPT").arg("LOAD").arg(abi::script()))
                    .await
                    .map_err(store_error)?;
                None
            }
        };
        let keys = keys::Keys::new(&config.namespace, target.is_cluster());
        let backend = Arc::new(backend);
        let wake: Arc<Mutex<Option<WakeFn>>> = Arc::new(Mutex::new(None));
        let subscriber = tokio::spawn(subscribe(
            backend.clone(),
            target.clone(),
            keys.clone(),
            wake.clone(),
        ));
        Ok(RedisStore {
            backend,
            target,
            script,
            function,
            keys,
            config,
            born_seen: AtomicU64::new(0),
            watch_evictions: AtomicBool::new(!evicting.is_empty()),
            wake,
            subscriber: Some(subscriber),
            limits: Mutex::new(std::collections::HashMap::new()),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.config.namespace
    }

    /// Whether this store speaks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.target.is_cluster()
    }

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
                let command = self.command(&[self.keys.generation(slot)], &[&numbers.0]);
                async move {
                    tokio::time::timeout(
                        self.config.timeout,
                        self.with_library(|| self.backend.query(&command)),
                    )
                    .await
                    .map_err(|_| unavailable("Redis did not answer in time"))?
                    .map_err(store_error)
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

    /// The command that runs the script on `keys` (after the generation, which is first). When
    /// the store watches evictions, the operation carries `WATCH_EVICTIONS` and the slot's
    /// evictions record is the last key.
    fn command(&self, keys: &[String], args: &[&[u8]]) -> redis::Cmd {
        if self.watch_evictions.load(Ordering::Relaxed)
            && let Some((numbers, rest)) = args.split_first()
            && let Some(generation) = keys.first()
        {
            let mut flagged = numbers.to_vec();
            if let Some(operation) = flagged.get_mut(..8) {
                let code = f64::from_be_bytes(operation.try_into().unwrap_or([0; 8]));
                operation.copy_from_slice(&(code + WATCH_EVICTIONS as f64).to_be_bytes());
            }
            let mut keys = keys.to_vec();
            keys.push(keys::evictions_beside(generation));
            let mut args: Vec<&[u8]> = vec![&flagged];
            args.extend_from_slice(rest);
            return self.script_command(&keys, &args);
        }
        self.script_command(keys, args)
    }

    fn script_command(&self, keys: &[String], args: &[&[u8]]) -> redis::Cmd {
        let mut command = match &self.function {
            Some((name, _)) => {
                let mut command = redis::cmd("FCALL");
                command.arg(name.as_str());
                command
            }
            None => {
                let mut command = redis::cmd("EVALSHA");
                command.arg(self.script.get_hash());
                command
            }
        };
        command.arg(keys.len()).arg(keys).arg(args);
        command
    }

    /// Run `send`, and once more after loading the script again if Redis lost it.
    async fn with_library<'s, T, F>(&'s self, send: impl Fn() -> F) -> redis::RedisResult<T>
    where
        F: Future<Output = redis::RedisResult<T>> + 's,
    {
        match send().await {
            Err(error) if lost_library(&error) => {
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

    /// Run the script on one slot: one round trip. `keys` start with the slot's generation.
    async fn run(&self, keys: &[String], args: &[&[u8]]) -> Result<(Head, Reply)> {
        let command = self.command(keys, args);
        let value = tokio::time::timeout(
            self.config.timeout,
            self.with_library(|| self.backend.query(&command)),
        )
        .await
        .map_err(|_| unavailable("Redis did not answer in time"))?
        .map_err(store_error)?;
        let reply = parse_reply(value)?;
        if reply.numbers.len() < 3 {
            return Err(failed("script reply without its head"));
        }
        let head = Head {
            now_us: u(reply.numbers[0]),
            born_us: u(reply.numbers[1]),
            lost: reply.numbers[2] != 0,
        };
        self.born_seen.store(head.born_us, Ordering::Release);
        if head.lost {
            tracing::warn!(
                namespace = %self.config.namespace,
                "Redis lost Tollgate's state, or may have (a restart, a flush, a failover); \
                 granting nothing on a counter kept there until one period after {}",
                head.born_us
            );
        }
        Ok((head, reply))
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
    fn admission(&self, take: Take<'_>, slot: u16, keys: &mut Vec<String>) -> Admission {
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
    async fn admit_key(
        &self,
        take: Take<'_>,
        cover: u64,
        need: u64,
        request: bool,
    ) -> Result<Carried> {
        let apart = self.is_cluster();
        self.admit_at(take, cover, need, request, apart).await.1
    }

    /// `admit_key`, and the store's clock at the decision (0 when Redis did not answer);
    /// `apart`: the budget may be lost apart from its counters (to test that rule on one Redis).
    async fn admit_at(
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
            let (head, reply) = self.run(keys, &args).await?;
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
    async fn read_pause(&self, limit: &str) -> Result<u64> {
        let command = redis::cmd("GET").arg(self.keys.limit_pause(limit)).clone();
        let value = tokio::time::timeout(self.config.timeout, self.backend.query(&command))
            .await
            .map_err(|_| unavailable("Redis did not answer in time"))?
            .map_err(store_error)?;
        Ok(match value {
            Value::BulkString(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.parse::<f64>().ok())
                .map_or(0, |until| until as u64),
            _ => 0,
        })
    }

    /// `record`: whether grants record their reservations (the request is refundable).
    async fn acquire_remote(
        &self,
        takes: &[Take<'_>],
        cost: u64,
        priority: Priority,
        record: bool,
    ) -> Result<Decision> {
        if takes.len() > tollgate::COUNTERS_PER_REQUEST_MAX {
            return Err(Error::InvalidRequest {
                field: "limits",
                reason: format!(
                    "at most {} limits per request",
                    tollgate::COUNTERS_PER_REQUEST_MAX
                ),
            });
        }
        match self.acquire_slots(takes, cost, priority, record).await {
            Err(error) if self.config.fail_open && error.fails_open() => {
                tracing::warn!(%error, "Redis unreachable; granting without counting (fail_open)");
                Ok(fail_open_decision(takes.len()))
            }
            answer => answer,
        }
    }

    async fn acquire_slots(
        &self,
        takes: &[Take<'_>],
        cost: u64,
        priority: Priority,
        record: bool,
    ) -> Result<Decision> {
        // One Redis: every counter in one call, whatever its slot.
        let slots: Vec<u16> = if self.is_cluster() {
            takes
                .iter()
                .map(|take| self.keys.counter_slot(take.counter))
                .collect()
        } else {
            vec![0; takes.len()]
        };
        let groups = plan::groups(&slots);
        if groups.len() > 1 {
            // Refused before any slot is asked, so no part is granted only to be rolled back.
            for take in takes {
                let open = take.policy.capacity_for(priority);
                if cost == 0 || cost > open {
                    return Err(Error::Cost {
                        limit: take.counter.limit.to_owned(),
                        source: tollgate_core::CostError {
                            cost,
                            capacity: open,
                        },
                    });
                }
            }
        }
        let mut outcomes: Vec<Option<CounterOutcome>> = vec![None; takes.len()];
        let mut base_now = None;
        let mut progress = plan::Progress::default();
        let mut answer = None;
        loop {
            match progress.step(groups.len(), answer) {
                plan::Step::Ask(index) => {
                    let group = &groups[index];
                    let record = plan::records(index, groups.len(), record);
                    let slot_answer = self
                        .acquire_slot(takes, group, cost, priority, record)
                        .await;
                    let slot_answer = match slot_answer {
                        Ok(slot_answer) => slot_answer,
                        Err(error) => {
                            self.roll_back(takes, &groups[..index], &outcomes).await;
                            return Err(error);
                        }
                    };
                    let base = *base_now.get_or_insert(slot_answer.now_us);
                    let mut denied = false;
                    for (&take, outcome) in group.takes.iter().zip(slot_answer.outcomes) {
                        denied |= matches!(outcome, CounterOutcome::Denied(_));
                        outcomes[take] = Some(rebase(outcome, slot_answer.now_us, base));
                    }
                    answer = Some(denied);
                }
                plan::Step::Granted => break,
                plan::Step::RollBack(granted) => {
                    let granted: Vec<plan::Group> =
                        granted.iter().map(|&index| groups[index].clone()).collect();
                    let unasked = outcomes.iter().enumerate().filter(|(_, o)| o.is_none());
                    let unasked: Vec<usize> = unasked.map(|(index, _)| index).collect();
                    let (_, remaining) = futures_util::future::join(
                        self.roll_back(takes, &granted, &outcomes),
                        futures_util::future::join_all(
                            unasked
                                .iter()
                                .map(|&index| self.remaining(&takes[index], priority)),
                        ),
                    )
                    .await;
                    // What was granted and given back was allowed, with its units back; what
                    // was never asked is allowed with what its counter has left.
                    for (index, remaining) in unasked.into_iter().zip(remaining) {
                        outcomes[index] = Some(CounterOutcome::Allowed { remaining });
                    }
                    for outcome in &mut outcomes {
                        if let Some(CounterOutcome::Granted(grant)) = *outcome {
                            *outcome = Some(CounterOutcome::Allowed {
                                remaining: grant.remaining.saturating_add(cost),
                            });
                        }
                    }
                    break;
                }
            }
        }
        Ok(Decision::new(
            base_now.unwrap_or(0),
            outcomes
                .into_iter()
                .map(|outcome| outcome.unwrap_or(CounterOutcome::Allowed { remaining: 0 })),
        ))
    }

    /// One slot's call: its counters decided all or nothing. A new key, or a key whose cover
    /// runs out, whose limit's budget is in another slot is admitted there first (the script
    /// asks before it writes anything), and the call made again with the answers.
    async fn acquire_slot(
        &self,
        takes: &[Take<'_>],
        group: &plan::Group,
        cost: u64,
        priority: Priority,
        record: bool,
    ) -> Result<SlotAnswer> {
        let mut keys = Vec::with_capacity(1 + group.takes.len() * 5);
        keys.push(self.keys.generation(group.slot));
        for &index in &group.takes {
            // The counter's own slot: on one Redis, every counter is in the one group.
            let counter = takes[index].counter;
            keys.extend(
                self.keys
                    .counter_keys(self.keys.counter_slot(counter), counter),
            );
        }
        let mut pauses = Vec::with_capacity(group.takes.len());
        let mut admissions = Vec::with_capacity(group.takes.len());
        for &index in &group.takes {
            let take = takes[index];
            let pause =
                if !self.is_cluster() || self.keys.pause_slot(take.counter.limit) == group.slot {
                    keys.push(self.keys.limit_pause(take.counter.limit));
                    PauseRef::Key(keys.len())
                } else {
                    PauseRef::Read(self.read_pause(take.counter.limit).await?)
                };
            pauses.push(pause);
            admissions.push(self.admission(take, group.slot, &mut keys));
        }
        for _ in 0..ADMISSION_ATTEMPTS_MAX {
            let mut numbers = Numbers::new(ACQUIRE);
            numbers.extend(&[
                cost,
                priority_arg(priority),
                u64::from(record),
                group.takes.len() as u64,
            ]);
            for (position, &index) in group.takes.iter().enumerate() {
                numbers
                    .extend(&policy_args(takes[index].policy))
                    .push_f64(pauses[position].arg())
                    .admission(&admissions[position], self.is_cluster());
            }
            let (head, reply) = self.run(&keys, &[&numbers.0]).await?;
            // The counter a reply names (1-based, in the group), as its place in the request.
            let take_at = |number: Option<&i64>| {
                let position = usize::try_from(number.copied().unwrap_or(1))
                    .unwrap_or(1)
                    .saturating_sub(1);
                group
                    .takes
                    .get(position)
                    .map(|&index| (position, takes[index]))
            };
            match reply.status.as_str() {
                "ok" => return slot_answer(head, &reply, group),
                "cost" => {
                    let limit =
                        take_at(reply.numbers.get(3)).map_or("", |(_, take)| take.counter.limit);
                    return Err(Error::Cost {
                        limit: limit.to_owned(),
                        source: tollgate_core::CostError {
                            cost,
                            capacity: u(reply.numbers.get(4).copied().unwrap_or(0)),
                        },
                    });
                }
                "keys" => {
                    let limit =
                        take_at(reply.numbers.get(3)).map_or("", |(_, take)| take.counter.limit);
                    return Err(too_many_keys(
                        limit,
                        u(reply.numbers.get(4).copied().unwrap_or(0)),
                    ));
                }
                "admit" => {
                    let asks: Vec<(usize, Take<'_>, u64, u64)> = reply.numbers[3..]
                        .chunks(3)
                        .filter_map(|ask| {
                            let (position, take) = take_at(ask.first())?;
                            Some((position, take, u(*ask.get(1)?), u(*ask.get(2)?)))
                        })
                        .collect();
                    let answers = futures_util::future::join_all(
                        asks.iter()
                            .map(|&(_, take, cover, need)| self.admit_key(take, cover, need, true)),
                    )
                    .await;
                    for (&(position, ..), answer) in asks.iter().zip(answers) {
                        admissions[position].carried = answer?;
                    }
                }
                other => return Err(failed(format!("unexpected script status {other}"))),
            }
        }
        let limit = group
            .takes
            .first()
            .map_or("", |&index| takes[index].counter.limit);
        Err(not_admitted(limit))
    }

    /// What `take`'s counter has left at `priority`, read without taking anything (0 when Redis
    /// does not answer): for the counters of a denied cross-slot request that were not asked.
    async fn remaining(&self, take: &Take<'_>, priority: Priority) -> u64 {
        match self.usage_remote(*take).await {
            Ok(usage) => take
                .policy
                .capacity_for(priority)
                .saturating_sub(usage.used),
            Err(_) => 0,
        }
    }

    /// Give back what `groups` granted (a commit of nothing on each), all at once. A rollback
    /// that fails leaves its units counted until they expire: fewer grants, never more.
    async fn roll_back(
        &self,
        takes: &[Take<'_>],
        groups: &[plan::Group],
        outcomes: &[Option<CounterOutcome>],
    ) {
        let rollbacks = groups
            .iter()
            .flat_map(|group| &group.takes)
            .filter_map(|&index| match outcomes[index] {
                Some(CounterOutcome::Granted(grant)) => Some((takes[index], grant.seq)),
                _ => None,
            });
        let answers = futures_util::future::join_all(
            rollbacks
                .map(|(take, seq)| async move { (take, self.commit_at(take, seq, 0).await.1) }),
        )
        .await;
        for (take, answer) in answers {
            if let Err(error) = answer {
                tracing::warn!(
                    limit = take.counter.limit,
                    %error,
                    "a cross-slot grant could not be rolled back; its units stay counted until they expire"
                );
            }
        }
    }

    async fn commit_remote(&self, take: Take<'_>, seq: u64, used: u64) -> Result<Committed> {
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

    async fn renew_remote(&self, take: Take<'_>, fence: u64) -> Result<Renewed> {
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

    async fn pause_remote(&self, take: Take<'_>, duration_us: u64) -> Result<u64> {
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

    async fn resume_remote(&self, take: Take<'_>) -> Result<bool> {
        let keyed = take.counter.key.is_some();
        let (keys, admission) = self.pause_call(take);
        let own = [f64::from(u8::from(keyed))];
        let (_, reply) = self
            .run_counter(take, RESUME, &keys, admission, &own, &[])
            .await?;
        match reply.status.as_str() {
            "ok" => Ok(reply.numbers.get(3).copied().unwrap_or(0) >= 1),
            other => Err(unavailable(format!("unexpected script status {other}"))),
        }
    }

    async fn usage_remote(&self, take: Take<'_>) -> Result<Usage> {
        let (mut keys, admission) = self.counter_call(take);
        let pause = if !self.is_cluster()
            || self.keys.pause_slot(take.counter.limit) == self.keys.counter_slot(take.counter)
        {
            keys.push(self.keys.limit_pause(take.counter.limit));
            PauseRef::Key(keys.len())
        } else {
            PauseRef::Read(self.read_pause(take.counter.limit).await?)
        };
        let (head, reply) = self
            .run_counter(take, USAGE, &keys, admission, &[pause.arg()], &[])
            .await?;
        match reply.status.as_str() {
            "ok" => {
                let number = |index: usize| u(reply.numbers.get(index).copied().unwrap_or(0));
                Ok(Usage {
                    used: number(3),
                    reset_after_us: number(4),
                    paused_for_us: number(5).saturating_sub(head.now_us),
                })
            }
            other => Err(failed(format!("unexpected script status {other}"))),
        }
    }

    /// The generation's birth as of the last reply, in the store's microseconds.
    pub fn last_born_us(&self) -> u64 {
        self.born_seen.load(Ordering::Acquire)
    }

    /// The Redis key that holds `counter` (for tests and operators).
    pub fn counter_key(&self, counter: CounterId<'_>) -> String {
        self.keys.counter(counter)
    }

    /// The key of the generation that guards `counter` (for tests and operators).
    pub fn generation_key(&self, counter: CounterId<'_>) -> String {
        self.keys.generation(self.keys.counter_slot(counter))
    }

    /// The generation that guards `counter`, as Redis holds it now: `None` when there is none
    /// (for tests and operators; deciding reads it inside the script).
    pub async fn generation(&self, counter: CounterId<'_>) -> Result<Option<loss::Generation>> {
        let command = redis::cmd("GET").arg(self.generation_key(counter)).clone();
        let value = tokio::time::timeout(self.config.timeout, self.backend.query(&command))
            .await
            .map_err(|_| unavailable("Redis did not answer in time"))?
            .map_err(store_error)?;
        let Value::BulkString(bytes) = value else {
            return Ok(None);
        };
        Ok(loss::Generation::decode(&bytes))
    }

    /// The function library this store calls (`FCALL`), or `None` when it calls by `EVALSHA`.
    pub fn function_library(&self) -> Option<&str> {
        self.function.as_ref().map(|(name, _)| name.as_str())
    }

    /// A pattern matching every key of this store's namespace (for `SCAN`).
    pub fn key_pattern(&self) -> String {
        format!("tg:{{*}}:{}:*", self.config.namespace)
    }
}

/// A slot's `ok` reply: one outcome for each counter of `group`.
fn slot_answer(head: Head, reply: &Reply, group: &plan::Group) -> Result<SlotAnswer> {
    let numbers = &reply.numbers[3..];
    if numbers.len() != group.takes.len() * 5 {
        return Err(failed("script reply of the wrong length"));
    }
    let outcomes = numbers
        .chunks(5)
        .map(|outcome| match u(outcome[0]) {
            OUTCOME_GRANTED => CounterOutcome::Granted(Grant {
                seq: u(outcome[1]),
                remaining: u(outcome[2]),
                reset_after_us: u(outcome[3]),
                lease_expires_at: (outcome[4] > 0).then(|| u(outcome[4])),
            }),
            OUTCOME_ALLOWED => CounterOutcome::Allowed {
                remaining: u(outcome[2]),
            },
            // OUTCOME_DENIED, or a code this version does not know: nothing was granted.
            _ => CounterOutcome::Denied(Denial {
                retry_after_us: u(outcome[1]),
                remaining: u(outcome[2]),
                reason: abi::reason(u(outcome[3])),
            }),
        })
        .collect();
    Ok(SlotAnswer {
        now_us: head.now_us,
        outcomes,
    })
}

/// `outcome`, decided at `now_us` on its slot's clock, with its lease expiry moved to the
/// request's base clock (the first slot's): each node has its own clock, and a lease is as
/// long as its node says.
fn rebase(outcome: CounterOutcome, now_us: u64, base_us: u64) -> CounterOutcome {
    match outcome {
        CounterOutcome::Granted(mut grant) => {
            grant.lease_expires_at = grant
                .lease_expires_at
                .map(|at| base_us.saturating_add(at.saturating_sub(now_us)));
            CounterOutcome::Granted(grant)
        }
        other => other,
    }
}

fn lost_library(error: &RedisError) -> bool {
    let text = error.to_string();
    text.contains("Function not found") || text.contains("NOSCRIPT")
}

/// `FUNCTION LOAD REPLACE`: the same source under the same name, so any number of processes may
/// load it at once (on a cluster, on every master).
async fn load_library(backend: &Backend, library: &str) -> std::result::Result<(), RedisError> {
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

fn permit_error(status: &str, numbers: &[i64], used: u64) -> Error {
    let source = match status {
        "unknown" => PermitError::Unknown,
        "gone" => PermitError::Gone,
        "lease_expired" => PermitError::LeaseExpired,
        "wrong_kind" => PermitError::WrongKind,
        "used_above_cost" => PermitError::UsedAboveCost {
            used,
            cost: u(numbers.get(3).copied().unwrap_or(0)),
        },
        other => return failed(format!("unexpected script status {other}")),
    };
    Error::Permit { source }
}

/// The script asked for a key to be admitted more times than a cover can run out in.
fn not_admitted(limit: &str) -> Error {
    failed(format!(
        "a key of limit {limit:?} was not admitted to its budget in {ADMISSION_ATTEMPTS_MAX} \
         calls (are the Redis nodes' clocks far apart?)"
    ))
}

/// A grant on every counter that counts nothing: what fail-open answers while Redis is down.
fn fail_open_decision(counters: usize) -> Decision {
    let grant = Grant {
        seq: 0,
        remaining: 0,
        reset_after_us: 0,
        lease_expires_at: None,
    };
    Decision::new(0, (0..counters).map(|_| CounterOutcome::Granted(grant)))
}

/// Listen on the wake channel, reconnecting with a capped backoff (to another node of a
/// cluster, or to the master the Sentinels name now), and pass every counter whose capacity
/// came back to the limiter's wake-up.
async fn subscribe(
    backend: Arc<Backend>,
    target: Target,
    keys: keys::Keys,
    wake: Arc<Mutex<Option<WakeFn>>>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        let client = backend.subscription_client(&target, attempt).await;
        attempt += 1;
        match client {
            Ok(client) => match client.get_async_pubsub().await {
                Ok(mut pubsub) => {
                    if pubsub.subscribe(keys.wake_channel()).await.is_ok() {
                        backoff = Duration::from_millis(50);
                        let mut messages = pubsub.on_message();
                        while let Some(message) = messages.next().await {
                            let payload: Vec<u8> = message.get_payload_bytes().to_vec();
                            let Ok(text) = String::from_utf8(payload) else {
                                continue;
                            };
                            if let Some((limit, key)) = keys.parse_counter(&text) {
                                let handler = wake.lock().ok().and_then(|slot| slot.clone());
                                if let Some(handler) = handler {
                                    handler(CounterId {
                                        limit: &limit,
                                        key: key.as_deref(),
                                    });
                                }
                            }
                        }
                    }
                }
                Err(error) => tracing::debug!(%error, "wake-up subscription failed; retrying"),
            },
            Err(error) => tracing::debug!(%error, "wake-up subscription failed; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

impl Store for RedisStore {
    fn acquire<'a>(
        &'a self,
        takes: &'a [Take<'a>],
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> StoreFuture<'a, Decision> {
        StoreFuture::boxed(self.acquire_remote(takes, cost, priority, refundable))
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        StoreFuture::boxed(self.commit_remote(take, seq, used))
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        StoreFuture::boxed(self.renew_remote(take, fence))
    }

    fn pause<'a>(&'a self, take: Take<'a>, duration_us: u64) -> StoreFuture<'a, u64> {
        StoreFuture::boxed(self.pause_remote(take, duration_us))
    }

    fn resume<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, bool> {
        StoreFuture::boxed(self.resume_remote(take))
    }

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, Usage> {
        StoreFuture::boxed(self.usage_remote(take))
    }

    /// Each limit's own budget of keys is read here (`Limit::keys_max`), for the admissions
    /// that follow. A limit gone or changed kind loses its limit-wide pause, deleted in the
    /// background (this is called under the limiter's lock, and must not wait on Redis). Its
    /// keys' own pauses cannot be found without scanning the namespace: they end within the
    /// longest pause (`LimiterConfig::pause_max`).
    fn set_limits(&self, limits: &tollgate::LimitTable) {
        let gone: Vec<String> = {
            let Ok(mut known) = self.limits.lock() else {
                return;
            };
            let gone = known
                .iter()
                .filter(|(name, (leases, _))| {
                    limits
                        .get(name)
                        .is_none_or(|limit| limit.policy().is_concurrency() != *leases)
                })
                .map(|(name, _)| self.keys.limit_pause(name))
                .collect();
            *known = limits
                .iter()
                .map(|limit| {
                    let known = (limit.policy().is_concurrency(), limit.keys_max());
                    (limit.name().to_owned(), known)
                })
                .collect();
            gone
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for key in gone {
            let backend = Arc::clone(&self.backend);
            let timeout = self.config.timeout;
            runtime.spawn(async move {
                let command = redis::cmd("DEL").arg(&key).clone();
                match tokio::time::timeout(timeout, backend.query(&command)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => {
                        tracing::warn!(%error, key, "the pause of a limit gone could not be lifted")
                    }
                    Err(_) => tracing::warn!(key, "the pause of a limit gone could not be lifted"),
                }
            });
        }
    }

    /// Redis answers, and its eviction policy is still one the store was started on: a policy
    /// changed to one that may evict is a failure unless eviction is allowed (and from then on
    /// every call watches evictions either way).
    fn ping(&self) -> StoreFuture<'_, ()> {
        StoreFuture::boxed(async move {
            let policies =
                tokio::time::timeout(self.config.timeout, eviction::policies(&self.backend))
                    .await
                    .map_err(|_| unavailable("Redis did not answer in time"))?
                    .map_err(store_error)?;
            let evicting = eviction::evicting(&policies);
            if evicting.is_empty() {
                return Ok(());
            }
            if !self.watch_evictions.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    policy = %evicting.join(", "),
                    "Redis's maxmemory-policy now may evict Tollgate's keys: every call watches \
                     evictions from now on"
                );
            }
            if self.config.allow_eviction {
                Ok(())
            } else {
                Err(failed(eviction::refusal(&evicting)))
            }
        })
    }

    fn on_wake(&self, wake: WakeFn) {
        if let Ok(mut slot) = self.wake.lock() {
            *slot = Some(wake);
        }
    }
}
