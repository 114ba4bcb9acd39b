//! A sliding counter's older buckets live in a log key beside its header. What the log holds
//! must keep counting when the limit's window grows, and when the log key itself is lost.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::CounterId;
use tollgate::{Algorithm, Limit, Limiter, Policy, Request, Reserve};

const LIMIT: u64 = 100;

fn sliding(window_ms: u64) -> Policy {
    Policy::rate(
        LIMIT,
        window_ms * 1000,
        0,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid")
}

/// Spend the whole limit over about 100 ms, so that the counter has closed buckets in its log.
async fn spend_everything(limiter: &Limiter) -> Instant {
    let started = Instant::now();
    for _ in 0..10 {
        let granted = limiter
            .try_acquire(&Request::new("vendor").cost(10))
            .await
            .expect("answers")
            .is_granted();
        assert!(granted, "the limit was not open at the start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started
}

/// No single unit is granted from `from` until `until` after `started`.
async fn nothing_granted(limiter: &Limiter, started: Instant, from: Duration, until: Duration) {
    tokio::time::sleep(from.saturating_sub(started.elapsed())).await;
    let mut tries = 0;
    while started.elapsed() < until {
        let outcome = limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers");
        assert!(
            !outcome.is_granted(),
            "granted {:?} after the limit was spent",
            started.elapsed()
        );
        tries += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(tries > 0, "the machine was too slow to try at all");
}

async fn setup(test: &str) -> Option<(String, String, Arc<tollgate_redis::RedisStore>, Limiter)> {
    let url = common::redis_url(test)?;
    let namespace = common::namespace(test);
    common::declare_fresh(&url, &namespace).await;
    let store = Arc::new(common::connect(&url, &namespace).await);
    let limiter = common::limiter_on(store.clone());
    Some((url, namespace, store, limiter))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_buckets_count_for_a_window_that_grew() {
    let Some((_, _, _, limiter)) = setup("closed_buckets_count_for_a_window_that_grew").await
    else {
        return;
    };
    limiter.set_limit(Limit::new("vendor", sliding(200), None).expect("valid"));
    let started = spend_everything(&limiter).await;
    // The window grows to 3 s: everything granted above counts until 3 s after it. (Decided on
    // at once: a counter left idle longer than its old window has expired under it, as every
    // key expires when the window in force at its last decision says it is idle.)
    limiter.set_limit(Limit::new("vendor", sliding(3_000), None).expect("valid"));
    nothing_granted(
        &limiter,
        started,
        Duration::ZERO,
        Duration::from_millis(1_500),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_bucket_log_keeps_counting_its_units() {
    let Some((url, namespace, store, limiter)) =
        setup("a_lost_bucket_log_keeps_counting_its_units").await
    else {
        return;
    };
    limiter.set_limit(Limit::new("vendor", sliding(3_000), None).expect("valid"));
    let started = spend_everything(&limiter).await;
    // The logs are lost (evicted) while the counter's header stays.
    let counter = store.counter_key(CounterId {
        limit: "vendor",
        key: None,
    });
    let state = format!(":{namespace}:c:");
    assert!(counter.contains(&state), "{counter} is not a counter key");
    let log = |kind: &str| counter.replacen(&state, &format!(":{namespace}:{kind}:"), 1);
    let mut connection = common::raw_connection(&url).await;
    let deleted: u64 = redis::cmd("DEL")
        .arg(log("q"))
        .arg(log("r"))
        .query_async(&mut connection)
        .await
        .expect("delete the logs");
    assert!(deleted >= 1, "the counter had no log to lose");
    nothing_granted(
        &limiter,
        started,
        Duration::from_millis(150),
        Duration::from_millis(1_500),
    )
    .await;
}
