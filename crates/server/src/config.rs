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
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
pub const DEFAULT_REDIS_NAMESPACE: &str = "tollgate";
pub const DEFAULT_STORE_TIMEOUT_MS: u64 = 1_000;
/// Request paths read as axum and most routers read them: `/Users` is not `/users`, and `;`
/// is an ordinary character (`path_case = "sensitive"`, `path_params = "keep"`).
pub const DEFAULT_PATH_MATCHING: PathMatching = PathMatching {
    case: PathCase::Sensitive,
    params: PathParams::Keep,
};

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
    /// Bearer token for the data plane; with none, the data plane is open.
    pub data_token: Option<String>,
    pub body_bytes_max: u32,
    /// Longest `wait_ms` honoured; longer waits are cut to it.
    pub wait_ms_max: u64,
    /// Memory store: counters tracked at most (G7).
    pub keys_tracked_max: u64,
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
    /// Redis store: how long one operation may take before Redis counts as unreachable.
    pub store_timeout: Duration,
    /// Where to serve Envoy's rate limit service (gRPC); off when unset.
    pub grpc_listen: Option<SocketAddr>,
    /// envoyproxy/ratelimit's configuration: a YAML file, or a directory of them.
    pub envoy_config: Option<std::path::PathBuf>,
    /// How `/v1/check` reads request paths, and rule paths, before matching: as the router of
    /// the application asking reads them (case, `;` parameters).
    pub path_matching: PathMatching,
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
            .field("body_bytes_max", &self.body_bytes_max)
            .field("wait_ms_max", &self.wait_ms_max)
            .field("keys_tracked_max", &self.keys_tracked_max)
            .field("recover_on_start", &self.recover_on_start)
            .field("permit_secret", &self.permit_secret.map(|_| "<set>"))
            .field("shutdown_grace", &self.shutdown_grace)
            .field("redis_namespace", &self.redis_namespace)
            .field("store_fail_open", &self.store_fail_open)
            .field("store_timeout", &self.store_timeout)
            .field("grpc_listen", &self.grpc_listen)
            .field("envoy_config", &self.envoy_config)
            .field("path_matching", &self.path_matching)
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
