//! The server's resolved configuration. Every field is a decision made by whoever builds it
//! (the `tollgate` binary merges file, environment and flags); the defaults it falls back to
//! are the named constants here, so documentation and code cannot drift apart.

use std::net::SocketAddr;
use std::time::Duration;

use tollgate_rules::{PathCase, PathMatching, PathParams};

/// Loopback only unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
pub const DEFAULT_RULES_URL: &str = "sqlite://tollgate.db";
pub const DEFAULT_RELOAD_INTERVAL_MS: u64 = 2_000;
/// Reloads more often than this would only load the database.
pub const RELOAD_INTERVAL_MS_MIN: u64 = 50;
pub const DEFAULT_BODY_BYTES_MAX: u32 = 64 * 1024;
pub const DEFAULT_WAIT_MS_MAX: u64 = 60_000;
pub const DEFAULT_KEYS_TRACKED_MAX: u64 = 1_000_000;
/// Unless set, each limit may track this share of `keys_tracked_max` (a tenth: 100,000 keys
/// with the default cap), so that one flooded limit never fills the store, and only ten
/// flooded together reach its cap.
pub const KEYS_PER_LIMIT_SHARE: u64 = 10;
/// An hour: long enough for what vendors ask in `Retry-After` (seconds to minutes, an hourly
/// quota at most; a longer one is asked again when the pause ends, at the cost of one call), and
/// the most a data caller's pause, by mistake or malice, stops a limit before it ends by itself
/// (an administrator lifts it sooner: `DELETE /v1/limits/{name}/pause`).
pub const DEFAULT_PAUSE_MS_MAX: u64 = tollgate::DEFAULT_PAUSE_MS_MAX;
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
pub const DEFAULT_REDIS_NAMESPACE: &str = "tollgate";
pub const DEFAULT_STORE_TIMEOUT_MS: u64 = 1_000;
/// Request paths read as axum and most routers read them: `/Users` is not `/users`, and `;`
/// is an ordinary character (`path_case = "sensitive"`, `path_params = "keep"`).
pub const DEFAULT_PATH_MATCHING: PathMatching = PathMatching {
    case: PathCase::Sensitive,
    params: PathParams::Keep,
};

/// Off: a Redis whose `maxmemory-policy` may evict Tollgate's keys is refused at start.
pub const DEFAULT_REDIS_ALLOW_EVICTION: bool = false;
/// Asked at connect: the Redis module where Redis has it loaded, else the function library,
/// so a server starts on any Redis as it did before the module.
pub const DEFAULT_REDIS_MODULE: tollgate_redis::Module = tollgate_redis::Module::Auto;
/// Time a client gets to send a request's head once it connects or starts one, and again its
/// body: enough for any client on a private network, short enough that a socket which sends
/// half a request and holds is closed.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// An idle keep-alive connection is closed after this. Longer than the pool idle time of
/// every bundled client (the CLI 30 s, reqwest 90 s, httpx 5 s), so that none of them sends on
/// a connection the server is closing.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 120_000;
/// Open HTTP connections at most. The server lowers it to what its open-file limit
/// (RLIMIT_NOFILE) leaves after a reserve for stores, databases and the gRPC listener.
pub const DEFAULT_CONNECTIONS_MAX: usize = 4_096;
/// Acquires waiting for room at once, over every limit (the engine's default). The server
/// lowers it to half the connections it may hold, so a flood of waiters never takes the
/// connections that answer everything else.
pub const DEFAULT_WAITERS_MAX: usize = tollgate::DEFAULT_WAITERS_MAX;
/// Acquires waiting for room at once on any one limit, all its keys together (the engine's
/// default), so a flood on one limit leaves room for the waiters of the others.
pub const DEFAULT_WAITERS_PER_LIMIT_MAX: usize = tollgate::DEFAULT_WAITERS_PER_LIMIT_MAX;

/// Acquires of one scoped token waiting at once, over all its limits: a quarter of a limit's
/// line, so one token cannot fill the waiting lines of the limits outside its scope.
pub const DEFAULT_WAITERS_PER_TOKEN_MAX: usize = DEFAULT_WAITERS_PER_LIMIT_MAX / 4;

