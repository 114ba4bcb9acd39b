//! The Redis store on a real Redis Cluster of three masters, each with a replica, started by
//! the test on loopback ports and stopped when it ends:
//!
//! - the store conformance suite, with counters spread over the slots (a request naming
//!   several limits is decided slot by slot, each limit with its own cost if it has one);
//! - each limit's budget of keys, kept in the limit's own slot while its keys' counters spread
//!   over every master: a flood refused at the budget, the counters held counted by `SCAN` on
//!   each master, and a budget whose slot lost its state admitting no new key for a while;
//! - the queue across the fleet on every master: a place in the counter's slot, which keeps
//!   a freed lease from a lower priority elsewhere;
//! - a burst on one new key, batched, its admissions in its budget's slot shared: the key
//!   counted once.
//!
//! Fleets of worker processes on a cluster, through a reshard and a failover, are
//! `crates/fleet/tests/cluster.rs`.

mod common;
mod nodes;

use std::sync::Arc;
use std::time::Duration;

use tollgate::store::{Ask, CounterId, CounterOutcome, Store, Take, WaiterId};
use tollgate::{Algorithm, DenyReason, Error, Outcome, Policy, Priority, Reserve};
use tollgate_conformance::Stores;

use nodes::Cluster;

#[test]
fn the_conformance_suite_passes_on_a_three_master_cluster() {
    let Some(binary) =
        nodes::redis_server("the_conformance_suite_passes_on_a_three_master_cluster")
    else {
        return;
    };
    let cluster = Cluster::start(&binary, 3);
    let url = cluster.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let stores = |test: &str| {
        let namespace = common::namespace(test);
        runtime.block_on(async {
            let first = common::connect(&url, &namespace).await;
            assert!(first.is_cluster());
            first.begin_new_namespace().await.expect("a new namespace");
            Stores {
                first: Arc::new(first),
                second: Arc::new(common::connect(&url, &namespace).await),
            }
        })
    };
    use tollgate_conformance as suite;
    runtime.block_on(suite::rate_limits_grant_to_the_limit_and_hint_honestly(
        stores("rate"),
    ));
    runtime.block_on(suite::several_limits_are_all_or_nothing(stores("several")));
    runtime.block_on(suite::commit_refunds_unused_units_once(stores("commit")));
    runtime.block_on(suite::leases_fence_renew_and_release_once(stores("leases")));
    runtime.block_on(suite::pauses_stop_grants_and_only_extend(stores("pauses")));
    runtime.block_on(suite::waiters_wake_when_another_handle_releases(stores(
        "wake",
    )));
    runtime.block_on(suite::waiters_are_served_by_priority_then_arrival(stores(
        "priority",
    )));
    runtime.block_on(suite::random_traffic_never_exceeds_the_limit(stores(
        "random",
    )));
    runtime.block_on(suite::bulk_and_priority_callers_never_overshoot(stores(
        "bulk",
    )));
    runtime.block_on(suite::bad_input_is_refused_with_the_field_named(stores(
        "bad",
    )));
    runtime.block_on(suite::unrefundable_grants_count_the_same_and_refund_nothing(stores("final")));
    runtime.block_on(suite::check_counts_rate_units_and_refuses_leases(stores(
        "check",
    )));
    runtime.block_on(suite::usage_shows_what_is_counted_and_takes_nothing(
        stores("usage"),
    ));
    runtime.block_on(suite::costs_are_taken_per_limit_all_or_nothing(stores(
        "costs",
    )));
    runtime.block_on(suite::charges_count_past_the_limit_and_are_paid_first(
        stores("charges"),
    ));
}

/// The `c:` keys (counter states) of `limit`'s keys in `namespace`, over every master.
fn states_held(cluster: &Cluster, namespace: &str, limit: &str) -> usize {
    let pattern = format!("tg:{{*}}:{namespace}:c:{}:{limit}:*", limit.len());
    cluster
        .masters()
        .iter()
        .map(|node| {
            let text = node
                .query(&["--scan", "--pattern", &pattern])
                .expect("scan");
            text.lines().filter(|line| !line.is_empty()).count()
        })
        .sum()
}

