//! The server's `redis_module` setting, over the real binary: `on` refuses a Redis without the
//! module, saying it is not loaded; a value other than auto, on or off is refused by flag,
//! environment or file, naming the setting and the three values; and on a Redis with the
//! module this build made loaded, `on` decides an acquire through it and `off` does not, by
//! Redis's own count of the commands it ran (`INFO commandstats`), which the server cannot
//! make up. Every Redis here is a private `redis-server` on a port of its own.

mod common;
#[path = "../../redis/tests/nodes/mod.rs"]
mod nodes;

use std::path::PathBuf;

use common::{Options, Server, post, put_limit, refused_start};
use nodes::Single;

/// The module's shared library as this test's build made it (the dev-dependency on
/// `tollgate-redis-module` puts it beside the test binary, in `target/<profile>/deps`).
fn module_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    let module = exe.parent().expect("its directory").join(format!(
        "{}tollgate_redis_module{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    assert!(
        module.exists(),
        "{} missing: cargo builds it with this test",
        module.display()
    );
    module
}

/// Calls Redis ran of `command` (`tollgate.acquire`, `fcall`), by `INFO commandstats`.
fn calls(redis: &Single, command: &str) -> u64 {
    let stats = redis
        .node
        .query(&["INFO", "commandstats"])
        .expect("INFO commandstats");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|fields| {
            fields
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|calls| calls.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// `on` against a Redis without the module: the server does not start, and says which setting
/// and why.
#[test]
fn on_refuses_a_redis_without_the_module() {
    let test = "on_refuses_a_redis_without_the_module";
    let Some(binary) = nodes::redis_server(test) else {
        return;
    };
    let redis = Single::start(&binary, &[]);
    let url = redis.node.url();
    let (status, log) = refused_start(&["--store", &url, "--redis-module", "on"], &[]);
    assert!(!status.success(), "{log}");
    for says in ["redis_module", "not loaded", "TOLLGATE.VERSION"] {
        assert!(log.contains(says), "the refusal says {says:?}: {log}");
    }
}

/// How a setting is given: its name, the arguments and the environment that give it.
type Way<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>);

/// A value other than auto, on or off, by flag, environment or file, is refused before the
/// store is reached, naming the setting and the values it takes.
#[test]
fn a_bad_redis_module_is_refused_naming_the_setting() {
    // Nothing listens here: a server that got past its settings would fail on the store
    // instead, without naming redis_module.
    let store = "redis://127.0.0.1:1/";
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("tollgate.toml");
    std::fs::write(&file, "redis_module = \"bogus\"\n").expect("write the config file");
    let file = file.display().to_string();
    let ways: [Way; 3] = [
        (
            "flag",
            vec!["--store", store, "--redis-module", "bogus"],
            vec![],
        ),
        (
            "environment",
            vec!["--store", store],
            vec![("TOLLGATE_REDIS_MODULE", "bogus")],
        ),
        ("file", vec!["--store", store, "--config", &file], vec![]),
    ];
    for (way, args, env) in ways {
        let (status, log) = refused_start(&args, &env);
        assert!(!status.success(), "{way}: {log}");
        for says in ["redis_module", "bogus", "auto, on, off"] {
            assert!(
                log.contains(says),
                "{way}: the refusal says {says:?}: {log}"
            );
        }
    }
}

/// On a Redis with the module loaded, `on` starts and an acquire (one GCRA limit, one key) is
/// decided by `TOLLGATE.ACQUIRE`; `off` on the same Redis decides the same acquires by the
/// function library, sending the module none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_decides_through_the_module_and_off_does_not() {
    let test = "on_decides_through_the_module_and_off_does_not";
    let Some(binary) = nodes::redis_server(test) else {
        return;
    };
    let module = module_path().display().to_string();
    let redis = Single::start(&binary, &["--loadmodule", &module]);
    let url = redis.node.url();
    let body = r#"{"limits":["per-user"],"key":"u1"}"#;
    let rule = r#"{"kind":"rate","limit":100,"period_ms":60000,"algorithm":"gcra","per":"user"}"#;

    let server = Server::start_with(Options {
        args: vec!["--store", &url, "--redis-module", "on"],
        ..Options::default()
    });
    put_limit(&server, "per-user", rule).await;
    let before = calls(&redis, "tollgate.acquire");
    for _ in 0..3 {
        let answer = post(&server.anonymous(), "/v1/acquire", body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let through_module = calls(&redis, "tollgate.acquire") - before;
    assert!(
        through_module >= 3,
        "on: Redis ran TOLLGATE.ACQUIRE {through_module} times for 3 acquires; log:\n{}",
        server.log()
    );
    assert!(
        server
            .log()
            .contains("operations decided by the Redis module"),
        "on: the log says which path is in use: {}",
        server.log()
    );
    drop(server);

    let server = Server::start_with(Options {
        args: vec!["--store", &url, "--redis-module", "off"],
        ..Options::default()
    });
    put_limit(&server, "per-user", rule).await;
    let (module_before, library_before) = (
        calls(&redis, "tollgate.acquire"),
        calls(&redis, "fcall") + calls(&redis, "evalsha"),
    );
    for _ in 0..3 {
        let answer = post(&server.anonymous(), "/v1/acquire", body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(
        calls(&redis, "tollgate.acquire"),
        module_before,
        "off: the module decided an acquire; log:\n{}",
        server.log()
    );
    assert!(
        calls(&redis, "fcall") + calls(&redis, "evalsha") >= library_before + 3,
        "off: the function library decided the acquires"
    );
    assert!(
        server
            .log()
            .contains("operations decided by the function library"),
        "off: the log says which path is in use: {}",
        server.log()
    );
}
