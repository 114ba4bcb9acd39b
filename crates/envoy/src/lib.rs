//! Envoy's global rate limit service over Tollgate's stores: `ShouldRateLimit`
//! (`envoy.service.ratelimit.v3.RateLimitService`, from Envoy's own protos in `envoy-types`)
//! and `grpc.health.v1.Health`, configured by envoyproxy/ratelimit's YAML (`config`), which is
//! re-read when it changes (`ConfigWatch`).
//!
//! A request is decided as envoyproxy/ratelimit decides it (which limit each descriptor finds,
//! fixed windows of the unit counted from the Unix epoch, `hits_addend` 0 meaning 1, one status
//! per descriptor), with Tollgate's guarantees on top: the limited descriptors of a request are
//! taken all or nothing in one store decision (an `OVER_LIMIT` request counts no hit anywhere),
//! on the store's clock, and a store that cannot answer refuses (`OVER_LIMIT`) unless the server
//! is configured to fail open. Shadow-mode descriptors are counted only when the request is
//! allowed, and never refuse it.

pub mod config;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tokio::sync::watch;
use tollgate::store::{Ask, CounterId, CounterOutcome, Store, Take};
use tollgate::{COUNTERS_PER_REQUEST_MAX, Priority};
use tonic::{Request, Response, Status};

pub use config::{Answers, Config, ConfigError, LimitSpec, Unit};

/// Longest counter key a descriptor's entries may make, in bytes: the longest key a store
/// keeps.
pub const DESCRIPTOR_BYTES_MAX: usize = tollgate::KEY_BYTES_MAX;
/// How often the configuration's files are read to see whether they changed.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Counts for metrics, read at scrape time.
#[derive(Debug, Default)]
pub struct EnvoyStats {
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
    /// `ShouldRateLimit` answers, by overall code.
    pub answered_ok: AtomicU64,
    pub answered_over_limit: AtomicU64,
    /// Requests decided without the store, because it could not answer.
    pub store_failures: AtomicU64,
}

/// The configuration in force, and where it is read from.
#[derive(Debug)]
pub struct ConfigWatch {
    path: PathBuf,
    current: ArcSwap<Config>,
    /// The files as they were just before the configuration in force was read from them.
    seen: std::sync::Mutex<Fingerprint>,
    stats: EnvoyStats,
    /// Why the last read of the files was refused; `None` once one succeeds.
    last_error: std::sync::Mutex<Option<String>>,
}

type Fingerprint = Vec<(PathBuf, Option<Vec<u8>>)>;

/// What the files of a configuration hold: a change here is a change to read. Contents, not
/// times: two writes within one tick of the file system's clock can leave the same time and
/// size, and configuration files are small.
fn fingerprint(path: &Path) -> Fingerprint {
    let entries: Vec<PathBuf> = match std::fs::read_dir(path) {
        Ok(entries) => entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .collect(),
        Err(_) => vec![path.to_owned()],
    };
    let mut prints: Fingerprint = entries
        .into_iter()
        .map(|file| {
            let content = std::fs::read(&file).ok();
            (file, content)
        })
        .collect();
    prints.sort();
    prints
}

impl ConfigWatch {
    /// Read the configuration at `path` (a file, or a directory of `*.yaml`/`*.yml` files).
    pub fn load(path: &Path) -> Result<Arc<ConfigWatch>, ConfigError> {
        // Taken before reading: an edit made while reading is seen as a change, and read again.
        let seen = fingerprint(path);
        let config = Config::load(path)?;
        Ok(Arc::new(ConfigWatch {
            path: path.to_owned(),
            current: ArcSwap::from_pointee(config),
            seen: std::sync::Mutex::new(seen),
            stats: EnvoyStats::default(),
            last_error: std::sync::Mutex::default(),
        }))
    }

    /// A configuration given whole, never re-read (for tests and embedding).
    pub fn fixed(config: Config) -> Arc<ConfigWatch> {
        Arc::new(ConfigWatch {
            path: PathBuf::new(),
            current: ArcSwap::from_pointee(config),
            seen: std::sync::Mutex::new(Vec::new()),
            stats: EnvoyStats::default(),
            last_error: std::sync::Mutex::default(),
        })
    }

    pub fn current(&self) -> Arc<Config> {
        self.current.load_full()
    }

    pub fn stats(&self) -> &EnvoyStats {
        &self.stats
    }

