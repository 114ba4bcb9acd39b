//! `RedisStore` and its `RedisStoreConfig`: the store's state, what it tells about itself (for
//! tests and operators), and the `Store` it is to the limiter.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tokio::sync::OnceCell;
use tollgate::Result;
use tollgate::store::{
    Adjust, Adjusted, Ask, CounterId, Decision, News, Offers, Queue, Renewed, Store, StoreFuture,
    Take, Usage, WaiterId, WakeFn,
};
use tollgate_core::Committed;

use crate::backend::Target;
use crate::batch::Caller;
use crate::call::Carried;
use crate::errors::{failed, store_error, unavailable};
use crate::native::Module;
use crate::native::Native;
use crate::{eviction, keys, loss};

/// How often a waiting request asks again, at the latest, to keep its place in the queues of
/// its counters across the fleet.
pub const PLACE_RENEWAL: Duration = Duration::from_millis(500);

/// How long a waiting request's place lives after its last ask: three renewals, so a process
/// that stalls for a moment keeps it, and one that died stops holding anyone back within this.
pub const PLACE_TTL_US: u64 = 3 * PLACE_RENEWAL.as_micros() as u64;

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
    /// Whether the store's operations are decided by the Redis module
    /// (`tollgate-redis-module`). `Auto`: asked at connect, used when loaded with this store's
    /// protocol version, the function library when not loaded, and another version refused. `On`: the same, but a Redis
    /// without the module (or a cluster) is refused at connect. `Off`: the function library
    /// for everything, loaded module or not.
    pub module: Module,
}

/// Called with the text another process published with `RedisStore::publish_lesson`.
pub type LessonFn = Arc<dyn Fn(&str) + Send + Sync>;

/// Counters in Redis, shared by every process on the same namespace.
pub struct RedisStore {
    /// What sends the script, and the acquires waiting per slot (`batch.rs`).
    pub(crate) caller: Arc<Caller>,
    pub(crate) target: Target,
    pub(crate) keys: keys::Keys,
    pub(crate) config: RedisStoreConfig,
    /// How long a waiting request's place lives after its last ask: `PLACE_TTL_US`, shorter in
    /// tests that watch places expire.
    pub(crate) place_ttl_us: u64,
    pub(crate) wake: Arc<Mutex<Option<WakeFn>>>,
    /// Who hears what other processes of the namespace publish with `publish_lesson`.
    pub(crate) lessons: Arc<Mutex<Option<LessonFn>>>,
    pub(crate) subscriber: Option<tokio::task::JoinHandle<()>>,
    /// The limits in force as last told (`News::Limits`): whether each counts leases, and
    /// its own budget of keys.
    pub(crate) limits: Mutex<std::collections::HashMap<String, (bool, Option<u64>)>>,
    /// The admissions of keys in flight to their budget's slot, by counter (`admit_key`).
    pub(crate) admitting: Mutex<std::collections::HashMap<String, Arc<OnceCell<Carried>>>>,
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

impl RedisStore {
    /// Tell every process on this namespace (this one included) `text`: what a vendor taught,
    /// for servers that share learning through their store. Fire and forget: a process that
    /// is not subscribed at that moment does not hear it.
    pub async fn publish_lesson(&self, text: &str) -> Result<()> {
        self.caller
            .backend
            .query(
                redis::cmd("PUBLISH")
                    .arg(self.keys.learn_channel())
                    .arg(text),
            )
            .await
            .map(|_| ())
            .map_err(crate::errors::store_error)
    }

    /// Hear what processes of this namespace publish with `publish_lesson`.
    pub fn on_lesson(&self, handler: LessonFn) {
        if let Ok(mut slot) = self.lessons.lock() {
            *slot = Some(handler);
        }
    }

    pub fn namespace(&self) -> &str {
        &self.config.namespace
    }

    /// Whether this store speaks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.target.is_cluster()
    }

    /// The generation's birth as of the last reply, in the store's microseconds.
    pub fn last_born_us(&self) -> u64 {
        self.caller.born_seen.load(Ordering::Acquire)
    }

    /// The Redis key that holds `counter` (for tests and operators).
    pub fn counter_key(&self, counter: CounterId<'_>) -> String {
        self.keys.counter(counter)
    }

    /// The key that holds `counter`'s queue of waiters across the fleet (for tests and
    /// operators; `queue::decode` reads it).
    pub fn queue_key(&self, counter: CounterId<'_>) -> String {
        self.keys
            .counter_queue(self.keys.counter_slot(counter), counter)
    }

    /// The key of the generation that guards `counter` (for tests and operators).
    pub fn generation_key(&self, counter: CounterId<'_>) -> String {
        self.keys.generation(self.keys.counter_slot(counter))
    }

    /// The generation that guards `counter`, as Redis holds it now: `None` when there is none
    /// (for tests and operators; deciding reads it inside the script).
    pub async fn generation(&self, counter: CounterId<'_>) -> Result<Option<loss::Generation>> {
        let value = self
            .query(redis::cmd("GET").arg(self.generation_key(counter)))
            .await?;
        let Value::BulkString(bytes) = value else {
            return Ok(None);
        };
        Ok(loss::Generation::decode(&bytes))
    }

