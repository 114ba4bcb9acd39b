//! The Redis store on a real Redis Cluster of three masters, each with a replica, started by
//! the test on loopback ports and stopped when it ends:
//!
//! - the store conformance suite, with counters spread over the slots (a request naming
//!   several limits is decided slot by slot);
//! - four processes of fifty acquirers over limits on every master, counted outside: no
//!   overshoot;
//! - `kill -9` of the master serving a hot limit mid-run: its replica is promoted, the other
//!   masters' limits keep being served, the hot limit waits out its quarantine, and nothing is
//!   granted twice;
//! - the hot limit's slot moved to another master under load: no overshoot, no request failed;
//!   the slot's new master holds its counters for one period, as after a failover;
//! - each limit's budget of keys, kept in the limit's own slot while its keys' counters spread
//!   over every master: a flood refused at the budget, the counters held counted by `SCAN` on
//!   each master, and a budget whose slot lost its state admitting no new key for a while.
//!
//! Each hold is judged against the slot's generation read before the fault and the one read
//! after it, which must be born after the fault and owned by the new master: a store that missed
//! the loss would keep the old generation, and a hold measured from it would pass unseen.

mod common;
mod fleets;
mod nodes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_conformance::Stores;
use tollgate::store::CounterId;
use tollgate::{DenyReason, Error, Outcome};
use tollgate_redis::RedisStore;
use tollgate_redis::loss::Generation;

use fleets::{
    Fleet, Run, assert_held_for_a_period, assert_new_generation, most_in_a_window, wall_clock_us,
};
use nodes::Cluster;

/// The slot of a counter's keys, as the cluster computes it.
fn slot_of(cluster: &Cluster, store: &RedisStore, limit: &str) -> u16 {
    let key = store.counter_key(CounterId { limit, key: None });
    cluster
        .running()
        .query(&["CLUSTER", "KEYSLOT", &key])
        .expect("keyslot")
        .trim()
        .parse()
        .expect("a slot")
}

/// One limit name per master, in the masters' order: `(name, slot, master index)`.
fn limits_on_every_master(cluster: &Cluster, store: &RedisStore) -> Vec<(String, u16, usize)> {
    let mut found: Vec<(String, u16, usize)> = Vec::new();
    for candidate in 0.. {
        let name = format!("vendor-{candidate}");
        let slot = slot_of(cluster, store, &name);
        let master = cluster.master_of(slot);
        if found.iter().all(|(_, _, other)| *other != master) {
            found.push((name, slot, master));
        }
        if found.len() == 3 {
            break;
        }
    }
    found
}

/// The generation that guards `limit`'s slot, read from its master now.
fn generation_of(
    runtime: &tokio::runtime::Runtime,
    store: &RedisStore,
    limit: &str,
) -> Option<Generation> {
    runtime
        .block_on(store.generation(CounterId { limit, key: None }))
        .expect("the generation can be read")
}

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
}

/// What a fleet run over the three limits showed, per limit.
fn assert_no_overshoot(run: &Run, grants: &std::collections::BTreeMap<String, Vec<u64>>) {
    for (limit, times) in grants {
        let most = most_in_a_window(times, run.period_ms * 1_000, run.algorithm);
        eprintln!(
            "{limit}: {} grants, at most {most} in one period of {} ms (limit {})",
            times.len(),
            run.period_ms,
            run.limit
        );
        assert!(most <= run.limit, "{limit}: {most} grants in one period");
    }
}

