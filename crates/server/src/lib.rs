//! The Tollgate server: HTTP API v1 (admin and data plane), Prometheus metrics, health and
//! readiness, graceful shutdown. With the tower layer, one of the two crates that map the
//! engine's errors to HTTP status codes.
//!
//! [`run`] wires the parts: a store (memory, or later a shared one, behind `Arc<dyn Store>`),
//! a [`tollgate::Limiter`] over it, the rules (a SQL table or a limits file) feeding the
//! limiter, the SQL database that remembers the store across restarts, and the router.

pub mod admin_proof;
mod api;
mod config;
mod error;
mod extract;
mod forward;
mod guard;
mod history;
mod hot_keys;
mod learning;
mod listener;
mod metrics;
mod networks;
mod openapi;
mod runs;
mod state;
mod stats;
mod tls;
mod tokens;
mod ui;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{delete, get, post};
use tokio::sync::watch;
use tollgate::store::Store;
use tollgate::{
    Clock, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, MonotonicClock, PermitSecret,
};
use tollgate_rules::{FileSource, Rules, RulesSource, SourceError, SqlSource};

pub use config::{
    DEFAULT_BODY_BYTES_MAX, DEFAULT_CONNECTIONS_MAX, DEFAULT_FORWARD_AUTH_IPV6_PREFIX_LEN,
    DEFAULT_FORWARD_AUTH_NETWORK_KEYS_MAX, DEFAULT_HEADER_READ_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_KEYS_TRACKED_MAX, DEFAULT_LISTEN, DEFAULT_PATH_MATCHING, DEFAULT_PAUSE_MS_MAX,
    DEFAULT_REDIS_ALLOW_EVICTION, DEFAULT_REDIS_MODULE, DEFAULT_REDIS_NAMESPACE,
    DEFAULT_RELOAD_INTERVAL_MS, DEFAULT_RULES_URL, DEFAULT_SHUTDOWN_GRACE_MS,
    DEFAULT_STORE_TIMEOUT_MS, DEFAULT_WAIT_MS_MAX, DEFAULT_WAITERS_MAX,
    DEFAULT_WAITERS_PER_LIMIT_MAX, DEFAULT_WAITERS_PER_TOKEN_MAX, KEYS_PER_LIMIT_SHARE,
    PathEncodedSlash, RELOAD_INTERVAL_MS_MIN, ServerConfig, StoreChoice, parse_permit_secret,
};
pub use error::ApiError;
pub use guard::{parse_host, parse_origin};
pub use tls::{
    TLS_FILE_BYTES_MAX, TLS_HANDSHAKE_TIMEOUT, TLS_RELOAD_CHECK_INTERVAL, TlsAcceptor, TlsError,
    TlsFiles,
};
pub use tollgate_api::Code;
/// The `redis_module` setting's values (`auto`, `on`, `off`), as the Redis store reads them.
pub use tollgate_redis::Module as RedisModule;

use crate::metrics::{MeteredStore, Metrics};
use crate::state::AppState;

