//! What the Redis store's tests share: connecting to the test Redis, or saying loudly why not.

#![allow(dead_code)]

use std::time::Duration;

use tollgate_redis::{RedisStore, RedisStoreConfig};

pub fn redis_url(test: &str) -> Option<String> {
    match std::env::var("TOLLGATE_TEST_REDIS") {
        Ok(url) => Some(url),
        Err(_) => {
            eprintln!(
                "SKIPPED {test}: TOLLGATE_TEST_REDIS is unset, so it did not run against Redis"
            );
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
        timeout: Duration::from_secs(5),
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
