//! Lost state (G6). A failover to a replica that missed the last writes: Redis answers, but
//! with an older counter, written by another Redis process than the one that owns the
//! generation now. The store notices the new owner, starts a new generation, and holds every
//! counter written before it for one period, so nothing granted before is granted again. A
//! flush or a restart without persistence is noticed by the missing generation.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::store::CounterId;
use tollgate::{Algorithm, DenyReason, Limit, Outcome, Policy, Request, Reserve};
use tollgate_redis::loss::Owner;

const VENDOR: CounterId<'static> = CounterId {
    limit: "vendor",
    key: None,
};

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
    let granted = || async {
        limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers")
            .is_granted()
    };
    let mut connection = common::raw_connection(&url).await;
    let counter_key = store.counter_key(VENDOR);
    let generation_key = store.generation_key(VENDOR);
    assert!(granted().await);
    // What the replica holds: the counter after the first grant only.
    let replica: Vec<u8> = redis::cmd("GET")
        .arg(&counter_key)
        .query_async(&mut connection)
        .await
        .expect("read the counter");
    assert!(granted().await);
    assert!(!granted().await, "the limit is 2");
    // The replica is promoted: it lacks the second grant, and it is another Redis process.
    let mut generation = store
        .generation(VENDOR)
        .await
        .expect("answers")
        .expect("a generation");
    let born_before = generation.born_us;
    generation.owner = Owner {
        node: String::new(),
        run: "replica-run-id".into(),
    };
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(&counter_key)
        .arg(&replica)
        .arg("PX")
        .arg(60_000)
        .cmd("SET")
        .arg(&generation_key)
        .arg(generation.encode(u64::MAX / 2))
        .arg("PX")
        .arg(60_000)
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
        Outcome::Granted(_) => panic!("granted again on a stale replica's counter"),
    }
    // The new owner wrote a new generation, born after the old one.
    let now = store
        .generation(VENDOR)
        .await
        .expect("answers")
        .expect("a generation");
    assert_ne!(now.owner.run, "replica-run-id");
    assert!(now.born_us > born_before);
    assert!(!granted().await, "still recovering");
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
        .arg(store.key_pattern())
        .query_async(&mut connection)
        .await
        .expect("keys");
    assert!(keys.len() >= 2, "{keys:?}");
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

/// The loss check is a read: a decision on a generation it owns writes nothing to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deciding_reads_the_generation_without_writing_it() {
    let Some(url) = common::redis_url("deciding_reads_the_generation_without_writing_it") else {
        return;
    };
    let namespace = common::namespace("gen-read");
    common::declare_fresh(&url, &namespace).await;
    let store = Arc::new(common::connect(&url, &namespace).await);
    let limiter = common::limiter_on(store.clone());
    let policy = Policy::rate(
        1000,
        1_000_000,
        0,
        Algorithm::Gcra { burst: 1000 },
        Reserve::default(),
    )
    .expect("valid");
    limiter.set_limit(Limit::new("vendor", policy, None).expect("valid"));
    assert!(
        limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers")
            .is_granted()
    );
    let connection = common::raw_connection(&url).await;
    let generation = store.generation_key(VENDOR);
    let read = || {
        let mut connection = connection.clone();
        let generation = generation.clone();
        async move {
            let value: (Vec<u8>, i64) = redis::pipe()
                .get(&generation)
                .pttl(&generation)
                .query_async(&mut connection)
                .await
                .expect("generation");
            value
        }
    };
    // Its value and its expiry, before and after many decisions: a write would move the
    // expiry, even one that wrote the same value.
    let before = read().await;
    for _ in 0..20 {
        assert!(
            limiter
                .try_acquire(&Request::new("vendor").refundable(false))
                .await
                .expect("answers")
                .is_granted()
        );
    }
    let after = read().await;
    assert_eq!(before.0, after.0);
    assert!(after.1 <= before.1, "the generation was written again");
    assert!(tollgate_redis::loss::Generation::decode(&before.0).is_some());
}
