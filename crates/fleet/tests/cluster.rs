//! Fleets of worker processes on a real Redis Cluster of three masters, each with a replica,
//! started by the test on loopback ports and stopped when it ends: four processes of fifty
//! acquirers over limits on every master, counted outside:
//!
//! - steady: no overshoot;
//! - the first limit's slot moved to another master under load: no overshoot, no request
//!   failed; the slot's new master holds its counters for one period, as after a failover;
//! - `kill -9` of the master serving the third limit mid-run: its replica is promoted, the other
//!   masters' limits keep being served, the hot limit waits out its quarantine, and nothing is
//!   granted twice.
//!
//! Each hold is judged against the slot's generation read before the fault and the one read
//! after it, which must be born after the fault and owned by the new master: a store that missed
//! the loss would keep the old generation, and a hold measured from it would pass unseen.

#[path = "../../redis/tests/common.rs"]
mod common;
mod fleets;
#[path = "../../redis/tests/nodes/mod.rs"]
mod nodes;

use std::time::{Duration, Instant};

use tollgate::store::CounterId;
use tollgate_redis::RedisStore;
use tollgate_redis::loss::Generation;

use fleets::{
    Fleet, Run, assert_held_for_a_period, assert_new_generation, most_in_a_window, wall_clock_us,
};
use nodes::Cluster;

/// One limit name per master, in the masters' order: `(name, slot, master index)`.
fn limits_on_every_master(cluster: &Cluster, store: &RedisStore) -> Vec<(String, u16, usize)> {
    let mut found: Vec<(String, u16, usize)> = Vec::new();
    for candidate in 0.. {
        let name = format!("vendor-{candidate}");
        let slot = cluster.keyslot(&store.counter_key(CounterId {
            limit: &name,
            key: None,
        }));
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
