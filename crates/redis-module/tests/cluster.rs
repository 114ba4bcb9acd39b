//! The module on a Redis Cluster of three masters (each with a replica), loaded on every node:
//! the store with the module `on` passes the conformance suite's rate limit cases, and each
//! master decided acquires natively (its own count of `TOLLGATE.ACQUIRE` calls, which the
//! store cannot fake); a cluster with one master lacking the module is refused with `on`,
//! naming that master, and decided by the library with `auto`.

mod common;
#[path = "../../redis/tests/nodes/mod.rs"]
mod nodes;

use std::sync::Arc;
use std::time::Duration;

use tollgate_conformance::Stores;
use tollgate_redis::{Module, RedisStore, RedisStoreConfig};

fn config(url: &str, namespace: &str, module: Module) -> RedisStoreConfig {
    RedisStoreConfig {
        url: url.to_owned(),
        namespace: namespace.to_owned(),
        fail_open: false,
        allow_eviction: false,
        timeout: Duration::from_secs(10),
        keys_per_limit_max: 100_000,
        module,
    }
}

async fn connect(url: &str, namespace: &str, module: Module) -> tollgate::Result<RedisStore> {
    RedisStore::connect(config(url, namespace, module)).await
}

/// `TOLLGATE.ACQUIRE` calls a node has run, by its own `INFO commandstats`.
fn native_calls(node: &nodes::Node) -> u64 {
    let stats = node.query(&["INFO", "commandstats"]).expect("INFO");
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_tollgate.acquire:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

#[test]
fn on_a_cluster_every_master_decides_natively() {
    let Some(binary) = nodes::redis_server("on_a_cluster_every_master_decides_natively") else {
        return;
    };
    let module = common::module_path().display().to_string();
    let extra = [
        "--loadmodule".to_owned(),
        module,
        "--enable-module-command".to_owned(),
        "local".to_owned(),
    ];
    let cluster = nodes::Cluster::start_with(&binary, 3, &extra);
    let url = cluster.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut made = Vec::new();
    let mut stores = |namespace: &str| {
        let (first, second) = runtime.block_on(async {
            let first = connect(&url, namespace, Module::On)
                .await
                .expect("the module on, on every master");
            assert!(first.is_cluster() && first.module_in_use());
            first.begin_new_namespace().await.expect("a new namespace");
            let second = connect(&url, namespace, Module::On)
                .await
                .expect("a second store");
            (Arc::new(first), Arc::new(second))
        });
        made.push(first.clone());
        made.push(second.clone());
        Stores { first, second }
    };
    use tollgate_conformance as suite;
    runtime.block_on(suite::rate_limits_grant_to_the_limit_and_hint_honestly(
        stores("m-rate"),
    ));
    runtime.block_on(suite::several_limits_are_all_or_nothing(stores(
        "m-several",
    )));
    runtime.block_on(suite::commit_refunds_unused_units_once(stores("m-commit")));
    let decided: u64 = made.iter().map(|store| store.module_acquires()).sum();
    for store in &made {
        for (reason, count) in store.module_refusals() {
            assert!(
                tollgate_redis::REFUSED_IN_REDIS.contains(&reason.as_str()),
                "the module refused {count} acquire(s) the store should not have sent: {reason}"
            );
        }
    }
    let by_master: Vec<u64> = cluster.masters().into_iter().map(native_calls).collect();
    eprintln!("decided natively: {decided} by the stores' count, {by_master:?} by the masters'");
    assert!(decided > 0, "the module decided acquires");
    // Each call ran once, on a master; a batch is one call for several acquires.
    let calls: u64 = by_master.iter().sum();
    assert!(
        calls > 0 && calls <= decided,
        "{calls} TOLLGATE.ACQUIRE calls on the masters for {decided} native acquires"
    );

    // Sent where the store sends them: no master answered a redirection (each answer would
    // have cost a second round trip).
    for master in cluster.masters() {
        let errors = master.query(&["INFO", "errorstats"]).expect("INFO");
        assert!(
            !errors.contains("errorstat_MOVED") && !errors.contains("errorstat_ASK"),
            "master {} redirected: {errors}",
            master.port
        );
    }
    // A master that does not serve the keys' slot redirects, as for the library's FCALL: the
    // module's keys are known to Redis Cluster.
    let key = "tg:{x}:keys-here";
    let slot = cluster.keyslot(key);
    let serving = cluster.nodes[cluster.master_of(slot)].port;
    let elsewhere = cluster
        .masters()
        .into_iter()
        .find(|master| master.port != serving)
        .expect("another master");
    let answer = nodes::query(elsewhere.port, &["TOLLGATE.ACQUIRE", "1", key, "packed"])
        .unwrap_or_else(|error| error);
    assert!(answer.contains("MOVED"), "{answer}");

    // One master without the module: `on` refuses to start naming it, `auto` uses the library.
    let without = cluster.masters()[1].port;
    nodes::query(without, &["MODULE", "UNLOAD", "tollgate"]).expect("MODULE UNLOAD");
    let refusal = match runtime.block_on(connect(&url, "m-partly", Module::On)) {
        Ok(_) => panic!("module = on started with a master lacking the module"),
        Err(error) => error.to_string(),
    };
    assert!(
        refusal.contains("not loaded on every master") && refusal.contains(&without.to_string()),
        "{refusal}"
    );
    let store = runtime
        .block_on(connect(&url, "m-partly", Module::Auto))
        .expect("auto starts");
    assert!(!store.module_in_use());
}