    /// Acquires decided in one call with others since the store started (`batch.rs`).
    pub fn batched_acquires(&self) -> u64 {
        self.caller.batched()
    }

    /// Batch acquires (on, the default) or send each alone at once (off): for comparing the
    /// two, and for an operator who wants no acquire to wait for another's call.
    pub fn set_batching(&self, on: bool) {
        self.caller.set_batching(on);
    }

    /// Whether the Redis module decides the operations it can (`native.rs`).
    pub fn module_in_use(&self) -> bool {
        self.caller.using_module()
    }

    /// Acquires the Redis module decided since the store started.
    pub fn module_acquires(&self) -> u64 {
        self.caller.module_counts(Native::Acquire).0
    }

    /// Commits the Redis module decided since the store started.
    pub fn module_commits(&self) -> u64 {
        self.caller.module_counts(Native::Commit).0
    }

    /// The calls the Redis module decided since the store started, by its command
    /// (`TOLLGATE.ACQUIRE`, `TOLLGATE.COMMIT`, ...), every command the store may send it.
    pub fn module_calls(&self) -> Vec<(&'static str, u64)> {
        Native::ALL
            .iter()
            .map(|&native| (native.command(), self.caller.module_counts(native).0))
            .collect()
    }

    /// Calls sent to the Redis module that it refused as not native, then
    /// decided by the function library (one round trip more each) since the store started.
    pub fn module_fallbacks(&self) -> u64 {
        self.caller.module_counts(Native::Acquire).1
    }

    /// `module_fallbacks` by the module's reason (one of `REFUSED_IN_REDIS` when the store
    /// foresaw every refusal it could).
    pub fn module_refusals(&self) -> Vec<(String, u64)> {
        self.caller.module_refusals()
    }

    /// The function library this store calls (`FCALL`), or `None` when it calls by `EVALSHA`.
    pub fn function_library(&self) -> Option<&str> {
        self.caller.function.as_ref().map(|(name, _)| name.as_str())
    }

    /// A pattern matching every key of this store's namespace (for `SCAN`).
    pub fn key_pattern(&self) -> String {
        format!("tg:{{*}}:{}:*", self.config.namespace)
    }
}

/// A waiting request denied takes, or renews, its place in each counter's queue across the
/// fleet (`tollgate_redis_protocol::queue`): until it is granted, leaves, or stops asking for
/// `PLACE_TTL_US`.
impl Queue for RedisStore {
    fn renewal(&self) -> Duration {
        PLACE_RENEWAL
    }

    fn leave<'a>(&'a self, counters: &'a [CounterId<'a>], waiter: WaiterId) -> StoreFuture<'a, ()> {
        StoreFuture::boxed(self.leave_remote(counters, waiter))
    }
}

impl Store for RedisStore {
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        StoreFuture::boxed(self.acquire_remote(
            ask.takes,
            ask.costs,
            ask.priority,
            ask.refundable,
            ask.waiter,
        ))
    }

    fn offers(&self) -> Offers<'_> {
        Offers {
            queue: Some(self),
            in_process: None,
        }
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        StoreFuture::boxed(self.commit_remote(take, seq, used))
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        StoreFuture::boxed(self.renew_remote(take, fence))
    }

    fn adjust<'a>(&'a self, take: Take<'a>, adjust: Adjust) -> StoreFuture<'a, Adjusted> {
        StoreFuture::boxed(async move {
            Ok(match adjust {
                Adjust::Pause { for_us } => Adjusted {
                    changed: true,
                    paused_for_us: self.pause_remote(take, for_us).await?,
                    charged: 0,
                },
                Adjust::Resume => Adjusted {
                    changed: self.resume_remote(take).await?,
                    ..Adjusted::default()
                },
                Adjust::Reset => Adjusted {
                    changed: self.reset_remote(take).await?,
                    ..Adjusted::default()
                },
                Adjust::Charge { units } => {
                    let charged = self.charge_remote(take, units).await?;
                    Adjusted {
                        changed: charged > 0,
                        charged,
                        ..Adjusted::default()
                    }
                }
            })
        })
    }

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, Usage> {
        StoreFuture::boxed(self.usage_remote(take))
    }

    fn tell(&self, news: News<'_>) {
        match news {
            News::Limits(limits) => self.set_limits(limits),
            News::Wake(wake) => {
                if let Ok(mut slot) = self.wake.lock() {
                    *slot = Some(wake);
                }
            }
        }
    }

    /// Redis answers, and its eviction policy is still one the store was started on: a policy
    /// changed to one that may evict is a failure unless eviction is allowed (and from then on
    /// every call watches evictions either way).
    fn ping(&self) -> StoreFuture<'_, ()> {
        StoreFuture::boxed(async move {
            let policies = tokio::time::timeout(
                self.config.timeout,
                eviction::policies(&self.caller.backend),
            )
            .await
            .map_err(|_| unavailable("Redis did not answer in time"))?
            .map_err(store_error)?;
            let evicting = eviction::evicting(&policies);
            if evicting.is_empty() {
                return Ok(());
            }
            if !self.caller.watch_evictions.swap(true, Ordering::Relaxed) {
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
}

impl RedisStore {
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
            let backend = Arc::clone(&self.caller.backend);
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
}