/// Idle memory-store counters examined per shard by each background sweep.
const SWEEP_PER_SHARD: usize = 64;
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("store {store}: {reason}")]
    Store { store: String, reason: String },
    #[error(transparent)]
    Rules(#[from] SourceError),
    #[error("listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("serve: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Envoy(#[from] tollgate_envoy::ConfigError),
    #[error(
        "grpc_listen is set, so envoy_config must name envoyproxy/ratelimit's YAML (a file or a directory)"
    )]
    EnvoyConfigMissing,
    #[error("grpc: {0}")]
    Grpc(String),
    /// A setting the server refuses to start with, and why.
    #[error("{setting}: {reason}")]
    Setting {
        setting: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// The memory store and the clock it decides on, which reads wall time, so that what a run
/// saves or records means the same to the next one. It writes its budgets ahead to the state
/// database (`runs.rs`).
type Memory = (Arc<MemoryStore>, Arc<dyn Clock>);

async fn build_store(
    config: &ServerConfig,
    rules: &SqlSource,
) -> Result<(Arc<dyn Store>, Option<Memory>), ServerError> {
    match &config.store {
        StoreChoice::Memory => {
            let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
            let store = Arc::new(MemoryStore::with_write_ahead(
                MemoryStoreConfig {
                    keys_tracked_max: config.keys_tracked_max,
                    keys_per_limit_max: config.keys_per_limit_max(),
                },
                clock.clone(),
            ));
            Ok((store.clone(), Some((store, clock))))
        }
        StoreChoice::Redis(url) => {
            if config.permit_secret.is_none() {
                tracing::warn!(
                    "no permit_secret is configured: permits granted by this replica cannot be \
                     committed through another; give every replica the same TOLLGATE_PERMIT_SECRET"
                );
            }
            let store = tollgate_redis::RedisStore::connect(tollgate_redis::RedisStoreConfig {
                url: url.clone(),
                namespace: config.redis_namespace.clone(),
                fail_open: config.store_fail_open,
                allow_eviction: config.redis_allow_eviction,
                module: config.redis_module,
                timeout: config.store_timeout,
                keys_per_limit_max: config.keys_per_limit_max(),
            })
            .await
            .map_err(|error| ServerError::Store {
                store: tollgate_rules::redact(url),
                // The store names its own field; the operator knows it as `redis_module`.
                reason: match error {
                    tollgate::Error::InvalidRequest {
                        field: "module",
                        reason,
                    } => format!("redis_module: {reason}"),
                    other => other.to_string(),
                },
            })?;
            tracing::info!(
                store = %tollgate_rules::redact(url),
                namespace = %config.redis_namespace,
                fail_open = config.store_fail_open,
                "redis store connected"
            );
            // A namespace this rules database never knew in use is new, not lost: nothing in
            // it was granted, so nothing is held. One it knew that comes back empty is a loss.
            let row = runs::redis_store(&config.redis_namespace);
            if rules.previous_run(&row).await?.is_none() {
                let fresh =
                    store
                        .begin_new_namespace()
                        .await
                        .map_err(|error| ServerError::Store {
                            store: tollgate_rules::redact(url),
                            reason: error.to_string(),
                        })?;
                if fresh {
                    tracing::info!(namespace = %config.redis_namespace, "new Redis namespace");
                }
                rules.begin_run(&row, 0).await?;
            }
            Ok((Arc::new(store), None))
        }
    }
}

/// The limiter every request is decided by, on `store`.
fn new_limiter(config: &ServerConfig, store: Arc<dyn Store>) -> Limiter {
    let permit_secret = match config.permit_secret {
        Some(bytes) => PermitSecret::from_bytes(bytes),
        None => PermitSecret::random(),
    };
    // Each waiting acquire holds a connection: at most half of them may wait, so the other
    // half always answers (`/healthz` included).
    let (connections_max, _) = listener::connections_max(config.connections_max);
    Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_millis(config.wait_ms_max),
            permit_secret,
            pause_max: Duration::from_millis(config.pause_ms_max),
            waiters_max: config.waiters_max.min(connections_max / 2),
            waiters_per_limit_max: config.waiters_per_limit_max,
            learn: config.learn,
            shares: config.shares,
        },
    )
}

/// API v1's router as `run` serves it, on a new memory store with the rules of `source`, but
/// without a listener, restart bookkeeping or background tasks: the API driven in-process, for
/// fuzzing.
#[doc(hidden)]
pub async fn memory_router(
    config: ServerConfig,
    source: RulesSource,
) -> Result<Router, ServerError> {
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let memory = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: config.keys_tracked_max,
            keys_per_limit_max: config.keys_per_limit_max(),
        },
        clock,
    ));
    let store_seconds = metrics::store_seconds_family();
    let metered: Arc<dyn Store> =
        Arc::new(MeteredStore::new(memory.clone(), store_seconds.clone()));
    let limiter = new_limiter(&config, metered);
    let tokens = Arc::new(
        tokens::Tokens::start(match &source {
            RulesSource::Sql(sql) => Some(sql.clone()),
            RulesSource::File(_) => None,
        })
        .await?,
    );
    let rules = Rules::start_with(source, limiter.clone(), config.path_matching).await?;
    let metrics = Metrics::new(rules.clone(), Some(memory), None, store_seconds, None);
    let forward_auth = forward::ForwardAuth::new(&config)?;
    // One server on its own memory store: nothing to share.
    let learning = learning::SharedLearning::none();
    Ok(router(AppState::new(
        config,
        limiter,
        rules,
        metrics,
        tokens,
        forward_auth,
        learning,
    )))
}

/// The memory store's run on a state database as `run` begins and ends it (restore or hold,
/// heartbeat, write-ahead writer), without a server around it: for the write-ahead bench.
#[doc(hidden)]
#[derive(Debug)]
pub struct BenchMemoryRun(runs::MemoryRun);