/// `/v1/forward-auth`: an IPv6 client counted by address is its /64 unless configured, as the
/// tower layer counts one (`tollgate_tower::DEFAULT_IPV6_PREFIX_LEN`).
pub const DEFAULT_FORWARD_AUTH_IPV6_PREFIX_LEN: u8 = tollgate_tower::DEFAULT_IPV6_PREFIX_LEN;

/// `/v1/forward-auth`: how many clients (an IPv4 address, an IPv6 client prefix) of one
/// network (an IPv4 /24, an IPv6 /48) have keys of their own at once; the network's further
/// clients share its one key. A /48 holds 65,536 /64s, more than half the default key budget
/// of a limit: uncapped, two of them would fill it.
pub const DEFAULT_FORWARD_AUTH_NETWORK_KEYS_MAX: u32 = 256;

/// How `/v1/check` and `/v1/forward-auth` read an encoded slash (`%2F`) in a request path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PathEncodedSlash {
    /// Both ways: a request is counted under every rule that the path as written (`%2F`
    /// inside its segment) or the path decoded (`%2F` and `%2E` as `/` and `.`, dot segments
    /// removed after decoding) matches, each rule once. WSGI and ASGI servers route on the
    /// decoded path, and nginx's `proxy_pass` with a URI sends it on decoded.
    #[default]
    Both,
    /// As written only: for an application whose router keeps `%2F` inside its segment (axum,
    /// as the tower layer reads it) behind a proxy that passes the path on as received.
    Segment,
}

impl PathEncodedSlash {
    /// `both` or `segment`.
    pub fn parse(text: &str) -> Result<PathEncodedSlash, String> {
        match text {
            "both" => Ok(PathEncodedSlash::Both),
            "segment" => Ok(PathEncodedSlash::Segment),
            other => Err(format!("must be \"both\" or \"segment\", got {other:?}")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PathEncodedSlash::Both => "both",
            PathEncodedSlash::Segment => "segment",
        }
    }
}

/// Where counters live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreChoice {
    /// In this process's memory: one server holds the quota.
    Memory,
    /// A Redis URL (one Redis, a cluster, or Sentinels), shared by every replica.
    Redis(String),
}

impl StoreChoice {
    /// `memory`, or a Redis URL: `redis://` / `rediss://` (one Redis), `redis-cluster://`
    /// (a Redis Cluster, by seed nodes) or `redis-sentinel://` (the master Sentinels name).
    pub fn parse(text: &str) -> Result<StoreChoice, String> {
        if text == "memory" {
            return Ok(StoreChoice::Memory);
        }
        if [
            "redis://",
            "rediss://",
            "redis-cluster://",
            "redis-sentinel://",
        ]
        .iter()
        .any(|scheme| text.starts_with(scheme))
        {
            return Ok(StoreChoice::Redis(text.to_owned()));
        }
        Err(format!(
            "{text:?} is not a store: use \"memory\", redis://HOST:PORT/DB, \
             redis-cluster://HOST:PORT[,HOST:PORT...] or \
             redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]"
        ))
    }
}

