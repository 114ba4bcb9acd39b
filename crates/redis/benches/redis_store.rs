//! Decisions per second and latency through the Redis store, next to the physical ceiling of
//! the same Redis: `redis-benchmark` running a trivial `EVALSHA` (a script returning 1) with the
//! same number of connections, in the same run. Also: Redis commands per decision (from
//! `INFO commandstats`), what quota leasing saves, and what a limit counted per key costs: a
//! decision on a key that has a counter, and a new key's first decision (which has the key
//! admitted to its limit's budget).
//!
//! `cargo bench -p tollgate-redis --bench redis_store` (Redis from TOLLGATE_TEST_REDIS, else
//! 127.0.0.1:6379; `redis-benchmark` on the PATH). A wall-clock benchmark: run it on a quiet
//! machine and read the ratios, which the noise affects less than the absolute numbers.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::Store;
use tollgate::{Algorithm, Limit, Limiter, LimiterConfig, PermitSecret, Policy, Request, Reserve};
use tollgate_redis::{LeasingConfig, LeasingStore, RedisStore, RedisStoreConfig};

const RUN: Duration = Duration::from_secs(3);
const CALLERS: [usize; 3] = [1, 8, 64];

struct Figures {
    per_second: f64,
    p50_us: u64,
    p99_us: u64,
    decisions: u64,
}

/// `refundable`: false for `Request::refundable(false)`, whose grants record no reservation.
async fn measure(limiter: &Limiter, callers: usize, refundable: bool) -> Figures {
    measure_keys(limiter, "bench", callers, refundable, |_| None).await
}