impl BenchMemoryRun {
    /// Begin a run of `memory` (made `with_write_ahead`) on the state database at
    /// `state_url`, with `limiter`'s limits in force.
    pub async fn begin(
        state_url: &str,
        memory: Arc<MemoryStore>,
        clock: Arc<dyn Clock>,
        limiter: &Limiter,
    ) -> Result<BenchMemoryRun, ServerError> {
        let state = SqlSource::connect(state_url, tollgate_rules::DEFAULT_TABLE).await?;
        let run = runs::MemoryRun::begin(state, memory, clock, limiter, Vec::new(), true).await?;
        Ok(BenchMemoryRun(run))
    }

    /// Transactions and counter records committed so far.
    pub fn written(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = self.0.stats();
        (stats.batches.load(Relaxed), stats.records.load(Relaxed))
    }

    /// The clean stop.
    pub async fn end(self) {
        self.0.end().await;
    }
}

/// The router, with every endpoint of API v1, the body limit and the error counter.
fn router(state: AppState) -> Router {
    let body_bytes_max = usize::try_from(state.config().body_bytes_max).unwrap_or(usize::MAX);
    let errors = state.metrics().errors.clone();
    let config = state.config();
    let guard = guard::Guard::new(
        is_loopback(config.listen),
        &config.allowed_origins,
        &config.allowed_hosts,
    );
    Router::new()
        .route("/v1/limits", get(api::admin::list_limits))
        .route(
            "/v1/limits/{name}",
            get(api::admin::get_limit)
                .put(api::admin::put_limit)
                .delete(api::admin::delete_limit),
        )
        .route("/v1/limits/{name}/pause", delete(api::admin::resume))
        .route("/v1/limits/{name}/usage", delete(api::admin::reset))
        .route("/v1/acquire", post(api::data::acquire))
        .route("/v1/permits/{permit}/commit", post(api::data::commit))
        .route("/v1/charge", post(api::data::charge))
        .route("/v1/permits/{permit}/renew", post(api::data::renew))
        .route("/v1/pause", post(api::data::pause))
        .route("/v1/learn", post(api::data::learn))
        .route("/v1/check", post(api::inbound::check))
        .route("/v1/forward-auth", get(forward::forward_auth))
        .route(
            "/v1/tokens",
            get(tokens::list_tokens).post(tokens::create_token),
        )
        .route("/v1/tokens/{name}", delete(tokens::delete_token))
        .route(admin_proof::ADMIN_PROOF_PATH, get(admin_proof::prove))
        .route("/v1/stats", get(stats::stats))
        .route("/metrics", get(api::ops::metrics))
        .route("/healthz", get(api::ops::healthz))
        .route("/readyz", get(api::ops::readyz))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/ui", get(ui::index))
        .route("/ui/{asset}", get(ui::asset))
        .fallback(api::ops::not_found)
        .method_not_allowed_fallback(api::ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_bytes_max))
        .layer(middleware::from_fn_with_state(guard, guard::guard))
        .layer(middleware::map_response_with_state(
            errors,
            metrics::count_errors,
        ))
        .with_state(state)
}

/// The OpenAPI document, as a server serves it at `/openapi.json`: `data_token` says whether
/// that server has a data token (without one, its data plane needs none).
pub fn openapi_document(data_token: bool) -> String {
    serde_json::to_string_pretty(&openapi::document(data_token)).unwrap_or_default()
}

/// Start the server and serve until `shutdown` resolves; then stop taking waits (waiting
/// acquirers get a clear error), let in-flight requests finish within `shutdown_grace`, and
/// return. `on_listening` is told the bound HTTP address, and the gRPC one when Envoy's service
/// is on (useful with port 0).
pub async fn run(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_listening: impl FnOnce(SocketAddr, Option<SocketAddr>),
) -> Result<(), ServerError> {
    let (_no_reloads, reloads) = tokio::sync::mpsc::unbounded_channel();
    run_with_reloads(config, shutdown, reloads, on_listening).await
}

