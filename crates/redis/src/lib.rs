//! The Redis store: counters shared by any number of processes and machines.
//!
//! Every operation (acquire over several counters, commit, renew, pause) is one call of
//! `tollgate.lua`, which decides atomically with the same arithmetic as the decision core, on
//! Redis's clock (`TIME`), never a worker's (G5). On Redis 7 and later the script is loaded as a
//! function library named after its hash and each operation is one `FCALL` (its helpers are
//! then made once, not on every call); where `FUNCTION LOAD` is refused (older Redis, ACLs) it
//! is one `EVALSHA`. A Redis that lost the library (restart without persistence) gets it again
//! on the first call that misses it, as a flushed script cache does.
//!
//! Keys: `tg:{<namespace>}:...`. The namespace is the hash tag, so every key of one decision
//! lands on one Redis Cluster slot; limit names and user keys stay outside the braces, length-
//! prefixed, so no input can address another limit's or another key's counter. Every key is
//! written with its expiry in the same script, so no key lives without a TTL and Redis's memory
//! follows live state (G7).
//!
//! Lost state (G6): a generation hash `{born, ver}` is bumped by every operation; a missing
//! hash, or a version lower than this client has seen (failover to a stale replica), starts a new
//! generation, and every counter created within one period (or lease TTL) of its birth grants
//! nothing until then. Unreachable Redis: `store_unavailable`, unless `fail_open` is set.
//!
//! Waiting across processes: the script publishes a counter's key on the namespace's wake
//! channel whenever capacity comes back (a refund, a release); a subscriber task turns that into
//! the limiter's wake-up, so a waiter in one process wakes when another releases.

mod keys;
mod leasing;

#[cfg(test)]
mod differential_tests;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use redis::{RedisError, Script, Value};
use tollgate::store::{
    CounterId, CounterOutcome, Decision, Renewed, Store, StoreFuture, Take, Usage, WakeFn,
};
use tollgate::{Error, Result};
use tollgate_core::{
    Algorithm, Committed, Denial, DenyReason, Grant, Kind, PermitError, Policy, Priority,
};

pub use keys::check_namespace;
pub use leasing::{LeasingConfig, LeasingStats, LeasingStore};

const SCRIPT: &str = include_str!("tollgate.lua");

/// How a Redis store connects and behaves.
#[derive(Clone, Debug)]
pub struct RedisStoreConfig {
    /// `redis://host:port/db`.
    pub url: String,
    /// The hash tag of every key, and the unit of atomicity: limits decided together must share
    /// a namespace. `[a-z0-9_-]`, at most 64 bytes.
    pub namespace: String,
    /// Grant when Redis cannot be reached. Off (fail-closed) unless the operator decides that
    /// overdrawing a quota is better than stopping; then every grant made while Redis is down is
    /// a grant no limit counted.
    pub fail_open: bool,
    /// How long one operation may take before it counts as unreachable.
    pub timeout: Duration,
}

