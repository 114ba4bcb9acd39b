//! What the Redis store's tests share, the fleet tests in `crates/fleet` included: connecting to
//! the test Redis, or saying loudly why not.

#![allow(dead_code)]

use std::time::Duration;

use tollgate_redis::{RedisStore, RedisStoreConfig};

pub fn redis_url(test: &str) -> Option<String> {
    match std::env::var("TOLLGATE_TEST_REDIS") {
        Ok(url) => Some(url),
        Err(_) => {
            tollgate::conformance::skipped(&format!(
                "{test}: TOLLGATE_TEST_REDIS is unset, so it did not run against Redis"
            ));
            None
        }
    }
}

/// A namespace no other test or run uses.
pub fn namespace(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.subsec_nanos())
        .unwrap_or(0);
    let short: String = test
        .chars()
        .filter(|c| c.is_ascii_lowercase() || *c == '_')
        .take(40)
        .collect();
    format!("t-{short}-{}-{nanos}", std::process::id())
}

pub async fn connect(url: &str, namespace: &str) -> RedisStore {
    RedisStore::connect(RedisStoreConfig {
        url: url.to_owned(),
        namespace: namespace.to_owned(),
        fail_open: false,
        allow_eviction: false,
        module: tollgate_redis::Module::Auto,
        timeout: Duration::from_secs(5),
        keys_per_limit_max: 100_000,
    })
    .await
    .expect("connect to Redis")
}

/// Mark a namespace as new rather than lost: a test that is not about store loss should not
/// wait out the recovery period a fresh generation imposes (G6). What the server does for a
/// namespace its rules database never knew.
pub async fn declare_fresh(url: &str, namespace: &str) {
    connect(url, namespace)
        .await
        .begin_new_namespace()
        .await
        .expect("declare the namespace new");
}

/// A limiter on `store`, waiting at most 10 s, with a secret of its own.
pub fn limiter_on(store: std::sync::Arc<RedisStore>) -> tollgate::Limiter {
    tollgate::Limiter::new(
        store,
        tollgate::LimiterConfig {
            wait_max: Duration::from_secs(10),
            permit_secret: tollgate::PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..tollgate::LimiterConfig::default()
        },
    )
}

/// A plain connection to the test Redis, for what a test does behind the store's back.
pub async fn raw_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// A sliding rate limit counted per user: `limit` units per `period_ms`, with its own budget
/// of keys (`None`: the store's).
pub fn per_user(name: &str, limit: u64, period_ms: u64, keys_max: Option<u64>) -> tollgate::Limit {
    let policy = tollgate_core::Policy::rate(
        limit,
        period_ms * 1_000,
        0,
        tollgate_core::Algorithm::Sliding,
        tollgate_core::Reserve::default(),
    )
    .expect("valid policy");
    tollgate::Limit::new(name, policy, Some("user"))
        .and_then(|limit| limit.with_keys_max(keys_max))
        .expect("valid limit")
}

/// A fixed rate limit of one counter, not counted per key: 5 a minute.
pub fn unkeyed(name: &str) -> tollgate::Limit {
    let policy = tollgate_core::Policy::rate(
        5,
        60_000_000,
        0,
        tollgate_core::Algorithm::Fixed,
        tollgate_core::Reserve::default(),
    )
    .expect("valid policy");
    tollgate::Limit::new(name, policy, None).expect("valid limit")
}

/// One refundable unit of `limit` (for `key`), not waiting. A permit granted is dropped, so
/// its unit stays counted.
pub async fn take_one(
    limiter: &tollgate::Limiter,
    limit: &str,
    key: Option<&str>,
) -> tollgate::Result<tollgate::Outcome> {
    let mut request = tollgate::Request::new(limit);
    if let Some(key) = key {
        request = request.key(key);
    }
    limiter.try_acquire(&request).await
}
