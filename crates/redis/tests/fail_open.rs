//! The Redis store's `fail_open`, on a Redis of the test's own that it can starve of memory and
//! stop: while Redis answers, a store that fails open counts like any other; a Redis that
//! answers with a failure (out of memory) is refused whatever `fail_open` says; a Redis that
//! cannot be reached is granted through, uncounted, only by a store that fails open, and
//! refused with `store_unavailable` by one that does not.

mod common;
mod nodes;

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Algorithm, Error, Limit, Limiter, Outcome, Policy, Request, Reserve};
use tollgate_redis::{RedisStore, RedisStoreConfig};

async fn limiter(url: &str, namespace: &str, fail_open: bool) -> Limiter {
    let store = RedisStore::connect(RedisStoreConfig {
        url: url.to_owned(),
        namespace: namespace.to_owned(),
        fail_open,
        allow_eviction: false,
        module: tollgate_redis::Module::Auto,
        keys_per_limit_max: 100_000,
        // Short: a stopped Redis is found unreachable within it.
        timeout: Duration::from_secs(1),
    })
    .await
    .expect("connect to the test's Redis");
    let limiter = common::limiter_on(Arc::new(store));
    // One unit an hour: whatever is granted after it was spent, nothing counted.
    let policy =
        Policy::rate(1, 3_600_000_000, 0, Algorithm::Sliding, Reserve::default()).expect("valid");
    for name in ["vendor", "other"] {
        limiter.set_limit(Limit::new(name, policy, None).expect("valid"));
    }
    limiter
}

fn granted(answer: tollgate::Result<Outcome>, what: &str) -> bool {
    match answer {
        Ok(outcome) => outcome.is_granted(),
        Err(error) => panic!("{what}: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_unreachable_redis_is_failed_open_and_only_when_asked() {
    let Some(binary) =
        nodes::redis_server("only_an_unreachable_redis_is_failed_open_and_only_when_asked")
    else {
        return;
    };
    let mut redis = nodes::Single::start(&binary, &[]);
    let url = redis.node.url();
    let namespace = common::namespace("fail_open");
    common::declare_fresh(&url, &namespace).await;
    let open = limiter(&url, &namespace, true).await;
    let closed = limiter(&url, &namespace, false).await;
    let vendor = Request::new("vendor");

    // Reachable: failing open changes nothing; both count the one unit in Redis.
    assert!(granted(open.try_acquire(&vendor).await, "the first unit"));
    assert!(!granted(
        closed.try_acquire(&vendor).await,
        "spent, seen by the other"
    ));
    assert!(!granted(
        open.try_acquire(&vendor).await,
        "spent, seen by itself"
    ));

    // Out of memory: Redis answers, with a failure, which is never failed open.
    redis
        .node
        .query(&["CONFIG", "SET", "maxmemory", "1"])
        .expect("maxmemory set");
    for (limiter, which) in [(&open, "fail-open"), (&closed, "fail-closed")] {
        match limiter.try_acquire(&Request::new("other")).await {
            Err(Error::StoreFailed { reason }) => assert!(reason.contains("OOM"), "{reason}"),
            answer => panic!("{which} store on a Redis out of memory: {answer:?}"),
        }
    }
    redis
        .node
        .query(&["CONFIG", "SET", "maxmemory", "0"])
        .expect("maxmemory unset");

    // Unreachable: only the store that fails open grants, and it counts nothing (the unit
    // spent above would refuse it).
    redis.node.kill();
    for round in 0..3 {
        assert!(
            granted(open.try_acquire(&vendor).await, "failed open"),
            "round {round}: the fail-open store refused while Redis is down"
        );
        match closed.try_acquire(&vendor).await {
            Err(error @ Error::StoreUnavailable { .. }) => assert!(error.fails_open()),
            answer => panic!("round {round}: the fail-closed store answered {answer:?}"),
        }
    }
}