/// A three-master cluster started for `test`, a runtime, and a store on a new namespace made
/// from `name`; `None` (the test says it skipped) without `redis-server`.
struct OnCluster {
    cluster: Cluster,
    runtime: tokio::runtime::Runtime,
    namespace: String,
    url: String,
    store: Arc<tollgate_redis::RedisStore>,
}

fn on_cluster(test: &str, name: &str) -> Option<OnCluster> {
    let binary = nodes::redis_server(test)?;
    let cluster = Cluster::start(&binary, 3);
    let url = cluster.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let namespace = common::namespace(name);
    let store = Arc::new(runtime.block_on(common::connect(&url, &namespace)));
    runtime
        .block_on(store.begin_new_namespace())
        .expect("a new namespace");
    Some(OnCluster {
        cluster,
        runtime,
        namespace,
        url,
        store,
    })
}

#[test]
fn each_limit_keeps_its_budget_of_keys_across_the_slots() {
    let Some(OnCluster {
        cluster,
        runtime,
        namespace,
        store,
        ..
    }) = on_cluster(
        "each_limit_keeps_its_budget_of_keys_across_the_slots",
        "cluster-keys",
    )
    else {
        return;
    };
    let limiter = common::limiter_on(store.clone());
    limiter.set_limit(common::per_user("a", 5, 60_000, Some(10)));
    limiter.set_limit(common::per_user("b", 5, 60_000, None));
    limiter.set_limit(common::per_user("d", 5, 60_000, None));
    limiter.set_limit(common::unkeyed("c"));
    let take =
        |limit: &str, key: Option<&str>| runtime.block_on(common::take_one(&limiter, limit, key));
    let granted = |answer: tollgate::Result<Outcome>| matches!(answer, Ok(Outcome::Granted(_)));

    let mut admitted = 0;
    for index in 0..15 {
        match take("a", Some(&format!("flood-{index}"))) {
            Ok(Outcome::Granted(_)) => admitted += 1,
            Err(Error::TooManyKeysForLimit { limit, keys_max }) => {
                assert_eq!((limit.as_str(), keys_max), ("a", 10));
            }
            other => panic!("flood-{index}: {other:?}"),
        }
    }
    assert_eq!(admitted, 10, "a keeps its budget of 10 keys over the slots");
    assert!(granted(take("b", Some("new"))), "a new key of b");
    assert!(granted(take("c", None)), "the unkeyed c");
    assert!(granted(take("a", Some("flood-0"))), "a known key of a");
    let pause = runtime.block_on(limiter.pause("a", Some("paused"), Duration::from_secs(30)));
    assert!(
        matches!(pause, Err(Error::TooManyKeysForLimit { keys_max: 10, .. })),
        "{pause:?}"
    );
    assert_eq!(states_held(&cluster, &namespace, "a"), 10);

    // d's budget loses its state with its slot (its generation gone: a restart or failover of
    // that master), while d's keys' counters, on other slots, live on.
    assert!(granted(take("d", Some("known"))), "d's first key");
    let generation = store.generation_key(CounterId {
        limit: "d",
        key: None,
    });
    let slot = cluster.keyslot(&store.counter_key(CounterId {
        limit: "d",
        key: None,
    }));
    cluster.nodes[cluster.master_of(slot)]
        .query(&["DEL", &generation])
        .expect("delete the generation");
    match take("d", Some("new")) {
        Ok(Outcome::Denied(denied)) => {
            assert_eq!(denied.reason, DenyReason::Recovering);
            // Held three spans of d's window, from the new generation's birth.
            assert!(
                denied.retry_after > Duration::from_secs(120),
                "{:?}",
                denied.retry_after
            );
        }
        other => panic!("a new key of d after its budget was lost: {other:?}"),
    }
    assert!(granted(take("d", Some("known"))), "a known key of d");
    assert!(granted(take("b", Some("another"))), "a new key of b");
}

