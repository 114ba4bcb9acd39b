//! Fleets of OS processes sharing one limit through Redis. Each process prints the decision
//! time of every grant it received (Redis `TIME`); this test gathers those lines and counts every
//! window itself. The store's own counters are never read. Where the workers' clocks are skewed,
//! their printed times are not trusted either: the test times each grant itself.
//!
//! - four processes x 50 acquirers over 200 periods: zero overshoot (the utilisation printed);
//! - Redis flushed, then killed and restarted (a private server on its own port), mid-run: G6;
//! - processes whose clocks are off by seconds (libfaketime), stepped by this test, each step
//!   many asks at once so the Redis store batches them, and every grant timed on this test's
//!   own clock: G1 holds for sliding, fixed and GCRA limits, as decisions, alone or batched,
//!   use Redis's clock (G5);
//! - afterwards, no Tollgate key without a TTL.

#[path = "../../redis/tests/common.rs"]
mod common;
mod fleets;

use fleets::{
    Asks, Bracket, Fleet, Run, SteppedFleet, faketime_library, most_certainly_within,
    most_in_a_window,
};

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
    // Utilisation is printed, not judged: how much of the limit a loaded 2-core machine uses is
    // speed, and speed is measured in benchmarks. A fleet whose waiting were broken (no wake-up
    // after the first period) would hold one period's grants over twenty seconds.
    assert!(
        grants.len() as u64 > 10 * run.limit,
        "{} grants in {} ms: the waiters were not woken",
        grants.len(),
        run.duration_ms
    );
    assert_no_key_without_ttl(&url, &namespace);
}

/// Worker clocks for the skew tests, slowest first: libfaketime offsets, `None` the true time.
const SKEWS: [Option<&str>; 4] = [Some("-5s"), None, Some("+3s"), Some("+7s")];

