//! Each limit's budget of keys on one Redis: a flood of new keys of one limit is refused there
//! (`TooManyKeysForLimit`, naming the limit and its budget), never for another limit or an
//! unkeyed one, and what Redis holds for the flooded limit, counted by `SCAN` rather than by
//! anything Tollgate says, stays within the budget while a key in steady use keeps being served.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{Error, Limiter, Outcome};

/// One unit of `limit` for `key` (`""`: none): granted (`Ok(true)`), denied (`Ok(false)`), or
/// the store's error.
async fn acquire(limiter: &Limiter, limit: &str, key: &str) -> Result<bool, Error> {
    let key = (!key.is_empty()).then_some(key);
    let outcome = common::take_one(limiter, limit, key).await?;
    Ok(matches!(outcome, Outcome::Granted(_)))
}

/// Whether one unit of `limit` for `key` is granted; an error fails the test.
async fn granted(limiter: &Limiter, limit: &str, key: &str) -> bool {
    match acquire(limiter, limit, key).await {
        Ok(granted) => granted,
        Err(error) => panic!("{limit} {key:?}: {error}"),
    }
}

/// How many keys Redis holds now matching `pattern`, walked with `SCAN`.
async fn count_keys(url: &str, pattern: &str) -> usize {
    let mut connection = common::raw_connection(url).await;
    let (mut cursor, mut found) = (0u64, 0);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut connection)
            .await
            .expect("scan");
        found += keys.len();
        if next == 0 {
            return found;
        }
        cursor = next;
    }
}

/// The keys Redis holds now for `limit`'s counters of keys in `namespace`: their states (`c:`),
/// and all three kinds.
async fn keys_held(url: &str, namespace: &str, limit: &str) -> (usize, usize) {
    let pattern = |kind: &str| format!("tg:{{*}}:{namespace}:{kind}:{}:{limit}:*", limit.len());
    let states = count_keys(url, &pattern("c")).await;
    let logs = count_keys(url, &pattern("r")).await + count_keys(url, &pattern("q")).await;
    (states, states + logs)
}

async fn setup(test: &str) -> Option<(String, String, Limiter)> {
    let url = common::redis_url(test)?;
    let namespace = common::namespace(test);
    common::declare_fresh(&url, &namespace).await;
    let store = Arc::new(common::connect(&url, &namespace).await);
    Some((url, namespace, common::limiter_on(store)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_limit_refuses_its_own_new_keys_and_no_one_elses() {
    let test = "a_flooded_limit_refuses_its_own_new_keys_and_no_one_elses";
    let Some((url, namespace, limiter)) = setup(test).await else {
        return;
    };
    limiter.set_limit(common::per_user("a", 5, 60_000, Some(10)));
    limiter.set_limit(common::per_user("b", 5, 60_000, None));
    limiter.set_limit(common::unkeyed("c"));
    assert!(granted(&limiter, "b", "known").await);
    let mut admitted = 0;
    for index in 0..15 {
        match acquire(&limiter, "a", &format!("flood-{index}")).await {
            Ok(true) => admitted += 1,
            Err(Error::TooManyKeysForLimit { limit, keys_max }) => {
                assert_eq!((limit.as_str(), keys_max), ("a", 10));
            }
            other => panic!("flood-{index}: {other:?}"),
        }
    }
    assert_eq!(admitted, 10, "a keeps 10 keys and refuses the rest");
    assert!(granted(&limiter, "b", "new").await, "a new key of b");
    assert!(granted(&limiter, "c", "").await, "the unkeyed c");
    assert!(granted(&limiter, "a", "flood-0").await, "a known key of a");
    // A key's pause makes a counter too: refused for a, made for b.
    let pause = limiter
        .pause("a", Some("paused"), Duration::from_secs(30))
        .await;
    assert!(
        matches!(pause, Err(Error::TooManyKeysForLimit { keys_max: 10, .. })),
        "{pause:?}"
    );
    limiter
        .pause("b", Some("paused"), Duration::from_secs(30))
        .await
        .expect("a pause of b's new key");
    let (states, all) = keys_held(&url, &namespace, "a").await;
    assert_eq!(states, 10, "a's counters in Redis");
    assert!(all <= 30, "{all} keys for a's counters");
}

/// A key in steady use outlives any one cover: it moves its cover and is served throughout,
/// while a flood of new keys takes only what the budget leaves, and Redis never holds more of
/// the limit's counters than its budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_steady_use_keeps_its_place_while_new_keys_are_refused() {
    let test = "a_key_in_steady_use_keeps_its_place_while_new_keys_are_refused";
    let Some((url, namespace, limiter)) = setup(test).await else {
        return;
    };
    // A window of one second: a cover runs 2 to 2.7 s; the run lasts three covers at least.
    limiter.set_limit(common::per_user("a", 1_000, 1_000, Some(3)));
    let started = Instant::now();
    let (mut flood_granted, mut flood_refused, mut most_held) = (0, 0, 0);
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(7) {
        assert!(
            granted(&limiter, "a", "steady").await,
            "the steady key at {:?}",
            started.elapsed()
        );
        match acquire(&limiter, "a", &format!("flood-{round}")).await {
            Ok(true) => flood_granted += 1,
            Err(Error::TooManyKeysForLimit { .. }) => flood_refused += 1,
            other => panic!("flood-{round}: {other:?}"),
        }
        if round % 5 == 0 {
            let (states, _) = keys_held(&url, &namespace, "a").await;
            most_held = most_held.max(states);
            assert!(
                states <= 3,
                "{states} counters of a at {:?}",
                started.elapsed()
            );
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{round} rounds: {flood_granted} new keys admitted, {flood_refused} refused, at most \
         {most_held} counters of a held"
    );
    assert!(
        flood_refused > flood_granted,
        "the budget refused the flood"
    );
    assert!(flood_granted >= 2, "the flood filled the budget");
}