/// Acquires in flight at once on one new key of a limit whose budget of keys is in another
/// slot go in batches, and each batched acquire needs the key admitted in that slot (the
/// script answers `admit` for it alone, and it is called again). They share one admission, so
/// one client's burst on one key counts that key once: exactly the limit is granted, and no
/// acquire is refused for want of keys in a budget of ten.
#[test]
fn a_burst_on_a_new_key_is_batched_and_admitted_across_the_slots() {
    let Some(OnCluster {
        cluster,
        runtime,
        namespace,
        store,
        ..
    }) = on_cluster(
        "a_burst_on_a_new_key_is_batched_and_admitted_across_the_slots",
        "cluster-batch",
    )
    else {
        return;
    };
    let limiter = common::limiter_on(store.clone());
    limiter.set_limit(common::per_user("burst", 10, 60_000, Some(10)));
    // A key whose counter is not in its limit's slot, where the budget of keys is.
    let key = (0..)
        .map(|index| format!("user-{index}"))
        .find(|key| {
            let counter = |key: Option<&str>| {
                cluster.keyslot(&store.counter_key(CounterId {
                    limit: "burst",
                    key,
                }))
            };
            counter(Some(key)) != counter(None)
        })
        .expect("a key in another slot");
    let answers = runtime.block_on(futures_util::future::join_all(
        (0..40).map(|_| common::take_one(&limiter, "burst", Some(&key))),
    ));
    let granted = answers
        .iter()
        .filter(|answer| matches!(answer, Ok(Outcome::Granted(_))))
        .count();
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(granted, 10);
    assert!(store.batched_acquires() > 0, "nothing was batched");
    assert_eq!(states_held(&cluster, &namespace, "burst"), 1);
    // The budget counted the key once: nine more keys fit, the tenth does not.
    for index in 0..9 {
        let answer = runtime.block_on(common::take_one(
            &limiter,
            "burst",
            Some(&format!("other-{index}")),
        ));
        assert!(matches!(answer, Ok(Outcome::Granted(_))), "{answer:?}");
    }
    let answer = runtime.block_on(common::take_one(&limiter, "burst", Some("one-too-many")));
    assert!(
        matches!(answer, Err(Error::TooManyKeysForLimit { keys_max: 10, .. })),
        "{answer:?}"
    );
}

/// The queue across the fleet on every master: for keys whose counters spread over the slots,
/// a high request waiting in one process (its place in its counter's slot) keeps the lease
/// freed from a low request of another, until it is served and its place goes.
#[test]
fn places_across_the_fleet_hold_on_every_master() {
    let Some(OnCluster {
        cluster,
        runtime,
        namespace,
        url,
        store: bulk_store,
    }) = on_cluster(
        "places_across_the_fleet_hold_on_every_master",
        "cluster-queue",
    )
    else {
        return;
    };
    let other = runtime.block_on(common::connect(&url, &namespace));
    let policy = tollgate_core::Policy::concurrency(1, 60_000_000, Default::default())
        .expect("valid policy");
    let bulk = common::limiter_on(bulk_store.clone());
    bulk.set_limit(tollgate::Limit::new("pool", policy, Some("user")).expect("valid limit"));
    let mut masters = std::collections::HashSet::new();
    for index in 0..12 {
        let key = format!("user-{index}");
        let counter = CounterId {
            limit: "pool",
            key: Some(&key),
        };
        let queue_key = bulk_store.queue_key(counter);
        let master = cluster.master_of(cluster.keyslot(&queue_key));
        masters.insert(master);
        let places = || {
            cluster.nodes[master]
                .query(&["EXISTS", &queue_key])
                .expect("exists")
                .trim()
                .to_owned()
        };
        let takes = [Take {
            counter,
            policy: &policy,
        }];
        let high = WaiterId::new(1_000 + index).expect("an id");
        let low = tollgate::Request::new("pool")
            .key(&key)
            .priority(Priority::Low);
        let held = runtime.block_on(bulk.try_acquire(&low)).expect("answers");
        let held = held.granted().expect("the key's pool is free");
        let ask =
            || runtime.block_on(other.acquire(Ask::new(&takes, 1, Priority::High).waiter(high)));
        assert!(!ask().expect("answers").is_granted());
        assert_eq!(
            places(),
            "1",
            "{key}: the waiter's place, on master {master}"
        );
        // A place lives 1.5 s past its last ask: asked again just before the lease is freed.
        assert!(!ask().expect("answers").is_granted());
        runtime.block_on(held.release()).expect("release");
        match runtime.block_on(bulk.try_acquire(&low)).expect("answers") {
            Outcome::Denied(denied) => assert_eq!(denied.reason, DenyReason::Queued, "{key}"),
            Outcome::Granted(_) => panic!("{key}: a low request took the high waiter's lease"),
        }
        let served = ask().expect("answers");
        assert!(served.is_granted(), "{key}: the high waiter is served");
        assert_eq!(places(), "0", "{key}: a grant takes the place away");
    }
    assert_eq!(masters.len(), 3, "the keys' queues are on every master");
}

