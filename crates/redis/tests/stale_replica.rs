//! Failover to a stale replica: Redis answers, but with an older state that lacks recent
//! grants. The generation's version tells: it is lower than this client has seen, so the store
//! starts a new generation and grants nothing on a limit for one period (G6).

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Algorithm, DenyReason, Limit, Outcome, Policy, Request, Reserve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_replica_is_detected_and_nothing_is_regranted() {
    let Some(url) = common::redis_url("a_stale_replica_is_detected_and_nothing_is_regranted")
    else {
        return;
    };
    let namespace = common::namespace("stale");
    common::declare_fresh(&url, &namespace).await;
    let store = Arc::new(common::connect(&url, &namespace).await);
    let limiter = common::limiter_on(store.clone());
    let policy =
        Policy::rate(2, 1_000_000, 0, Algorithm::Sliding, Reserve::default()).expect("valid");
    limiter.set_limit(Limit::new("vendor", policy, None).expect("valid"));
    for _ in 0..2 {
        assert!(
            limiter
                .try_acquire(&Request::new("vendor"))
                .await
                .expect("answers")
                .is_granted()
        );
    }
    // The replica the store fails over to never saw those grants, and is a few versions behind.
    let mut connection = common::raw_connection(&url).await;
    let counter_key = store.counter_key(tollgate::store::CounterId {
        limit: "vendor",
        key: None,
    });
    let generation = format!("tg:{{{namespace}}}:gen");
    let _: () = redis::pipe()
        .del(&counter_key)
        .hset(&generation, "ver", 1)
        .query_async(&mut connection)
        .await
        .expect("make the state stale");
    match limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("answers")
    {
        Outcome::Denied(denial) => {
            assert_eq!(denial.reason, DenyReason::Recovering);
            assert!(
                denial.retry_after > Duration::from_millis(900),
                "{denial:?}"
            );
        }
        Outcome::Granted(_) => panic!("granted on a stale replica's empty counter"),
    }
}

/// A namespace declared new grants at once; one Redis already knows is left as it is; one that
/// comes back empty after use is held, with its own reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_namespace_grants_at_once_and_a_lost_one_recovers() {
    let Some(url) = common::redis_url("a_new_namespace_grants_at_once_and_a_lost_one_recovers")
    else {
        return;
    };
    let namespace = common::namespace("new-or-lost");
    let store = Arc::new(common::connect(&url, &namespace).await);
    assert!(store.begin_new_namespace().await.expect("answers"));
    assert!(!store.begin_new_namespace().await.expect("answers"));
    let limiter = common::limiter_on(store.clone());
    let policy =
        Policy::rate(2, 3_600_000_000, 0, Algorithm::Fixed, Reserve::default()).expect("valid");
    limiter.set_limit(Limit::new("daily", policy, None).expect("valid"));
    assert!(
        limiter
            .try_acquire(&Request::new("daily"))
            .await
            .expect("answers")
            .is_granted()
    );
    // Redis flushed: the namespace was in use, so it is lost, not new.
    let mut connection = common::raw_connection(&url).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("tg:{{{namespace}}}:*"))
        .query_async(&mut connection)
        .await
        .expect("keys");
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut connection)
        .await
        .expect("flush the namespace");
    match limiter
        .try_acquire(&Request::new("daily"))
        .await
        .expect("answers")
    {
        Outcome::Denied(denial) => {
            assert_eq!(denial.reason, DenyReason::Recovering);
            assert!(denial.retry_after > Duration::from_secs(3500), "{denial:?}");
        }
        Outcome::Granted(_) => panic!("granted on a flushed namespace"),
    }
}