/// Counters in Redis, shared by every process on the same namespace.
pub struct RedisStore {
    connection: ConnectionManager,
    script: Script,
    /// The function library: its `FCALL` name and source, when Redis accepted it.
    function: Option<(String, String)>,
    keys: keys::Keys,
    config: RedisStoreConfig,
    /// The highest generation version seen: a lower one from Redis means it lost state.
    version_seen: Arc<AtomicU64>,
    /// The generation's birth in the last reply (for tests mirroring the script).
    born_seen: AtomicU64,
    wake: Arc<Mutex<Option<WakeFn>>>,
    subscriber: Option<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("namespace", &self.config.namespace)
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

fn unavailable(error: impl fmt::Display) -> Error {
    Error::StoreUnavailable {
        reason: error.to_string(),
    }
}

/// The script's operation codes (the first number of its arguments).
const ACQUIRE: u64 = 1;
const COMMIT: u64 = 2;
const RENEW: u64 = 3;
const PAUSE: u64 = 4;
const USAGE: u64 = 5;

/// The script's numbers as one argument of big-endian doubles: one Lua string to make instead of
/// one per number. Every number the script reads is an integer below 2^53, exact as a double.
fn pack_numbers(numbers: &[u64]) -> Vec<u8> {
    let mut packed = Vec::with_capacity(numbers.len() * 8);
    for &number in numbers {
        packed.extend_from_slice(&(number as f64).to_be_bytes());
    }
    packed
}

/// The nine numbers the script reads for a policy.
fn policy_args(policy: &Policy) -> [u64; 9] {
    let reserve = policy.reserve();
    match policy.kind() {
        Kind::Rate(rate) => {
            let (algorithm, burst) = match rate.algorithm() {
                Algorithm::Sliding => (1, 0),
                Algorithm::Fixed => (2, 0),
                Algorithm::Gcra { burst } => (3, burst),
            };
            [
                1,
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
            2,
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
    match priority {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
    }
}

/// The script's reply, read as a list of integers after its leading status word.
struct Reply {
    status: String,
    numbers: Vec<i64>,
}

fn parse_reply(value: Value) -> Result<Reply> {
    let Value::Array(items) = value else {
        return Err(Error::StoreUnavailable {
            reason: format!("unexpected script reply {value:?}"),
        });
    };
    let mut items = items.into_iter();
    let status = match items.next() {
        Some(Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Some(Value::SimpleString(text)) => text,
        other => {
            return Err(Error::StoreUnavailable {
                reason: format!("unexpected script status {other:?}"),
            });
        }
    };
    let numbers = items
        .map(|item| match item {
            Value::Int(number) => Ok(number),
            other => Err(Error::StoreUnavailable {
                reason: format!("unexpected script value {other:?}"),
            }),
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
    version: u64,
    born_us: Option<u64>,
    lost: bool,
}

impl RedisStore {
    /// Connect, load the script, and subscribe to the namespace's wake-ups.
    pub async fn connect(config: RedisStoreConfig) -> Result<RedisStore> {
        keys::check_namespace(&config.namespace).map_err(|reason| Error::InvalidRequest {
            field: "namespace",
            reason,
        })?;
        let client =
            redis::Client::open(config.url.as_str()).map_err(|error| Error::InvalidRequest {
                field: "store",
                reason: format!("not a Redis URL: {error}"),
            })?;
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout))
            .set_number_of_retries(1);
        let connection = tokio::time::timeout(
            config.timeout,
            ConnectionManager::new_with_config(client.clone(), manager_config),
        )
        .await
        .map_err(|_| unavailable("timed out connecting to Redis"))?
        .map_err(unavailable)?;
        let script = Script::new(SCRIPT);
        let mut loader = connection.clone();
        let name = format!("tollgate_{}", &script.get_hash()[..16]);
        let library = format!(
            "#!lua name={name}\n{}",
            SCRIPT.replace("__TOLLGATE_FUNCTION__", &name)
        );
        let function = match load_library(&mut loader, &library).await {
            Ok(()) => Some((name, library)),
            Err(error) => {
                tracing::debug!(%error, "FUNCTION LOAD refused; deciding by EVALSHA");
                script
                    .prepare_invoke()
                    .load_async(&mut loader)
                    .await
                    .map_err(unavailable)?;
                None
            }
        };
        let keys = keys::Keys::new(&config.namespace);
        let wake: Arc<Mutex<Option<WakeFn>>> = Arc::new(Mutex::new(None));
        let subscriber = tokio::spawn(subscribe(
            client,
            keys.wake_channel().to_owned(),
            keys.clone(),
            wake.clone(),
        ));
        Ok(RedisStore {
            connection,
            script,
            function,
            keys,
            config,
            version_seen: Arc::new(AtomicU64::new(0)),
            born_seen: AtomicU64::new(0),
            wake,
            subscriber: Some(subscriber),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.config.namespace
    }

    /// Take the namespace as new, if Redis holds nothing of it: its generation starts in the
    /// past, so its counters are made without the hold that a namespace found empty otherwise
    /// gets (G6). For a caller that knows the namespace was never used (the server asks its
    /// rules database); one that was used and comes back empty must not call this. Returns
    /// whether the namespace was new; one Redis already knows is left as it is.
    pub async fn begin_new_namespace(&self) -> Result<bool> {
        // `born` 0 and `ver` 1: the script's next call finds a live generation (ver 2) whose
        // birth is long past.
        let script = Script::new(
            "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
             redis.call('HSET', KEYS[1], 'born', 0, 'ver', 1)
             redis.call('PEXPIRE', KEYS[1], 2592000000)
             return 1",
        );
        let mut connection = self.connection.clone();
        let created: i64 = tokio::time::timeout(
            self.config.timeout,
            script
                .key(self.keys.generation())
                .invoke_async(&mut connection),
        )
        .await
        .map_err(|_| unavailable("Redis did not answer in time"))?
        .map_err(unavailable)?;
        Ok(created == 1)
    }

    /// Run the script: one round trip. `keys` and `args` follow the script's header.
    async fn run(&self, keys: &[String], args: &[&[u8]]) -> Result<(Head, Reply)> {
        let value: Value = tokio::time::timeout(self.config.timeout, self.call(keys, args))
            .await
            .map_err(|_| unavailable("Redis did not answer in time"))?
            .map_err(|error: RedisError| unavailable(error))?;
        let reply = parse_reply(value)?;
        if reply.numbers.len() < 4 {
            return Err(unavailable("script reply without its head"));
        }
        let head = Head {
            now_us: u(reply.numbers[0]),
            version: u(reply.numbers[1]),
            // -1: the script did not need the generation's birth for this call.
            born_us: u64::try_from(reply.numbers[2]).ok(),
            lost: reply.numbers[3] != 0,
        };
        self.version_seen.fetch_max(head.version, Ordering::AcqRel);
        if let Some(born) = head.born_us {
            self.born_seen.store(born, Ordering::Release);
        }
        if head.lost {
            tracing::warn!(
                namespace = %self.config.namespace,
                "Redis lost Tollgate's state; granting nothing on a limit until one period after {}",
                head.born_us.unwrap_or(head.now_us)
            );
        }
        Ok((head, reply))
    }

    /// One `FCALL` (or `EVALSHA`), loading the library again if Redis lost it.
    async fn call(
        &self,
        keys: &[String],
        args: &[&[u8]],
    ) -> std::result::Result<Value, RedisError> {
        let mut connection = self.connection.clone();
        let Some((name, library)) = &self.function else {
            let mut invocation = self.script.prepare_invoke();
            invocation.key(self.keys.generation());
            for key in keys {
                invocation.key(key.as_str());
            }
            for arg in args {
                invocation.arg(*arg);
            }
            return invocation.invoke_async(&mut connection).await;
        };
        let mut command = redis::cmd("FCALL");
        command
            .arg(name.as_str())
            .arg(keys.len() + 1)
            .arg(self.keys.generation())
            .arg(keys)
            .arg(args);
        match command.query_async(&mut connection).await {
            Err(error) if error.to_string().contains("Function not found") => {
                load_library(&mut connection, library).await?;
                command.query_async(&mut connection).await
            }
            answer => answer,
        }
    }

    /// The numbers every operation starts with: its code and the version this client has seen.
    fn common_numbers(&self, operation: u64) -> Vec<u64> {
        vec![operation, self.version_seen.load(Ordering::Acquire)]
    }

    /// The numbers of an operation on one counter: the common ones, the policy, then `extra`.
    fn counter_numbers(&self, operation: u64, policy: &Policy, extra: &[u64]) -> Vec<u8> {
        let mut numbers = self.common_numbers(operation);
        numbers.extend(policy_args(policy).iter().chain(extra));
        pack_numbers(&numbers)
    }

    /// A counter's three keys: its state, its open reservations and its older sliding buckets.
    fn counter_keys(&self, counter: CounterId<'_>) -> Vec<String> {
        vec![
            self.keys.counter(counter),
            self.keys.reservations(counter),
            self.keys.buckets(counter),
        ]
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
        let mut keys = Vec::with_capacity(takes.len() * 4);
        let mut numbers = self.common_numbers(ACQUIRE);
        numbers.extend([
            cost,
            priority_arg(priority),
            u64::from(record),
            takes.len() as u64,
        ]);
        for take in takes {
            keys.extend(self.counter_keys(take.counter));
            keys.push(self.keys.limit_pause(take.counter.limit));
            numbers.extend(policy_args(take.policy));
        }
        let packed = pack_numbers(&numbers);
        let (head, reply) = match self.run(&keys, &[&packed]).await {
            Ok(answer) => answer,
            Err(Error::StoreUnavailable { reason }) if self.config.fail_open => {
                tracing::warn!(%reason, "Redis unreachable; granting without counting (fail_open)");
                return Ok(fail_open_decision(takes.len()));
            }
            Err(error) => return Err(error),
        };
        match reply.status.as_str() {
            "ok" => {}
            "cost" => {
                let index = usize::try_from(reply.numbers.get(4).copied().unwrap_or(1))
                    .unwrap_or(1)
                    .saturating_sub(1);
                let limit = takes.get(index).map_or("", |take| take.counter.limit);
                return Err(Error::Cost {
                    limit: limit.to_owned(),
                    source: tollgate_core::CostError {
                        cost,
                        capacity: u(reply.numbers.get(5).copied().unwrap_or(0)),
                    },
                });
            }
            other => return Err(unavailable(format!("unexpected script status {other}"))),
        }
        let numbers = &reply.numbers[4..];
        if numbers.len() != takes.len() * 5 {
            return Err(unavailable("script reply of the wrong length"));
        }
        let outcomes = numbers.chunks(5).map(|outcome| match outcome[0] {
            0 => CounterOutcome::Granted(Grant {
                seq: u(outcome[1]),
                remaining: u(outcome[2]),
                reset_after_us: u(outcome[3]),
                lease_expires_at: (outcome[4] > 0).then(|| u(outcome[4])),
            }),
            1 => CounterOutcome::Allowed {
                remaining: u(outcome[2]),
            },
            _ => CounterOutcome::Denied(Denial {
                retry_after_us: u(outcome[1]),
                remaining: u(outcome[2]),
                reason: match outcome[3] {
                    1 => DenyReason::Paused,
                    2 => DenyReason::Recovering,
                    _ => DenyReason::Capacity,
                },
            }),
        });
        Ok(Decision::new(head.now_us, outcomes))
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
        let packed = self.counter_numbers(COMMIT, take.policy, &[seq, used]);
        let keys = self.counter_keys(take.counter);
        let channel = self.keys.wake_channel().as_bytes();
        let (head, reply) = match self.run(&keys, &[&packed, channel]).await {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => Ok(Committed {
                refunded: u(reply.numbers.get(4).copied().unwrap_or(0)),
                released: u(reply.numbers.get(5).copied().unwrap_or(0)),
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
        let packed = self.counter_numbers(RENEW, take.policy, &[fence]);
        let keys = self.counter_keys(take.counter);
        let (head, reply) = match self.run(&keys, &[&packed]).await {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => Ok(u(reply.numbers.get(4).copied().unwrap_or(0))),
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
        let packed = self.counter_numbers(PAUSE, take.policy, &[duration_us, u64::from(keyed)]);
        let keys = if keyed {
            self.counter_keys(take.counter)
        } else {
            vec![self.keys.limit_pause(take.counter.limit)]
        };
        let (head, reply) = match self.run(&keys, &[&packed]).await {
            Ok(answer) => answer,
            Err(error) => return (0, Err(error)),
        };
        let result = match reply.status.as_str() {
            "ok" => Ok(u(reply.numbers.get(4).copied().unwrap_or(0))),
            other => Err(unavailable(format!("unexpected script status {other}"))),
        };
        (head.now_us, result)
    }

    async fn usage_remote(&self, take: Take<'_>) -> Result<Usage> {
        let packed = self.counter_numbers(USAGE, take.policy, &[]);
        let mut keys = self.counter_keys(take.counter);
        keys.push(self.keys.limit_pause(take.counter.limit));
        let (head, reply) = self.run(&keys, &[&packed]).await?;
        match reply.status.as_str() {
            "ok" => {
                let number = |index: usize| u(reply.numbers.get(index).copied().unwrap_or(0));
                Ok(Usage {
                    used: number(4),
                    reset_after_us: number(5),
                    paused_for_us: number(6).saturating_sub(head.now_us),
                })
            }
            other => Err(unavailable(format!("unexpected script status {other}"))),
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

    /// The function library this store calls (`FCALL`), or `None` when it calls by `EVALSHA`.
    pub fn function_library(&self) -> Option<&str> {
        self.function.as_ref().map(|(name, _)| name.as_str())
    }

    /// The prefix every key of this store starts with.
    pub fn key_prefix(&self) -> &str {
        self.keys.prefix()
    }
}

/// `FUNCTION LOAD REPLACE`: the same source under the same name, so any number of processes may
/// load it at once.
async fn load_library(
    connection: &mut ConnectionManager,
    library: &str,
) -> std::result::Result<(), RedisError> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library)
        .query_async::<String>(connection)
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
            cost: u(numbers.get(4).copied().unwrap_or(0)),
        },
        other => return unavailable(format!("unexpected script status {other}")),
    };
    Error::Permit { source }
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

/// Listen on the wake channel, reconnecting with a capped backoff, and pass every counter whose
/// capacity came back to the limiter's wake-up.
async fn subscribe(
    client: redis::Client,
    channel: String,
    keys: keys::Keys,
    wake: Arc<Mutex<Option<WakeFn>>>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => {
                if pubsub.subscribe(&channel).await.is_ok() {
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

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, Usage> {
        StoreFuture::boxed(self.usage_remote(take))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        StoreFuture::boxed(async move {
            let mut connection = self.connection.clone();
            let answer: Result<String, RedisError> = tokio::time::timeout(
                self.config.timeout,
                redis::cmd("PING").query_async(&mut connection),
            )
            .await
            .map_err(|_| RedisError::from((redis::ErrorKind::Io, "no answer in time")))
            .and_then(|answer| answer);
            answer.map(|_| ()).map_err(unavailable)
        })
    }

    fn on_wake(&self, wake: WakeFn) {
        if let Ok(mut slot) = self.wake.lock() {
            *slot = Some(wake);
        }
    }
}
