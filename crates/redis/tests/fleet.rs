//! Fleets of OS processes sharing one limit through Redis. Each process prints the decision
//! time of every grant it received (Redis `TIME`); this test gathers those lines and counts every
//! window itself. The store's own counters are never read.
//!
//! - four processes x 50 acquirers over 200 periods: zero overshoot, and the utilisation;
//! - Redis flushed, then killed and restarted (a private server on its own port), mid-run: G6;
//! - processes whose clocks are off by seconds (libfaketime): G1 still holds, as decisions use
//!   Redis's clock;
//! - afterwards, no Tollgate key without a TTL.

mod common;
mod fleets;

use fleets::{Fleet, Run, faketime_library, most_in_a_window};

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn assert_no_key_without_ttl(url: &str, namespace: &str) {
    let client = redis::Client::open(url).expect("url");
    let mut connection = client.get_connection().expect("connect");
    let pattern = format!("tg:{{*}}:{namespace}:*");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query(&mut connection)
        .expect("keys");
    assert!(!keys.is_empty(), "the run left no state at all");
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut connection)
            .expect("pttl");
        // -2: expired between KEYS and PTTL; -1 would be a key without a TTL.
        assert!(ttl != -1, "{key} has no TTL");
    }
}

#[test]
fn four_processes_of_fifty_acquirers_never_overshoot() {
    let Some(url) = common::redis_url("four_processes_of_fifty_acquirers_never_overshoot") else {
        return;
    };
    let namespace = common::namespace("fleet");
    declare_fresh_blocking(&url, &namespace);
    let run = Run {
        name: "vendor".into(),
        limit: 20,
        period_ms: 100,
        acquirers: 50,
        duration_ms: 20_000,
        algorithm: "sliding",
    };
    let fleet = Fleet::start(&url, &namespace, &run, &[None, None, None, None]);
    let (grants, errors) = fleet.collect();
    assert_eq!(errors, 0, "Redis was up the whole time");
    let most = most_in_a_window(&grants, run.period_ms * 1_000, run.algorithm);
    assert!(
        most <= run.limit,
        "{most} grants in one period > {}",
        run.limit
    );
    let span_us = grants.last().copied().unwrap_or(0) - grants.first().copied().unwrap_or(0);
    let periods = span_us as f64 / (run.period_ms * 1_000) as f64;
    let utilisation = grants.len() as f64 / (periods * run.limit as f64);
    println!(
        "fleet: {} grants over {periods:.0} periods, at most {most} per period, utilisation {:.1}%",
        grants.len(),
        100.0 * utilisation
    );
    assert!(periods >= 150.0, "the fleet ran only {periods:.0} periods");
    // Demand (200 acquirers) exceeds supply many times over; utilisation below half would mean
    // the waiting is broken, not that the machine is slow.
    assert!(utilisation > 0.5, "utilisation {:.1}%", 100.0 * utilisation);
    assert_no_key_without_ttl(&url, &namespace);
}

#[test]
fn processes_with_skewed_clocks_keep_the_limit() {
    let Some(url) = common::redis_url("processes_with_skewed_clocks_keep_the_limit") else {
        return;
    };
    if faketime_library().is_none() {
        eprintln!(
            "SKIPPED processes_with_skewed_clocks_keep_the_limit: libfaketime is not installed"
        );
        return;
    }
    let namespace = common::namespace("skew");
    declare_fresh_blocking(&url, &namespace);
    let run = Run {
        name: "vendor".into(),
        limit: 10,
        period_ms: 100,
        acquirers: 20,
        duration_ms: 5_000,
        algorithm: "fixed",
    };
    let fleet = Fleet::start(
        &url,
        &namespace,
        &run,
        &[Some("+7s"), Some("-5s"), None, Some("+3s")],
    );
    let (grants, errors) = fleet.collect();
    assert_eq!(errors, 0);
    assert!(grants.len() > 100, "only {} grants", grants.len());
    let most = most_in_a_window(&grants, run.period_ms * 1_000, run.algorithm);
    assert!(
        most <= run.limit,
        "{most} grants in one window > {}",
        run.limit
    );
    assert_no_key_without_ttl(&url, &namespace);
}

/// A Redis server of this test's own, so it can be flushed and killed without disturbing
/// other tests.
struct PrivateRedis {
    port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    fn start() -> Option<PrivateRedis> {
        let port = free_port();
        let mut redis = PrivateRedis { port, child: None };
        redis.spawn()?;
        Some(redis)
    }

    fn spawn(&mut self) -> Option<()> {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Some(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

#[test]
fn losing_redis_state_mid_run_never_regrants() {
    if common::redis_url("losing_redis_state_mid_run_never_regrants").is_none() {
        return;
    }
    let Some(mut redis) = PrivateRedis::start() else {
        eprintln!("SKIPPED losing_redis_state_mid_run_never_regrants: cannot start redis-server");
        return;
    };
    let url = redis.url();
    let namespace = common::namespace("loss");
    declare_fresh_blocking(&url, &namespace);
    let run = Run {
        name: "vendor".into(),
        limit: 10,
        period_ms: 300,
        acquirers: 20,
        duration_ms: 9_000,
        algorithm: "sliding",
    };
    let fleet = Fleet::start(&url, &namespace, &run, &[None, None, None, None]);
    std::thread::sleep(Duration::from_secs(3));
    {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut connection = client.get_connection().expect("connect");
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut connection)
            .expect("flush");
    }
    std::thread::sleep(Duration::from_secs(3));
    redis.kill();
    std::thread::sleep(Duration::from_millis(300));
    redis.spawn().expect("restart redis-server");
    let (grants, errors) = fleet.collect();
    println!(
        "loss: {} grants, {errors} errors while Redis was down",
        grants.len()
    );
    assert!(errors > 0, "the workers never noticed Redis going away");
    let most = most_in_a_window(&grants, run.period_ms * 1_000, run.algorithm);
    assert!(
        most <= run.limit,
        "{most} grants in one period across a loss > {}",
        run.limit
    );
    // Grants resumed after each loss.
    let last = grants.last().copied().unwrap_or(0);
    let first = grants.first().copied().unwrap_or(0);
    assert!(
        last - first > 7_000_000,
        "grants stopped for good after a loss"
    );
}

fn declare_fresh_blocking(url: &str, namespace: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(common::declare_fresh(url, namespace));
}