/// `run`, and reload the rules (and the scoped tokens) at once each time `reloads` receives
/// what asked for it (`tollgate serve` sends "SIGHUP"), besides every `reload_interval`.
pub async fn run_with_reloads(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    mut reloads: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
    on_listening: impl FnOnce(SocketAddr, Option<SocketAddr>),
) -> Result<(), ServerError> {
    config.check()?;
    if let Some(address) = config.grpc_listen
        && !is_loopback(address)
    {
        tracing::warn!(
            %address,
            "the gRPC listener (Envoy's rate limit service) is beyond loopback and has no \
             credentials: whoever reaches it can spend any descriptor's limit; keep it on a \
             network only Envoy reaches"
        );
    }
    if config.metrics_token.is_none() && !is_loopback(config.listen) {
        tracing::warn!(
            address = %config.listen,
            "/metrics is open beyond loopback: whoever reaches the listener reads every limit's \
             name and use; set metrics_token (TOLLGATE_METRICS_TOKEN) and give it to the scraper"
        );
    }
    if config.admin_token.is_none() {
        tracing::warn!(
            "no admin token is configured: the admin API (/v1/limits) answers 401 to every \
             request; set TOLLGATE_ADMIN_TOKEN or admin_token in the config file"
        );
    }
    // TLS files are read and checked before anything else: a pair that cannot serve stops the
    // start.
    let tls = TlsFiles::open(config.tls_cert.as_deref(), config.tls_key.as_deref())?;
    // Envoy's configuration is checked first: a file envoyproxy/ratelimit would refuse stops
    // the start before anything listens.
    let envoy = match (&config.grpc_listen, &config.envoy_config) {
        (Some(address), Some(path)) => Some((*address, tollgate_envoy::ConfigWatch::load(path)?)),
        (Some(_), None) => return Err(ServerError::EnvoyConfigMissing),
        (None, _) => None,
    };
    // The state database is the rules database unless the rules come from a file or it is
    // configured apart.
    let state = SqlSource::connect(config.state_url(), &config.rules_table).await?;
    let source = if config.rules_from_file() {
        let file = FileSource::open(&config.rules_url)?;
        tracing::info!(
            rules = %file.path().display(),
            state = %tollgate_rules::redact(config.state_url()),
            "rules read from a limits file; the admin API cannot change them"
        );
        RulesSource::File(file)
    } else if config.state_url() == config.rules_url {
        tracing::info!(
            rules = %tollgate_rules::redact(&config.rules_url),
            table = %config.rules_table,
            "rules database ready"
        );
        RulesSource::Sql(state.clone())
    } else {
        RulesSource::Sql(SqlSource::connect(&config.rules_url, &config.rules_table).await?)
    };
    // Scoped data tokens are configuration, shared as the rules are: in the rules database,
    // so replicas that each keep a state database of their own accept the same tokens; with a
    // limits file, in the state database.
    let tokens = Arc::new(
        tokens::Tokens::start(Some(match &source {
            RulesSource::Sql(rules) => rules.clone(),
            RulesSource::File(_) => state.clone(),
        }))
        .await?,
    );
    let (store, memory) = build_store(&config, &state).await?;
    let store_seconds = metrics::store_seconds_family();
    let metered: Arc<dyn Store> = Arc::new(MeteredStore::new(store.clone(), store_seconds.clone()));
    let limiter = new_limiter(&config, metered);
    let learning = learning::SharedLearning::start(&store, &limiter);
    let rules = Rules::start_with(source, limiter.clone(), config.path_matching).await?;
    let memory_run = match &memory {
        Some((memory, clock)) => Some(
            runs::MemoryRun::begin(
                state,
                memory.clone(),
                clock.clone(),
                &limiter,
                envoy
                    .as_ref()
                    .map(|(_, watch)| envoy_limits(watch))
                    .unwrap_or_default(),
                config.recover_on_start,
            )
            .await?,
        ),
        None => None,
    };
    let counted = memory.as_ref().map(|(memory, _)| Arc::clone(memory));
    let (stop_sender, stop) = watch::channel(false);
    // One budget of connections for both listeners: a flood on one cannot take the
    // descriptors the other answers with.
    let (connections_max, open_files_max) = listener::connections_max(config.connections_max);
    let connections = listener::Registry::new(listener::Bounds {
        header_read_timeout: config.header_read_timeout,
        idle_timeout: config.idle_timeout,
        connections_max,
    });
    // Stopped once both listeners have drained, so their timeouts hold while they do.
    let (sweeper_stop, sweeper_stopped) = watch::channel(false);
    let connection_sweeper = connections.spawn_sweeper(sweeper_stopped);
    let envoy = match envoy {
        Some((address, watch)) => {
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|source| ServerError::Listen { address, source })?;
            let bound = listener
                .local_addr()
                .map_err(|source| ServerError::Listen { address, source })?;
            let service = tollgate_envoy::EnvoyService::new(
                limiter.store().clone(),
                watch.clone(),
                config.store_fail_open,
            );
            let watcher = watch.spawn_watcher(stop.clone());
            let mut grpc_stop = stop.clone();
            let grpc_stopped = async move {
                let _ = grpc_stop.wait_for(|stop| *stop).await;
            };
            // gRPC is HTTP/2: the only protocol offered.
            let grpc_tls = match &tls {
                Some(files) => Some(files.acceptor(&[b"h2"])?),
                None => None,
            };
            let routes = tollgate_envoy::routes(service).await.into_axum_router();
            let grpc = tokio::spawn(listener::serve(
                listener,
                listener::Protocol::Grpc(routes),
                connections.clone(),
                grpc_tls,
                grpc_stopped,
            ));
            tracing::info!(address = %bound, domains = watch.current().domains().count(), tls = tls.is_some(), "envoy rate limit service listening (gRPC)");
            Some((watch, watcher, grpc, bound))
        }
        None => None,
    };
    let metrics = Metrics::new(
        rules.clone(),
        counted,
        memory_run.as_ref().map(runs::MemoryRun::stats),
        store_seconds,
        envoy.as_ref().map(|(watch, ..)| watch.clone()),
    );
    let reloader = rules.spawn_reloader(config.reload_interval, stop.clone());
    let tokens_reloader = tokens.spawn_reloader(config.reload_interval, stop.clone());
    let asked_reloader = {
        let (rules, tokens) = (rules.clone(), tokens.clone());
        let mut stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let asker = tokio::select! {
                    asker = reloads.recv() => match asker {
                        Some(asker) => asker,
                        None => break,
                    },
                    _ = stop.changed() => break,
                };
                match rules.reload().await {
                    Ok(rules) => tracing::info!(
                        asked_by = asker,
                        version = rules.version(),
                        limits = rules.len(),
                        rejected = rules.rejected().len(),
                        "rules reloaded"
                    ),
                    Err(error) => tracing::warn!(
                        asked_by = asker,
                        %error,
                        "rules reload failed; the previous rules stay in force"
                    ),
                }
                if let Err(error) = tokens.reload().await {
                    tracing::warn!(asked_by = asker, %error, "scoped tokens reload failed");
                }
            }
        })
    };
    let sweeper = memory.map(|(memory, _)| spawn_sweeper(memory, stop.clone()));
    let tls_watcher = tls.as_ref().map(|files| files.spawn_watcher(stop.clone()));
    let listen = config.listen;
    let shutdown_grace = config.shutdown_grace;
    if let Some(files) = open_files_max {
        tracing::warn!(
            connections_max,
            configured = config.connections_max,
            open_files_max = files,
            "connections_max lowered to what the open-file limit (RLIMIT_NOFILE) leaves after a \
             reserve for stores and databases; raise the limit (ulimit -n, LimitNOFILE=) to \
             hold more"
        );
    }
    tracing::info!(
        connections_max,
        waiters_max = limiter.config().waiters_max,
        waiters_per_limit_max = limiter.config().waiters_per_limit_max,
        waiters_per_token_max = config.waiters_per_token_max,
        "bounds in force"
    );
    let grpc_address = envoy.as_ref().map(|(.., bound)| *bound);
    let forward_auth = forward::ForwardAuth::new(&config)?;
    let state = AppState::new(
        config,
        limiter,
        rules,
        metrics,
        tokens,
        forward_auth,
        learning,
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServerError::Listen {
            address: listen,
            source,
        })?;
    let address = listener
        .local_addr()
        .map_err(|source| ServerError::Listen {
            address: listen,
            source,
        })?;
    tracing::info!(%address, tls = tls.is_some(), "listening");
    state.set_listening(address);
    on_listening(address, grpc_address);

    let (draining_sender, mut draining) = watch::channel(false);
    let signal_state = state.clone();
    let graceful = async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
        signal_state.begin_shutdown();
        let _ = draining_sender.send(true);
    };
    // The API is served over HTTP/1.1 only.
    let http_tls = match &tls {
        Some(files) => Some(files.acceptor(&[b"http/1.1"])?),
        None => None,
    };
    let sampler = {
        let state = state.clone();
        spawn_every(history::STEP, stop.clone(), move || {
            let state = state.clone();
            async move { stats::sample(&state).await }
        })
    };
    let serve = async move {
        listener::serve(
            listener,
            listener::Protocol::Http1(router(state)),
            connections,
            http_tls,
            graceful,
        )
        .await
        .map_err(ServerError::Serve)
    };
    let served = tokio::select! {
        served = serve => served,
        () = async {
            let _ = draining.wait_for(|draining| *draining).await;
            tokio::time::sleep(shutdown_grace).await;
        } => {
            tracing::warn!(?shutdown_grace, "requests still in flight after the grace period; stopping");
            Ok(())
        }
    };
    let _ = stop_sender.send(true);
    let _ = sampler.await;
    let _ = reloader.await;
    let _ = tokens_reloader.await;
    asked_reloader.abort();
    if let Some((_, watcher, grpc, _)) = envoy {
        let _ = watcher.await;
        match grpc.await {
            Ok(Err(error)) => tracing::warn!(%error, "the gRPC listener stopped with an error"),
            Err(error) => tracing::warn!(%error, "the gRPC server task failed"),
            Ok(Ok(())) => {}
        }
    }
    let _ = sweeper_stop.send(true);
    let _ = connection_sweeper.await;
    if let Some(sweeper) = sweeper {
        let _ = sweeper.await;
    }
    if let Some(tls_watcher) = tls_watcher {
        let _ = tls_watcher.await;
    }
    // Nothing decides any more: what the memory store counts is final.
    if let Some(memory_run) = memory_run {
        memory_run.end().await;
    }
    tracing::info!("stopped");
    served
}