/// Everything `tollgate serve` needs.
#[derive(Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub store: StoreChoice,
    /// `sqlite://FILE`, `postgres://...` or `mysql://...`, or a read-only limits file,
    /// `file://limits.toml` (or `.yaml`).
    pub rules_url: String,
    /// The SQL database that remembers the stores across restarts (their runs, and the memory
    /// store's counters at a clean stop). Unset: the rules database, or with a limits file,
    /// `sqlite://tollgate.db`.
    pub state_url: Option<String>,
    pub rules_table: String,
    /// How often the rules table is re-read (PostgreSQL also notifies at once).
    pub reload_interval: Duration,
    /// Bearer token for `/v1/limits`; with none, the admin API answers 401.
    pub admin_token: Option<String>,
    /// Bearer token for the data plane; with none, the data plane is open. Required when
    /// `listen` is beyond loopback.
    pub data_token: Option<String>,
    /// Bearer token for `/metrics`; with none, `/metrics` is open to whoever reaches the
    /// listener (its text names every limit and what each counts).
    pub metrics_token: Option<String>,
    /// Origins (`scheme://host[:port]`) whose pages may call the API from a browser, answered
    /// with CORS headers. Besides them, only the server's own origin (its dashboard) may.
    pub allowed_origins: Vec<String>,
    /// Host names (`name` or `name:port`) the server answers to besides the loopback names,
    /// against DNS rebinding. Checked on a loopback listener always, on another when set.
    pub allowed_hosts: Vec<String>,
    /// Time a client gets to send a request's head, and then its body.
    pub header_read_timeout: Duration,
    /// An idle keep-alive connection is closed after this.
    pub idle_timeout: Duration,
    /// Open HTTP connections at most (lowered to what RLIMIT_NOFILE leaves).
    pub connections_max: usize,
    /// Acquires waiting at once, over every limit.
    pub waiters_max: usize,
    /// Acquires waiting at once on one limit.
    pub waiters_per_limit_max: usize,
    /// Acquires of one scoped token waiting at once.
    pub waiters_per_token_max: usize,
    pub body_bytes_max: u32,
    /// Longest `wait_ms` honoured; longer waits are cut to it.
    pub wait_ms_max: u64,
    /// Memory store: counters tracked at most (G7), over every limit: a bound on memory.
    pub keys_tracked_max: u64,
    /// Keys one limit counted per key may have counters of at once, unless its rule says
    /// (`keys_max`), on the memory store and on Redis. Unset: `keys_tracked_max /
    /// KEYS_PER_LIMIT_SHARE`.
    pub keys_per_limit_max: Option<u64>,
    /// Longest pause, in milliseconds (at most a day); longer asks are cut to it.
    pub pause_ms_max: u64,
    /// How far and how long what outbound clients teach (`POST /v1/learn`) may lower a limit:
    /// `learn_floor_percent`, `learn_ttl_ms`, `learn_raise_every_ms`.
    pub learn: tollgate::LearnConfig,
    /// The least share of each rate limit's period `normal` and `low` get while they wait
    /// (`min_share_normal_percent`, `min_share_low_percent`); off by default: strict priority.
    pub shares: tollgate::Shares,
    /// Memory store: after a start that finds the previous run did not stop cleanly, hold each
    /// limit it had until one period after that run was last known to grant (its heartbeat in
    /// the rules database), since units it granted may still count. A clean stop saves the
    /// counters and a start puts them back, whatever this says.
    pub recover_on_start: bool,
    /// Key for permit ids; replicas that accept each other's ids share it. Random if unset.
    pub permit_secret: Option<[u8; 16]>,
    /// After a shutdown signal, how long in-flight requests get to finish.
    pub shutdown_grace: Duration,
    /// Redis store: the namespace (hash tag) of every key; replicas sharing a quota share it.
    pub redis_namespace: String,
    /// Redis store: grant when Redis cannot be reached. Off: an unreachable store answers
    /// `store_unavailable` (G6); on, grants made meanwhile are counted by no limit.
    pub store_fail_open: bool,
    /// Redis store: start on a Redis whose `maxmemory-policy` may evict Tollgate's keys (any
    /// but `noeviction`). Off, such a Redis is refused at start and `/readyz` reports one that
    /// changes to it; on, every call watches Redis's evictions, and a counter missing after
    /// one is held as lost for a period (`docs/deployment.md`).
    pub redis_allow_eviction: bool,
    /// Redis store: whether acquires are decided by the Redis module (`tollgate-redis-module`):
    /// `auto` uses it when Redis has it loaded, `on` refuses to start on a Redis without it,
    /// `off` never uses it (`docs/deployment.md`).
    pub redis_module: tollgate_redis::Module,
    /// Redis store: how long one operation may take before Redis counts as unreachable.
    pub store_timeout: Duration,
    /// Where to serve Envoy's rate limit service (gRPC); off when unset.
    pub grpc_listen: Option<SocketAddr>,
    /// envoyproxy/ratelimit's configuration: a YAML file, or a directory of them.
    pub envoy_config: Option<std::path::PathBuf>,
    /// How `/v1/check` reads request paths, and rule paths, before matching: as the router of
    /// the application asking reads them (case, `;` parameters).
    pub path_matching: PathMatching,
    /// How `/v1/check` and `/v1/forward-auth` read `%2F` in a request path (the tower layer
    /// reads it as its own router does).
    pub path_encoded_slash: PathEncodedSlash,
    /// `/v1/forward-auth`: the proxy in front (`nginx`, `caddy`, `traefik`), which names the
    /// headers the original method and URI are read from; unset, `X-Forwarded-Method` and
    /// `X-Forwarded-Uri`. A request carrying one of these headers that the proxy does not
    /// set is refused.
    pub forward_auth_proxy: Option<String>,
    /// `/v1/forward-auth`: the header the original method is read from, instead of the
    /// proxy's.
    pub forward_auth_method_header: Option<String>,
    /// `/v1/forward-auth`: the header the original URI is read from, instead of the proxy's.
    pub forward_auth_uri_header: Option<String>,
    /// `/v1/forward-auth`: clients of one network (IPv4 /24, IPv6 /48) with keys of their own
    /// at once; further clients of that network share its key.
    pub forward_auth_network_keys_max: u32,
    /// `/v1/forward-auth`: the request header that names the user (set by the proxy, after
    /// its own authentication); without it, or when a request lacks it, the client's address.
    pub forward_auth_user_header: Option<String>,
    /// `/v1/forward-auth`: the proxies (`10.0.0.0/8`, `127.0.0.1`) whose `X-Forwarded-For` is
    /// believed; none by default, so the client is the proxy's own address until configured.
    pub forward_auth_trusted_proxies: Vec<String>,
    /// `/v1/forward-auth`: bits of an IPv6 client's address that name it (32 to 128).
    pub forward_auth_ipv6_prefix_len: u8,
    /// TLS on the HTTP and gRPC listeners: the certificate chain, PEM; with `tls_key`, or
    /// neither. Reloaded when it changes on disk.
    pub tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key, PEM.
    pub tls_key: Option<std::path::PathBuf>,
}