/// Processes whose clocks are seconds apart, judged by this test's own clock (G1, G5). Each
/// round has every worker ask for four times the limit, all at once, so that its store sends
/// the first asks alone and batches the rest (`tollgate_redis`'s `batch.rs`: two calls in
/// flight per slot, then the next call takes what waits); every step's batches are counted by
/// the worker and must not be none, so this test cannot stop driving batches unseen. Workers
/// ask first in turn (the slowest clock first in the first round, then rotated, so each worker
/// leads once), then all at once. Every grant is bracketed by this process's monotonic clock
/// (`SteppedFleet`), and a round starts a period after the last one ended, so each round finds
/// the limit empty. Decided on Redis's clock, the leading worker gets the whole limit and nobody
/// else a unit; decided on each worker's clock (alone or in a batch), a slower worker's grants
/// look a period old to every faster one, and each worker of the first round would get the
/// whole limit again.
///
/// `per_span_max`: the most units one interval shorter than a period may hold by the
/// algorithm's bound.
fn skewed_fleet_in_rounds(test: &str, algorithm: &'static str, per_span_max: fn(u64) -> u64) {
    let Some(url) = common::redis_url(test) else {
        return;
    };
    if faketime_library().is_none() {
        tollgate::conformance::skipped(&format!(
            "{test}: libfaketime is not installed (libfaketimeMT.so.1 at none of the paths \
             fleets::faketime_library looks at)"
        ));
        return;
    }
    let namespace = common::namespace(test);
    declare_fresh_blocking(&url, &namespace);
    let (limit, period_ms) = (5, 1_000);
    let asks = 4 * limit;
    let period_us = period_ms * 1_000;
    // Redis reads the realtime clock, this test the monotonic one; their rates differ by at most
    // NTP's slew (500 ppm): a period measured here is taken a thousandth shorter, or longer.
    let slew_us = period_us / 1_000;
    let judged_us = period_us - slew_us;
    let mut fleet = SteppedFleet::start(
        &url,
        &namespace,
        "vendor",
        (limit, period_ms),
        algorithm,
        &SKEWS,
    );
    let mut all = Vec::new();
    let mut served = [0u64; SKEWS.len()];
    let rounds = SKEWS.len() + 2;
    for round in 0..rounds {
        if let Some(last) = all.last().map(|b: &Bracket| b.before_us) {
            // Every earlier grant was decided by `last`: a period after it, none counts.
            let wait_us = (last + period_us + slew_us).saturating_sub(fleet.now_us());
            std::thread::sleep(Duration::from_micros(wait_us));
        }
        let started_us = fleet.now_us();
        let mut order: Vec<usize> = (0..SKEWS.len()).collect();
        order.rotate_left(round % SKEWS.len());
        let step = if round < SKEWS.len() {
            fleet.in_turn(&order, Asks::AtOnce, asks)
        } else {
            fleet.together(Asks::AtOnce, asks)
        };
        let took_us = fleet.now_us() - started_us;
        let units = step.brackets.len() as u64;
        let batched: Vec<u64> = step.batched.iter().map(|&(_, batched)| batched).collect();
        eprintln!(
            "{test}: round {round}, {units} grants in {took_us} us, acquires batched per worker \
             {batched:?}"
        );
        for &(worker, batched) in &step.batched {
            assert!(
                batched > 0,
                "round {round}: the worker with clock {:?} asked {asks} times at once and its \
                 store batched none of them: this test no longer drives batches",
                SKEWS[worker]
            );
        }
        for bracket in &step.brackets {
            served[bracket.worker] += 1;
        }
        all.extend(step.brackets.iter().copied());
        // Safety first: a count above the bound is an overshoot however slow the round was.
        let most = most_certainly_within(&all, judged_us) as u64;
        assert!(
            most <= per_span_max(limit),
            "after round {round}: {most} grants certainly decided within one period on this \
             test's clock, limit {limit} per {period_ms} ms ({algorithm})"
        );
        if round < SKEWS.len() {
            let first = step
                .brackets
                .iter()
                .filter(|b| b.worker == order[0])
                .count() as u64;
            assert_eq!(
                first, limit,
                "round {round}: the worker with clock {:?} found the limit empty but got {first}",
                SKEWS[order[0]]
            );
        }
        // A round as long as a period could span two windows legitimately; it never comes near.
        assert!(
            took_us < judged_us,
            "round {round} took {took_us} us: too slow to be judged against a {period_ms} ms period"
        );
        assert!(
            units >= limit,
            "round {round}: {units} units granted, on an empty limit of {limit}"
        );
    }
    for (worker, units) in served.iter().enumerate() {
        assert!(
            *units > 0,
            "the worker with clock {:?} was never served",
            SKEWS[worker]
        );
    }
    assert_no_key_without_ttl(&url, &namespace);
}

#[test]
fn skewed_worker_clocks_never_put_more_than_the_limit_in_a_sliding_window_on_the_test_clock() {
    // Sliding: any interval of a period holds at most the limit.
    skewed_fleet_in_rounds("skewed_worker_clocks_sliding", "sliding", |limit| limit);
}

#[test]
fn skewed_worker_clocks_never_put_more_than_two_fixed_windows_in_a_period_on_the_test_clock() {
    // Fixed: an interval shorter than a period meets at most two of the store's windows.
    skewed_fleet_in_rounds("skewed_worker_clocks_fixed", "fixed", |limit| 2 * limit);
}

#[test]
fn skewed_worker_clocks_never_put_more_than_a_burst_and_its_refill_in_a_gcra_period() {
    // GCRA with its burst at the limit (the worker's policy): the whole burst at once, then one
    // unit every period / limit, so an interval shorter than a period holds at most the burst
    // and limit - 1 more.
    skewed_fleet_in_rounds("skewed_worker_clocks_gcra", "gcra", |limit| 2 * limit - 1);
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
        tollgate::conformance::skipped(
            "losing_redis_state_mid_run_never_regrants: a redis-server of its own did not start",
        );
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