    /// The file or directory the configuration is read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the last edit was refused, while the configuration before it stays in force.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn set_last_error(&self, error: Option<String>) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = error;
    }

    /// Look at the files every `WATCH_INTERVAL` until `stop` turns true; when they changed,
    /// read them, and put them in force if valid. An invalid edit is logged and counted, and
    /// the configuration in force stays.
    pub fn spawn_watcher(
        self: &Arc<Self>,
        mut stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let watch = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(WATCH_INTERVAL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = stop.changed() => {}
                }
                if *stop.borrow() {
                    break;
                }
                let now = fingerprint(&watch.path);
                {
                    let mut seen = match watch.seen.lock() {
                        Ok(seen) => seen,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                    if *seen == now {
                        continue;
                    }
                    *seen = now;
                }
                match Config::load(&watch.path) {
                    Ok(config) => {
                        watch.current.store(Arc::new(config));
                        watch.set_last_error(None);
                        watch.stats.reloads_ok.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(path = %watch.path.display(), "envoy configuration reloaded");
                    }
                    Err(error) => {
                        watch.stats.reloads_failed.fetch_add(1, Ordering::Relaxed);
                        watch.set_last_error(Some(error.to_string()));
                        tracing::warn!(%error, "envoy configuration refused; the previous one stays in force");
                    }
                }
            }
        })
    }
}

/// `ShouldRateLimit` over a store.
#[derive(Debug, Clone)]
pub struct EnvoyService {
    store: Arc<dyn Store>,
    config: Arc<ConfigWatch>,
    fail_open: bool,
}

/// What one descriptor of a request found.
enum Applies<'c> {
    /// No limit (no match, replaced, or a request deeper than the configuration).
    Nothing,
    Unlimited(&'c LimitSpec),
    /// A limit of 0: refuses without counting.
    Zero(&'c LimitSpec),
    /// A limit counted on the counter `key` of its `counter`.
    Counted {
        spec: &'c LimitSpec,
        key: String,
    },
}

/// The counter key of a descriptor: its entries, each length-prefixed so that no two
/// descriptors share a key by accident of their punctuation; a `share_threshold` wildcard
/// stands for the values it matches.
fn descriptor_key(entries: &[(&str, &str)], shared: &[Option<&str>]) -> String {
    let mut key = String::new();
    for (index, (name, value)) in entries.iter().enumerate() {
        let value = shared.get(index).copied().flatten().unwrap_or(value);
        push_text(&mut key, name);
        push_text(&mut key, value);
    }
    key
}

/// `text`, length-prefixed. A store key holds no control character, so one (a tab in a header's
/// value) is written `\u{9}`, and `\` as `\\`, which keeps every text apart; text without
/// either is written as it is.
fn push_text(key: &mut String, text: &str) {
    if !text.contains(|c: char| c.is_control() || c == '\\') {
        key.push_str(&format!("{}:{text}", text.len()));
        return;
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            c if c.is_control() => escaped.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => escaped.push(c),
        }
    }
    key.push_str(&format!("{}:{escaped}", escaped.len()));
}

fn proto_duration(micros: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(micros / 1_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(micros % 1_000_000 * 1_000).unwrap_or(0),
    }
}

fn current_limit(spec: &LimitSpec) -> RateLimit {
    let unit = match spec.unit {
        Some(Unit::Second) => rate_limit::Unit::Second,
        Some(Unit::Minute) => rate_limit::Unit::Minute,
        Some(Unit::Hour) => rate_limit::Unit::Hour,
        Some(Unit::Day) => rate_limit::Unit::Day,
        Some(Unit::Week) => rate_limit::Unit::Week,
        Some(Unit::Month) => rate_limit::Unit::Month,
        Some(Unit::Year) => rate_limit::Unit::Year,
        None => rate_limit::Unit::Unknown,
    };
    RateLimit {
        name: spec.name.clone(),
        requests_per_unit: spec.requests_per_unit,
        unit: unit as i32,
    }
}

/// The status of a descriptor with a limit; the window's end is aligned to the unit from the
/// Unix epoch, as the store's fixed window is.
fn limited_status(spec: &LimitSpec, code: Code, remaining: u64, now_us: u64) -> DescriptorStatus {
    let unit_us = spec
        .unit
        .map_or(1_000_000, |unit| unit.seconds() * 1_000_000);
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(current_limit(spec)),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(proto_duration(unit_us - now_us % unit_us)),
        ..DescriptorStatus::default()
    }
}