impl ServerConfig {
    /// Whether the rules come from a limits file rather than a SQL table.
    pub fn rules_from_file(&self) -> bool {
        self.rules_url.starts_with("file://")
    }

    /// Refuse what the server must not start with: a token that is empty (read one way it
    /// means "open", another "closed"), a data plane open beyond loopback, and origins or
    /// hosts that are not what a browser sends.
    pub fn check(&self) -> Result<(), crate::ServerError> {
        let refuse = |setting, reason: String| crate::ServerError::Setting { setting, reason };
        for (setting, token) in [
            ("admin_token (TOLLGATE_ADMIN_TOKEN)", &self.admin_token),
            ("data_token (TOLLGATE_DATA_TOKEN)", &self.data_token),
            (
                "metrics_token (TOLLGATE_METRICS_TOKEN)",
                &self.metrics_token,
            ),
        ] {
            if token
                .as_deref()
                .is_some_and(|token| token.trim().is_empty())
            {
                return Err(refuse(
                    setting,
                    "is empty; give a token, or leave the setting out entirely".into(),
                ));
            }
        }
        if self.data_token.is_none() && !self.listen.ip().to_canonical().is_loopback() {
            return Err(refuse(
                "data_token (TOLLGATE_DATA_TOKEN)",
                format!(
                    "is required to listen on {} (beyond loopback): without it anyone who \
                     reaches the port can drain or pause any limit; set one (e.g. `openssl \
                     rand -hex 24`) and give it to the clients, or listen on 127.0.0.1",
                    self.listen
                ),
            ));
        }
        for origin in &self.allowed_origins {
            crate::parse_origin(origin).map_err(|reason| refuse("allowed_origins", reason))?;
        }
        for host in &self.allowed_hosts {
            crate::parse_host(host).map_err(|reason| refuse("allowed_hosts", reason))?;
        }
        crate::forward::ForwardAuth::new(self)?;
        Ok(())
    }

    /// Keys one limit may have counters of at once (either store), unless its rule says
    /// otherwise.
    pub fn keys_per_limit_max(&self) -> u64 {
        self.keys_per_limit_max
            .unwrap_or(self.keys_tracked_max / KEYS_PER_LIMIT_SHARE)
            .max(1)
    }