/// Whether `address` can be reached from this host alone.
fn is_loopback(address: SocketAddr) -> bool {
    address.ip().to_canonical().is_loopback()
}

/// Envoy's counters as limits of the memory store, so that a restart restores or holds them as
/// it does the rules' own.
fn envoy_limits(watch: &tollgate_envoy::ConfigWatch) -> Vec<tollgate::Limit> {
    watch
        .current()
        .counters()
        .into_iter()
        .filter_map(|(name, policy)| tollgate::Limit::new(&name, policy, Some("descriptor")).ok())
        .collect()
}

/// Reclaim idle counters when traffic is too low to do it in passing.
fn spawn_sweeper(
    memory: Arc<MemoryStore>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    spawn_every(SWEEP_INTERVAL, stop, move || {
        memory.sweep(SWEEP_PER_SHARD);
        std::future::ready(())
    })
}

/// Run `tick` every `interval`, the first time one interval from now, until `stop` turns true:
/// the server's background chores (sweeping idle counters, reloading tokens, watching the TLS
/// files). A tick that runs late delays the next rather than bunching them.
pub(crate) fn spawn_every<Tick, Ticked>(
    interval: Duration,
    mut stop: watch::Receiver<bool>,
    mut tick: Tick,
) -> tokio::task::JoinHandle<()>
where
    Tick: FnMut() -> Ticked + Send + 'static,
    Ticked: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // An interval's first tick is at once.
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = stop.changed() => {}
                _ = ticker.tick() => {}
            }
            if *stop.borrow() {
                break;
            }
            tick().await;
        }
    })
}

/// What a capacity denial's message says of units left but kept by a limit's `reserve`:
/// the words the commands look for to say the limit is not used up.
pub const KEPT_FOR_HIGHER_PRIORITY: &str = "kept for higher priority";

/// A duration as people read it, to the second above a minute ("23 h 26 min 15 s",
/// "1.5 s", "250 ms"), for messages and logs.
pub fn human_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1_000 {
        return format!("{ms} ms");
    }
    if ms < 60_000 {
        let tenths = ms.div_ceil(100);
        return match tenths % 10 {
            0 => format!("{} s", tenths / 10),
            rest => format!("{}.{rest} s", tenths / 10),
        };
    }
    let seconds = ms.div_ceil(1_000);
    let parts = [
        (seconds / 86_400, "d"),
        (seconds / 3_600 % 24, "h"),
        (seconds / 60 % 60, "min"),
        (seconds % 60, "s"),
    ];
    let words: Vec<String> = parts
        .iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, unit)| format!("{count} {unit}"))
        .collect();
    words.join(" ")
}