/// As `measure`, on `limit`, the `n`th request of each caller keyed by `key(n)`.
async fn measure_keys(
    limiter: &Limiter,
    limit: &'static str,
    callers: usize,
    refundable: bool,
    key: fn(u64) -> Option<String>,
) -> Figures {
    let end = Instant::now() + RUN;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let limiter = limiter.clone();
        let caller = tasks.len() as u64;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(100_000);
            let mut n = caller << 32;
            while Instant::now() < end {
                let key = key(n);
                n += 1;
                let asked = Instant::now();
                let mut request = Request::new(limit).refundable(refundable);
                if let Some(key) = key.as_deref() {
                    request = request.key(key);
                }
                let outcome = limiter.try_acquire(&request).await;
                latencies.push(asked.elapsed().as_micros() as u64);
                assert!(
                    outcome.expect("store answers").is_granted(),
                    "the bench limit denied"
                );
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("task"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
    Figures {
        per_second: latencies.len() as f64 / elapsed,
        p50_us: at(0.50),
        p99_us: at(0.99),
        decisions: latencies.len() as u64,
    }
}

fn redis_cli(host: &str, port: &str, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// `redis-benchmark` on a trivial EVALSHA with `callers` connections: requests per second.
fn ceiling(host: &str, port: &str, sha: &str, callers: usize) -> f64 {
    let requests = (60_000 * callers.min(8)).to_string();
    let output = Command::new("redis-benchmark")
        .args([
            "-h",
            host,
            "-p",
            port,
            "-q",
            "-n",
            &requests,
            "-c",
            &callers.to_string(),
        ])
        .args(["EVALSHA", sha, "0"])
        .output()
        .expect("redis-benchmark runs");
    let text = String::from_utf8_lossy(&output.stdout);
    // "EVALSHA ... 0: 81234.56 requests per second, p50=0.303 msec"
    text.rsplit('\r')
        .find_map(|part| {
            let (_, rest) = part.split_once(": ")?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .unwrap_or(0.0)
}

/// `(calls, usec)` of script calls (EVALSHA and FCALL) from `INFO commandstats`: Redis's own
/// CPU time in the scripts, which the client's share of the machine does not affect.
fn evalsha_stats(host: &str, port: &str) -> (u64, u64) {
    let stats = redis_cli(host, port, &["INFO", "commandstats"]);
    let field = |command: &str, name: &str| -> u64 {
        stats
            .lines()
            .find(|line| line.starts_with(command))
            .and_then(|line| line.split(&format!("{name}=")).nth(1))
            .and_then(|rest| rest.split(',').next())
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    };
    let both = |name: &str| field("cmdstat_evalsha:", name) + field("cmdstat_fcall:", name);
    (both("calls"), both("usec"))
}

fn evalsha_calls(host: &str, port: &str) -> u64 {
    evalsha_stats(host, port).0
}

/// Every command Redis has run, from `INFO stats`, those the script runs with `redis.call`
/// included: what one decision costs in Redis commands.
fn commands_processed(host: &str, port: &str) -> u64 {
    redis_cli(host, port, &["INFO", "stats"])
        .lines()
        .find_map(|line| line.strip_prefix("total_commands_processed:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// Microseconds of Redis CPU per script call between two readings.
fn usec_per_call(before: (u64, u64), after: (u64, u64)) -> f64 {
    (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64
}

/// Microseconds of Redis CPU in script calls between two readings, per decision: a call may
/// decide several (the store's batching).
fn usec_per_decision(before: (u64, u64), after: (u64, u64), decisions: u64) -> f64 {
    (after.1 - before.1) as f64 / decisions.max(1) as f64
}

fn limiter_on(store: Arc<dyn Store>, policy: Policy) -> Limiter {
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_secs(10),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    limiter.set_limit(Limit::new("bench", policy, None).expect("valid"));
    // Counted per key, with a budget no run fills: a new key's first decision is admitted. A
    // window of a minute, so that no key's cover runs out within a run (a key in steady use
    // moves its cover about once a window; see `tally.rs`).
    let per_key = Policy::rate(
        1_000_000_000,
        60_000_000,
        0,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid");
    for name in ["bench-known", "bench-new"] {
        let limit = Limit::new(name, per_key, Some("user"))
            .and_then(|limit| limit.with_keys_max(Some(100_000_000)))
            .expect("valid");
        limiter.set_limit(limit);
    }
    limiter
}

/// One of 1,000 keys, each used before the run.
fn known_key(n: u64) -> Option<String> {
    Some(format!("user-{:04}", n % 1_000))
}

/// A key no decision used before.
fn new_key(n: u64) -> Option<String> {
    Some(format!("new-{}-{n}", std::process::id()))
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: check it builds, no more.
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("redis_store: run with `cargo bench` to measure");
        return;
    }
    let url =
        std::env::var("TOLLGATE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let address = url.trim_start_matches("redis://").trim_end_matches('/');
    let address = address.split('/').next().unwrap_or("127.0.0.1:6379");
    let (host, port) = address.split_once(':').unwrap_or((address, "6379"));
    let sha = redis_cli(host, port, &["SCRIPT", "LOAD", "return 1"]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let namespace = format!("bench-{}", std::process::id());
    let store = runtime
        .block_on(RedisStore::connect(RedisStoreConfig {
            url: url.clone(),
            namespace,
            fail_open: false,
            allow_eviction: false,
            module: tollgate_redis::Module::Auto,
            timeout: Duration::from_secs(5),
            keys_per_limit_max: 100_000,
        }))
        .expect("connect to Redis");
    // A fresh namespace, not a lost one: skip the recovery period (see the store's docs, G6).
    runtime
        .block_on(store.begin_new_namespace())
        .expect("declare the namespace new");
    let redis_store = Arc::new(store);
    let store: Arc<dyn Store> = redis_store.clone();
    // A limit that never binds: what is measured is the decision, not the waiting.
    let never_binds = Policy::rate(
        1_000_000_000,
        1_000_000,
        50_000,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid");
    let limiter = limiter_on(store.clone(), never_binds);

    for refundable in [true, false] {
        if refundable {
            println!("refundable requests (each grant records a reservation for commit):");
        } else {
            println!("Request::refundable(false) (no reservation recorded):");
        }
        println!(
            "callers | tollgate decisions/s | p50 us | p99 us | EVALSHA ceiling/s | ratio | Redis us per decision | per trivial EVALSHA"
        );
        for callers in CALLERS {
            let before = evalsha_stats(host, port);
            let commands_before = commands_processed(host, port);
            let figures = runtime.block_on(measure(&limiter, callers, refundable));
            let after = evalsha_stats(host, port);
            // Less the INFO commands this bench itself sends.
            let commands = commands_processed(host, port) - commands_before - 2;
            let calls = after.0 - before.0;
            let ceiling = ceiling(host, port, &sha, callers);
            let trivial = usec_per_call(after, evalsha_stats(host, port));
            println!(
                "{callers:>7} | {:>20.0} | {:>6} | {:>6} | {:>17.0} | {:.2} | {:>5.2} | {:>5.2}   (script calls per decision: {:.3}; commands Redis ran per decision, those inside the script included: {:.3})",
                figures.per_second,
                figures.p50_us,
                figures.p99_us,
                ceiling,
                figures.per_second / ceiling,
                usec_per_decision(before, after, figures.decisions),
                trivial,
                calls as f64 / figures.decisions as f64,
                commands as f64 / figures.decisions as f64
            );
        }
    }

    println!("a limit counted per key (refundable requests):");
    println!(
        "keys | callers | tollgate decisions/s | p50 us | p99 us | Redis us per decision | Redis commands per decision"
    );
    runtime.block_on(async {
        for n in 0..1_000 {
            let key = known_key(n).expect("a key");
            let request = Request::new("bench-known").key(&key);
            let outcome = limiter.try_acquire(&request).await;
            assert!(outcome.expect("store answers").is_granted());
        }
    });
    for (keys, limit, key) in [
        (
            "known",
            "bench-known",
            known_key as fn(u64) -> Option<String>,
        ),
        ("new", "bench-new", new_key),
    ] {
        for callers in [1, 8] {
            let before = evalsha_stats(host, port);
            let commands_before = commands_processed(host, port);
            let figures = runtime.block_on(measure_keys(&limiter, limit, callers, true, key));
            let after = evalsha_stats(host, port);
            let commands = commands_processed(host, port) - commands_before - 2;
            println!(
                "{keys:>5} | {callers:>7} | {:>20.0} | {:>6} | {:>6} | {:>5.2} | {:.3}",
                figures.per_second,
                figures.p50_us,
                figures.p99_us,
                usec_per_decision(before, after, figures.decisions),
                commands as f64 / figures.decisions as f64
            );
        }
    }

    // One caller, the store's batching off and on in turn: a lone decision must not wait
    // longer with batching on. Alternated, so that a drift of the machine hits both alike.
    println!(
        "one caller, batching off and on in turn ({} s each):",
        RUN.as_secs()
    );
    println!("batching | decisions/s | p50 us | p99 us");
    let mut p50s = [Vec::new(), Vec::new()];
    for turn in 0..6 {
        let batching = turn % 2 == 1;
        redis_store.set_batching(batching);
        let figures = runtime.block_on(measure(&limiter, 1, false));
        println!(
            "{:>8} | {:>11.0} | {:>6} | {:>6}",
            if batching { "on" } else { "off" },
            figures.per_second,
            figures.p50_us,
            figures.p99_us
        );
        p50s[usize::from(batching)].push(figures.p50_us);
    }
    redis_store.set_batching(true);
    let median = |values: &mut Vec<u64>| {
        values.sort_unstable();
        values[values.len() / 2]
    };
    let (off, on) = (median(&mut p50s[0]), median(&mut p50s[1]));
    println!(
        "median p50: off {off} us, on {on} us ({:.2}x)",
        on as f64 / off.max(1) as f64
    );

    let leasing = runtime.block_on(async {
        LeasingStore::new(
            store.clone(),
            LeasingConfig {
                block_lifetime: Duration::from_millis(50),
                block_units_max: 256,
            },
        )
    });
    let leased = limiter_on(leasing.clone(), never_binds);
    println!("with leasing (blocks of up to 256 units, 50 ms):");
    println!("callers | tollgate decisions/s | p50 us | p99 us | Redis calls per decision");
    for callers in CALLERS {
        let before = evalsha_calls(host, port);
        let figures = runtime.block_on(measure(&leased, callers, true));
        let calls = evalsha_calls(host, port) - before;
        println!(
            "{callers:>7} | {:>20.0} | {:>6} | {:>6} | {:.4}",
            figures.per_second,
            figures.p50_us,
            figures.p99_us,
            calls as f64 / figures.decisions as f64
        );
    }
}