    /// The database the server keeps its state in: `state_url`, or its default.
    pub fn state_url(&self) -> &str {
        match &self.state_url {
            Some(url) => url,
            None if self.rules_from_file() => DEFAULT_RULES_URL,
            None => &self.rules_url,
        }
    }
}

// Tokens and the permit secret stay out of logs.
impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("store", &redacted_store(&self.store))
            .field("rules_url", &tollgate_rules::redact(&self.rules_url))
            .field(
                "state_url",
                &self.state_url.as_deref().map(tollgate_rules::redact),
            )
            .field("rules_table", &self.rules_table)
            .field("reload_interval", &self.reload_interval)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("data_token", &self.data_token.as_ref().map(|_| "<set>"))
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<set>"),
            )
            .field("allowed_origins", &self.allowed_origins)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("connections_max", &self.connections_max)
            .field("waiters_max", &self.waiters_max)
            .field("waiters_per_limit_max", &self.waiters_per_limit_max)
            .field("waiters_per_token_max", &self.waiters_per_token_max)
            .field("body_bytes_max", &self.body_bytes_max)
            .field("wait_ms_max", &self.wait_ms_max)
            .field("keys_tracked_max", &self.keys_tracked_max)
            .field("keys_per_limit_max", &self.keys_per_limit_max())
            .field("pause_ms_max", &self.pause_ms_max)
            .field("learn", &self.learn)
            .field("shares", &self.shares)
            .field("recover_on_start", &self.recover_on_start)
            .field("permit_secret", &self.permit_secret.map(|_| "<set>"))
            .field("shutdown_grace", &self.shutdown_grace)
            .field("redis_namespace", &self.redis_namespace)
            .field("store_fail_open", &self.store_fail_open)
            .field("redis_allow_eviction", &self.redis_allow_eviction)
            .field("redis_module", &self.redis_module)
            .field("store_timeout", &self.store_timeout)
            .field("grpc_listen", &self.grpc_listen)
            .field("envoy_config", &self.envoy_config)
            .field("path_matching", &self.path_matching)
            .field("path_encoded_slash", &self.path_encoded_slash)
            .field("forward_auth_proxy", &self.forward_auth_proxy)
            .field(
                "forward_auth_method_header",
                &self.forward_auth_method_header,
            )
            .field("forward_auth_uri_header", &self.forward_auth_uri_header)
            .field(
                "forward_auth_network_keys_max",
                &self.forward_auth_network_keys_max,
            )
            .field("forward_auth_user_header", &self.forward_auth_user_header)
            .field(
                "forward_auth_trusted_proxies",
                &self.forward_auth_trusted_proxies,
            )
            .field(
                "forward_auth_ipv6_prefix_len",
                &self.forward_auth_ipv6_prefix_len,
            )
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .finish()
    }
}

/// A permit secret from 32 hex digits.
pub fn parse_permit_secret(text: &str) -> Result<[u8; 16], String> {
    let text = text.trim();
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("must be 32 hex digits (16 bytes), e.g. from `openssl rand -hex 16`".into());
    }
    let mut bytes = [0u8; 16];
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16)
            .map_err(|error| error.to_string())?;
    }
    Ok(bytes)
}

fn redacted_store(store: &StoreChoice) -> String {
    match store {
        StoreChoice::Memory => "memory".to_owned(),
        StoreChoice::Redis(url) => tollgate_rules::redact(url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_are_memory_or_a_redis_url_of_any_deployment() {
        assert_eq!(StoreChoice::parse("memory"), Ok(StoreChoice::Memory));
        for url in [
            "redis://127.0.0.1:6379/0",
            "rediss://cache:6380/",
            "redis-cluster://10.0.0.1:7000,10.0.0.2:7000",
            "redis-sentinel://10.0.0.1:26379/mymaster",
        ] {
            assert_eq!(StoreChoice::parse(url), Ok(StoreChoice::Redis(url.into())));
        }
        let refused = StoreChoice::parse("memcached://h:1").expect_err("not a store");
        assert!(refused.contains("redis-cluster://"), "{refused}");
        assert_eq!(
            redacted_store(&StoreChoice::Redis(
                "redis-cluster://:secret@h1:7000,h2:7000".into()
            )),
            "redis-cluster://:***@h1:7000,h2:7000"
        );
    }
}