fn plain_status(remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        limit_remaining: remaining,
        ..DescriptorStatus::default()
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

impl EnvoyService {
    /// `fail_open`: when the store cannot be reached, allow (`OK`) rather than refuse. Any
    /// other failure (a full key cap, a store that answered with a failure) refuses.
    pub fn new(store: Arc<dyn Store>, config: Arc<ConfigWatch>, fail_open: bool) -> EnvoyService {
        EnvoyService {
            store,
            config,
            fail_open,
        }
    }

    /// Decide one request.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        if request.domain.is_empty() {
            return Err(Status::invalid_argument("domain: must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(Status::invalid_argument("descriptors: must not be empty"));
        }
        let hits = u64::from(request.hits_addend.max(1));
        let config = self.config.current();
        let mut applies = Vec::with_capacity(request.descriptors.len());
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let entries: Vec<(&str, &str)> = descriptor
                .entries
                .iter()
                .map(|entry| (entry.key.as_str(), entry.value.as_str()))
                .collect();
            let applied = match config.find(&request.domain, &entries) {
                None => Applies::Nothing,
                Some(found) if found.limit.unlimited => Applies::Unlimited(found.limit),
                Some(found) if found.limit.policy.is_none() => Applies::Zero(found.limit),
                Some(found) => {
                    let key = descriptor_key(&entries, &found.shared);
                    if key.len() > DESCRIPTOR_BYTES_MAX {
                        return Err(Status::invalid_argument(format!(
                            "descriptors[{index}]: its entries make a key of {} bytes; at most {DESCRIPTOR_BYTES_MAX}",
                            key.len()
                        )));
                    }
                    Applies::Counted {
                        spec: found.limit,
                        key,
                    }
                }
            };
            applies.push(applied);
        }
        // A limit named in another matched limit's `replaces` (unlimited ones included) does not
        // apply.
        let replaced: Vec<&str> = applies
            .iter()
            .filter_map(|applied| match applied {
                Applies::Counted { spec, .. } | Applies::Zero(spec) | Applies::Unlimited(spec) => {
                    Some(spec)
                }
                Applies::Nothing => None,
            })
            .flat_map(|spec| spec.replaces.iter().map(String::as_str))
            .collect();
        for applied in &mut applies {
            if let Applies::Counted { spec, .. } | Applies::Zero(spec) = applied
                && !spec.name.is_empty()
                && replaced.contains(&spec.name.as_str())
            {
                *applied = Applies::Nothing;
            }
        }
        let response = self.count(&applies, hits).await?;
        let counter = if response.overall_code == Code::OverLimit as i32 {
            &self.config.stats.answered_over_limit
        } else {
            &self.config.stats.answered_ok
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(response)
    }

    /// Take `hits` on every enforced counter at once, then on the shadow-mode ones.
    async fn count(&self, applies: &[Applies<'_>], hits: u64) -> Result<RateLimitResponse, Status> {
        // The enforced counters, each once (two descriptors that make one counter count once).
        let mut places: HashMap<(&str, &str), usize> = HashMap::new();
        let mut enforced: Vec<(&LimitSpec, &str)> = Vec::new();
        let mut zero = false;
        for applied in applies {
            match applied {
                Applies::Counted { spec, key } if !spec.shadow_mode => {
                    places
                        .entry((spec.counter.as_str(), key.as_str()))
                        .or_insert_with(|| {
                            enforced.push((spec, key.as_str()));
                            enforced.len() - 1
                        });
                }
                Applies::Zero(spec) if !spec.shadow_mode => zero = true,
                _ => {}
            }
        }
        if enforced.len() > COUNTERS_PER_REQUEST_MAX {
            return Err(Status::invalid_argument(format!(
                "descriptors: {} of them have limits; one request may be decided on at most {COUNTERS_PER_REQUEST_MAX}",
                enforced.len()
            )));
        }
        let takes: Vec<Take<'_>> = enforced
            .iter()
            .filter_map(|(spec, key)| {
                Some(Take {
                    counter: CounterId {
                        limit: &spec.counter,
                        key: Some(key),
                    },
                    policy: spec.policy.as_ref()?,
                })
            })
            .collect();
        // Per enforced counter: granted (and what remains), or not.
        let mut outcomes: Vec<(Code, u64)> = vec![(Code::Ok, 0); takes.len()];
        // More hits than a counter can ever grant are over its limit, as envoyproxy/ratelimit
        // answers; the store would refuse them as an invalid request, not decide them.
        let beyond: Vec<bool> = takes
            .iter()
            .map(|take| hits > take.policy.capacity_for(Priority::Normal))
            .collect();
        let refused = zero || beyond.contains(&true);
        let mut now = now_us();
        let mut allowed = !refused;
        if !takes.is_empty() && !refused {
            match self
                .store
                .acquire(Ask::new(&takes, hits, Priority::Normal))
                .await
            {
                Ok(decision) => {
                    now = decision.now_us;
                    allowed = decision.is_granted();
                    for (slot, outcome) in outcomes.iter_mut().zip(decision.outcomes()) {
                        *slot = match outcome {
                            CounterOutcome::Granted(grant) => (Code::Ok, grant.remaining),
                            CounterOutcome::Allowed { remaining } => (Code::Ok, *remaining),
                            CounterOutcome::Denied(_) => (Code::OverLimit, 0),
                        };
                    }
                }
                Err(error) => {
                    self.config
                        .stats
                        .store_failures
                        .fetch_add(1, Ordering::Relaxed);
                    // Only a store that cannot be reached fails open: a full key cap or a
                    // store that answered with a failure (out of memory) is something a
                    // caller can bring about, so it refuses.
                    let open = self.fail_open && error.fails_open();
                    tracing::warn!(%error, fail_open = open, "the store did not decide an envoy request");
                    allowed = open;
                    let code = if open { Code::Ok } else { Code::OverLimit };
                    outcomes.iter_mut().for_each(|slot| *slot = (code, 0));
                }
            }
        } else if refused {
            // Refused whatever the counters hold: what they hold is still shown, uncounted.
            for ((slot, take), beyond) in outcomes.iter_mut().zip(&takes).zip(&beyond) {
                if *beyond {
                    *slot = (Code::OverLimit, 0);
                    continue;
                }
                let remaining = match self.store.usage(*take).await {
                    Ok(usage) => take.policy.capacity().saturating_sub(usage.used),
                    Err(_) => 0,
                };
                *slot = (Code::Ok, remaining);
            }
        }
        let mut statuses = Vec::with_capacity(applies.len());
        for applied in applies {
            let status = match applied {
                Applies::Nothing => plain_status(0),
                Applies::Unlimited(_) => plain_status(u32::MAX),
                Applies::Zero(spec) => {
                    let code = if spec.shadow_mode {
                        Code::Ok
                    } else {
                        Code::OverLimit
                    };
                    limited_status(spec, code, 0, now)
                }
                Applies::Counted { spec, key } if !spec.shadow_mode => {
                    let place = places[&(spec.counter.as_str(), key.as_str())];
                    let (code, remaining) = outcomes[place];
                    limited_status(spec, code, remaining, now)
                }
                Applies::Counted { spec, key } => self.shadow(spec, key, hits, allowed, now).await,
            };
            if let Applies::Counted { spec, .. } | Applies::Zero(spec) | Applies::Unlimited(spec) =
                applied
            {
                let answers = &spec.answers;
                if status.code == Code::OverLimit as i32 {
                    answers.over_limit.fetch_add(1, Ordering::Relaxed);
                } else {
                    answers.ok.fetch_add(1, Ordering::Relaxed);
                }
            }
            statuses.push(status);
        }
        Ok(RateLimitResponse {
            overall_code: if allowed { Code::Ok } else { Code::OverLimit } as i32,
            statuses,
            ..RateLimitResponse::default()
        })
    }

    /// A shadow-mode descriptor: counted when the request is allowed, and always `OK`.
    async fn shadow(
        &self,
        spec: &LimitSpec,
        key: &str,
        hits: u64,
        allowed: bool,
        now: u64,
    ) -> DescriptorStatus {
        let Some(policy) = spec.policy.as_ref() else {
            return limited_status(spec, Code::Ok, 0, now);
        };
        let take = Take {
            counter: CounterId {
                limit: &spec.counter,
                key: Some(key),
            },
            policy,
        };
        let remaining = if allowed {
            match self
                .store
                .acquire(Ask::new(&[take], hits, Priority::Normal))
                .await
            {
                Ok(decision) => match decision.outcomes().first() {
                    Some(CounterOutcome::Granted(grant)) => grant.remaining,
                    _ => {
                        tracing::info!(limit = %spec.name, "shadow-mode limit over its limit");
                        0
                    }
                },
                Err(_) => 0,
            }
        } else {
            match self.store.usage(take).await {
                Ok(usage) => policy.capacity().saturating_sub(usage.used),
                Err(_) => 0,
            }
        };
        limited_status(spec, Code::Ok, remaining, now)
    }
}

#[tonic::async_trait]
impl RateLimitService for EnvoyService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

/// The services `serve` answers: health (`SERVING`, the service and the server as a whole)
/// and `ShouldRateLimit`. A server that owns its connections (their cap, timeouts and TLS)
/// serves these itself, over HTTP/2.
pub async fn routes(service: EnvoyService) -> tonic::service::Routes {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<EnvoyService>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tonic::service::Routes::new(health).add_service(RateLimitServiceServer::new(service))
}

/// Serve `ShouldRateLimit` and `grpc.health.v1.Health` (`SERVING`, the service and the server
/// as a whole) on `listener` until `shutdown` resolves, with tonic's own connection handling
/// (no cap, no timeouts): for tests and embedding behind something that bounds connections.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: EnvoyService,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_routes(routes(service).await)
        .serve_with_incoming_shutdown(
            // Answers are small and many are in flight: Nagle's algorithm would hold them back.
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
