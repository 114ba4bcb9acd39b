//! The Redis store under Sentinel (`redis-sentinel://`): one master, one replica and three
//! Sentinels, started by the test on loopback ports. A fleet of four processes acquires through
//! the Sentinels' master; the master is killed (`kill -9`) mid-run; the Sentinels promote the
//! replica and the store follows it. Counted outside: no overshoot across the failover; the
//! generation read before the kill is replaced by one the promoted replica owns, born after the
//! kill; nothing is granted within a period of that birth, and the limit is served again after.

#[path = "../../redis/tests/common.rs"]
mod common;
mod fleets;
#[path = "../../redis/tests/nodes/mod.rs"]
mod nodes;

use std::time::Duration;

use tollgate::store::CounterId;
use tollgate_redis::loss::Generation;
use tollgate_redis::{RedisStore, RedisStoreConfig};

use fleets::{
    Fleet, Run, assert_held_for_a_period, assert_new_generation, most_in_a_window, wall_clock_us,
};
use nodes::Sentinels;

#[test]
fn a_fleet_waits_out_the_new_generation_of_a_sentinel_failover_without_overshoot() {
    let Some(binary) = nodes::redis_server(
        "a_fleet_waits_out_the_new_generation_of_a_sentinel_failover_without_overshoot",
    ) else {
        return;
    };
    let mut set = Sentinels::start(&binary, "tollgate-test");
    let url = set.url();
    let namespace = common::namespace("sentinel-fleet");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = runtime
        .block_on(RedisStore::connect(RedisStoreConfig {
            url: url.clone(),
            namespace: namespace.clone(),
            fail_open: false,
            allow_eviction: false,
            module: tollgate_redis::Module::Auto,
            timeout: Duration::from_secs(5),
            keys_per_limit_max: 100_000,
        }))
        .expect("connect through the Sentinels");
    runtime
        .block_on(store.begin_new_namespace())
        .expect("a new namespace");
    let run = Run {
        name: "vendor".into(),
        limit: 20,
        period_ms: 500,
        acquirers: 50,
        duration_ms: 12_000,
        algorithm: "sliding",
    };
    let fleet = Fleet::start(&url, &namespace, &run, &[None; 4]);
    std::thread::sleep(Duration::from_millis(2_000));
    // The generation the old master wrote, read before the fault.
    let before = generation(&runtime, &store).expect("a generation before the kill");
    let old_run = set.master.info_field("server", "run_id").expect("run id");
    assert!(before.owner.run.starts_with(&old_run), "{before:?}");
    let old_master = set.master.port;
    let killed_at_us = wall_clock_us();
    set.master.kill();
    nodes::wait_until(Duration::from_secs(30), "the Sentinels to promote", || {
        set.master_port() == Some(set.replica.port)
    });
    let (grants, errors) = fleet.collect_by_limit();
    let times = &grants["vendor"];
    let most = most_in_a_window(times, run.period_ms * 1_000, run.algorithm);
    eprintln!(
        "sentinel failover: {} grants, at most {most} in one period (limit {}), {errors} errors seen by callers",
        times.len(),
        run.limit
    );
    assert!(most <= run.limit, "{most} grants in one period");
    assert_ne!(set.master_port(), Some(old_master));
    // The promoted replica's generation is its own, born after the kill: the quarantine is
    // judged against it. Served before the kill, nothing inside one period of the new birth,
    // served again after it.
    let after = generation(&runtime, &store).expect("a generation after the failover");
    assert_new_generation(&before, &after, killed_at_us);
    let new_run = set.replica.info_field("server", "run_id").expect("run id");
    assert!(
        after.owner.run.starts_with(&new_run),
        "the generation is not the promoted replica's: {after:?}"
    );
    assert_held_for_a_period(times, killed_at_us, after.born_us, run.period_ms);
}

/// The generation that guards the limit's slot, read from the master now.
fn generation(runtime: &tokio::runtime::Runtime, store: &RedisStore) -> Option<Generation> {
    runtime
        .block_on(store.generation(CounterId {
            limit: "vendor",
            key: None,
        }))
        .expect("the generation can be read")
}