#[test]
fn a_fleet_over_every_master_waits_out_the_new_generation_of_a_reshard_and_a_failover() {
    let Some(binary) = nodes::redis_server(
        "a_fleet_over_every_master_waits_out_the_new_generation_of_a_reshard_and_a_failover",
    ) else {
        return;
    };
    let mut cluster = Cluster::start(&binary, 3);
    let url = cluster.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let namespace = common::namespace("cluster-fleet");
    let store = runtime.block_on(common::connect(&url, &namespace));
    runtime
        .block_on(store.begin_new_namespace())
        .expect("a new namespace");
    let limits = limits_on_every_master(&cluster, &store);
    let names: Vec<&str> = limits.iter().map(|(name, _, _)| name.as_str()).collect();

    // 1. Steady: four processes of fifty acquirers over the three limits.
    let run = Run {
        name: names.join(","),
        limit: 20,
        period_ms: 500,
        acquirers: 50,
        duration_ms: 3_000,
        algorithm: "sliding",
    };
    let fleet = Fleet::start(&url, &namespace, &run, &[None; 4]);
    let (grants, errors) = fleet.collect_by_limit();
    assert_eq!(errors, 0, "errors on a healthy cluster");
    assert_eq!(
        grants.len(),
        3,
        "every limit was served: {:?}",
        grants.keys()
    );
    assert_no_overshoot(&run, &grants);

    // 2. Reshard under load: the first limit's slot moves to the master of the second.
    let (moved, slot, moved_from) = limits[0].clone();
    let before = generation_of(&runtime, &store, &moved).expect("a generation");
    assert_eq!(before.owner.node, cluster.id(moved_from), "{before:?}");
    let run = Run {
        duration_ms: 5_000,
        ..run
    };
    let fleet = Fleet::start(&url, &namespace, &run, &[None; 4]);
    std::thread::sleep(Duration::from_millis(1_500));
    let moving_at_us = wall_clock_us();
    cluster.migrate_slot(slot, limits[1].2);
    let (grants, errors) = fleet.collect_by_limit();
    assert_no_overshoot(&run, &grants);
    assert_eq!(errors, 0, "a request failed while its slot moved");
    assert_eq!(cluster.master_of(slot), limits[1].2, "the slot moved");
    // Its new master owns the slot's generation now: started again, so the moved limit's
    // counters waited one period (a reshard is not told apart from a failover to a stale copy).
    let after = generation_of(&runtime, &store, &moved).expect("a generation");
    assert_new_generation(&before, &after, moving_at_us);
    assert_eq!(after.owner.node, cluster.id(limits[1].2), "{after:?}");
    assert_held_for_a_period(&grants[&moved], moving_at_us, after.born_us, run.period_ms);

    // 3. kill -9 of the master serving the third limit, mid-run.
    let (hot, hot_slot, hot_master) = limits[2].clone();
    let before = generation_of(&runtime, &store, &hot).expect("a generation");
    assert_eq!(before.owner.node, cluster.id(hot_master), "{before:?}");
    let run = Run {
        duration_ms: 9_000,
        ..run
    };
    let fleet = Fleet::start(&url, &namespace, &run, &[None; 4]);
    std::thread::sleep(Duration::from_millis(1_500));
    let killed_at = Instant::now();
    let killed_at_us = wall_clock_us();
    cluster.nodes[hot_master].kill();
    let (grants, errors) = fleet.collect_by_limit();
    eprintln!(
        "failover: {errors} errors seen by callers while the master was down; killed {:?} before the end",
        killed_at.elapsed()
    );
    assert_no_overshoot(&run, &grants);
    let promoted = cluster.master_of(hot_slot);
    assert_ne!(promoted, hot_master, "a replica was promoted");
    // The promoted replica started a generation of its own, born after the kill: the hot limit
    // waited out one period of it before granting again, and the other masters never stopped.
    let after = generation_of(&runtime, &store, &hot).expect("a generation");
    assert_new_generation(&before, &after, killed_at_us);
    assert_eq!(after.owner.node, cluster.id(promoted), "{after:?}");
    let born_after = after.born_us;
    assert_held_for_a_period(&grants[&hot], killed_at_us, born_after, run.period_ms);
    for (name, _, _) in &limits[..2] {
        let times = &grants[name];
        // Served during the outage: a grant within one second of the new generation's birth.
        assert!(
            times
                .iter()
                .any(|&at| at + 1_000_000 > born_after && at < born_after + 1_000_000),
            "{name} was not served while the hot master failed over"
        );
    }
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

#[test]
fn each_limit_keeps_its_budget_of_keys_across_the_slots() {
    let Some(binary) = nodes::redis_server("each_limit_keeps_its_budget_of_keys_across_the_slots")
    else {
        return;
    };
    let cluster = Cluster::start(&binary, 3);
    let url = cluster.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let namespace = common::namespace("cluster-keys");
    let store = Arc::new(runtime.block_on(common::connect(&url, &namespace)));
    runtime
        .block_on(store.begin_new_namespace())
        .expect("a new namespace");
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
    let slot = slot_of(&cluster, &store, "d");
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