/// A request over two limits whose counters sit in two slots, each limit with its own cost: a
/// cost above a limit's capacity is refused before any slot is asked, naming that limit and its
/// cost; a denial in the second slot rolls the first slot's grant back, its own cost given back
/// (what it has left is as before); and a grant takes each limit's own cost.
#[test]
fn a_cost_per_limit_is_all_or_nothing_across_the_slots() {
    let Some(OnCluster {
        cluster,
        runtime,
        store,
        ..
    }) = on_cluster(
        "a_cost_per_limit_is_all_or_nothing_across_the_slots",
        "cluster-costs",
    )
    else {
        return;
    };
    let slot = |limit: &str| cluster.keyslot(&store.counter_key(CounterId { limit, key: None }));
    // The first limit's slot is asked first (slots go in ascending order).
    let (first, second) = (0..64)
        .map(|index| (format!("calls-{index}"), format!("tokens-{index}")))
        .find(|(first, second)| slot(first) < slot(second))
        .expect("two limits in ascending slots");
    let hour = 3_600_000_000;
    let calls = Policy::rate(10, hour, 0, Algorithm::Fixed, Reserve::default()).expect("valid");
    let tokens = Policy::rate(5, hour, 0, Algorithm::Fixed, Reserve::default()).expect("valid");
    let takes = [
        Take {
            counter: CounterId {
                limit: &first,
                key: None,
            },
            policy: &calls,
        },
        Take {
            counter: CounterId {
                limit: &second,
                key: None,
            },
            policy: &tokens,
        },
    ];
    let acquire = |costs: &[u64]| {
        runtime.block_on(store.acquire(Ask::new(&takes, 1, Priority::Normal).costs(costs)))
    };
    let used = |take: Take<'_>| runtime.block_on(store.usage(take)).expect("usage").used;

    match acquire(&[2, 9]) {
        Err(Error::Cost { limit, source }) => {
            assert_eq!((limit.as_str(), source.cost), (second.as_str(), 9));
        }
        other => panic!("a cost above the second limit's capacity: {other:?}"),
    }
    let granted = acquire(&[2, 4]).expect("answers");
    assert!(granted.is_granted(), "{granted:?}");
    assert_eq!((used(takes[0]), used(takes[1])), (2, 4));

    let denied = acquire(&[3, 2]).expect("answers");
    assert!(!denied.is_granted(), "{denied:?}");
    assert_eq!(
        denied.outcomes()[0],
        CounterOutcome::Allowed { remaining: 8 },
        "the first slot's grant given back, its own cost with it"
    );
    assert!(matches!(denied.outcomes()[1], CounterOutcome::Denied(_)));
    assert_eq!((used(takes[0]), used(takes[1])), (2, 4), "nothing taken");

    let granted = acquire(&[3, 1]).expect("answers");
    assert!(granted.is_granted(), "{granted:?}");
    assert_eq!(
        (used(takes[0]), used(takes[1])),
        (5, 5),
        "each its own cost"
    );
}
