//! What writing budgets ahead to the state database costs the embedded default
//! (`MemoryStore::with_write_ahead`, `docs/server.md`, "What each kind of stop keeps"):
//! decisions per second and latency percentiles of `try_acquire` in the library, and of
//! `POST /v1/acquire` over HTTP, at 1 and 10,000 keys, with and without write-ahead, and the
//! state-database transactions and records written per second.
//!
//! - Library: one `Limiter` on a plain `MemoryStore` (no write-ahead), and one on a store made
//!   `with_write_ahead` whose run on a SQLite state database in a temporary directory is begun
//!   as the server begins it (restore, heartbeat, writer). Same limits, same keys, same tasks.
//! - HTTP: the `tollgate serve` this bench was built with (which always writes ahead) and, when
//!   `BENCH_BASELINE_BIN` names another `tollgate` binary (one built before write-ahead), that
//!   one in the same run, alternating rounds.
//!
//! Three cases: one unkeyed counter of a billion a minute (a budget of 125,000,000 units) and
//! 10,000 keys of 100,000 a minute (12,500 units each, recorded again after 6,250 grants),
//! which never deny at the rates reached here, so every decision is a grant; and 10,000 keys
//! of 1,000 a minute (125 units each, recorded again after 63 grants), which the callers
//! drive into denials, so that records are written while timing. Every key is touched once
//! before timing starts; the first decision of a new key (which waits for its first record)
//! is reported apart.
//!
//! Run: `cargo bench -p tollgate-cli --bench write_ahead` (`BENCH_SECONDS`, default 5, per
//! case; `BENCH_ROUNDS`, default 1). Under `cargo test --all-targets` it only smoke-tests
//! itself briefly. Load and server share this machine's cores.

// Shared with the other benches; this one uses part of it.
#[allow(dead_code)]
mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Method;
use tollgate::{
    Algorithm, Clock, Limit, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig,
    MonotonicClock, Outcome, Policy, Request, Reserve,
};
use tollgate_cli::client::Client;
use tollgate_server::BenchMemoryRun;

const MINUTE_US: u64 = 60_000_000;
const TIMEOUT: Duration = Duration::from_secs(30);
const ADMIN_TOKEN: &str = "bench";
/// Concurrent callers, in the library and over HTTP.
const TASKS: usize = 16;

/// One configuration's figures.
struct Figures {
    decisions: usize,
    grants: usize,
    elapsed: Duration,
    /// Latencies of the timed decisions, sorted.
    latencies: Vec<Duration>,
    /// Latencies of each key's first decision, sorted.
    first: Vec<Duration>,
    /// State-database transactions and records committed while timing.
    written: Option<(u64, u64)>,
}

impl Figures {
    fn report(&self, label: &str) {
        let per_second = self.decisions as f64 / self.elapsed.as_secs_f64();
        let written = match self.written {
            Some((batches, records)) => format!(
                "; state DB: {:.0} transactions/s, {:.0} records/s",
                batches as f64 / self.elapsed.as_secs_f64(),
                records as f64 / self.elapsed.as_secs_f64()
            ),
            None => String::new(),
        };
        let grants = self.grants as f64 / self.elapsed.as_secs_f64();
        println!(
            "{label}: {per_second:.0} decisions/s ({grants:.0} grants/s), p50 {:?}, p99 {:?}, p99.9 {:?}; first decision of a new key p50 {:?}, p99 {:?}{written}",
            percentile(&self.latencies, 50.0),
            percentile(&self.latencies, 99.0),
            percentile(&self.latencies, 99.9),
            percentile(&self.first, 50.0),
            percentile(&self.first, 99.0),
        );
    }
}

fn percentile(sorted: &[Duration], percent: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((percent / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn keys(count: usize) -> Vec<Option<String>> {
    if count == 1 {
        return vec![None];
    }
    (0..count)
        .map(|index| Some(format!("user-{index:05}")))
        .collect()
}

/// The limit of a case: `limit` a minute, sliding.
fn policy(limit: u64) -> Policy {
    Policy::rate(limit, MINUTE_US, 0, Algorithm::Sliding, Reserve::default()).expect("a policy")
}

/// Run `one(index)`, which answers the latency of the decision it timed, from `TASKS` tasks for
/// `duration`; each task walks the keys from its own offset. The count of decisions and of
/// grants, the time taken and every latency, sorted.
async fn drive<F, Fut>(
    keys: usize,
    duration: Duration,
    one: F,
) -> (usize, usize, Duration, Vec<Duration>)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (Duration, bool)> + Send,
{
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let one = one.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut grants = 0;
            let mut index = task * keys / TASKS;
            while Instant::now() < deadline {
                let (latency, granted) = one(index).await;
                latencies.push(latency);
                grants += usize::from(granted);
                index = (index + 1) % keys;
            }
            (latencies, grants)
        }));
    }
    let mut latencies = Vec::new();
    let mut grants = 0;
    for task in tasks {
        let (more, granted) = task.await.expect("a task");
        latencies.extend(more);
        grants += granted;
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    (latencies.len(), grants, elapsed, latencies)
}

/// Touch every key once, from `TASKS` tasks: the first decision of each, sorted.
async fn first_touch<F, Fut>(keys: usize, one: F) -> Vec<Duration>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (Duration, bool)> + Send,
{
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let one = one.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            for index in (task..keys).step_by(TASKS) {
                latencies.push(one(index).await.0);
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a task"));
    }
    latencies.sort_unstable();
    latencies
}

/// The library: `try_acquire` of one unit, the permit dropped (a rate grant stays spent).
async fn library(keys_count: usize, limit: u64, ahead: bool, duration: Duration) -> Figures {
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let config = MemoryStoreConfig {
        keys_tracked_max: 1_000_000,
        keys_per_limit_max: 1_000_000,
    };
    let memory = Arc::new(if ahead {
        MemoryStore::with_write_ahead(config, clock.clone())
    } else {
        MemoryStore::new(config, clock.clone())
    });
    let limiter = Limiter::new(memory.clone(), LimiterConfig::default());
    let per = (keys_count > 1).then_some("user");
    limiter.set_limit(Limit::new("bench", policy(limit), per).expect("a limit"));
    let directory = tempfile::tempdir().expect("tempdir");
    let run = if ahead {
        let url = format!("sqlite://{}", directory.path().join("state.db").display());
        Some(
            BenchMemoryRun::begin(&url, memory, clock, &limiter)
                .await
                .expect("a run on the state database"),
        )
    } else {
        None
    };
    let keys = Arc::new(keys(keys_count));
    let one = {
        let limiter = limiter.clone();
        move |index: usize| {
            let limiter = limiter.clone();
            let keys = keys.clone();
            async move {
                let mut request = Request::new("bench");
                if let Some(key) = &keys[index] {
                    request = request.key(key);
                }
                let asked = Instant::now();
                let outcome = limiter.try_acquire(&request).await.expect("a decision");
                (asked.elapsed(), matches!(outcome, Outcome::Granted(_)))
            }
        }
    };
    let first = first_touch(keys_count, one.clone()).await;
    let before = run.as_ref().map(BenchMemoryRun::written);
    let (decisions, grants, elapsed, latencies) = drive(keys_count, duration, one).await;
    let written = run.as_ref().map(BenchMemoryRun::written).zip(before).map(
        |((batches, records), (batches_before, records_before))| {
            (batches - batches_before, records - records_before)
        },
    );
    if let Some(run) = run {
        run.end().await;
    }
    Figures {
        decisions,
        grants,
        elapsed,
        latencies,
        first,
        written,
    }
}

fn start_server(binary: &str, directory: &std::path::Path) -> (common::Process, String) {
    let mut command = Command::new(binary);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--log", "warn"])
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .current_dir(directory);
    common::start_serving(command)
}

/// The state database's counters on `/metrics` (transactions, records), if it has them.
async fn written_by(admin: &Client) -> Option<(u64, u64)> {
    let metrics = admin.send(Method::GET, "/metrics", None).await.ok()?;
    let text = metrics.text();
    let read = |prefix: &str| {
        text.lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse::<f64>().ok())
            .map(|value| value as u64)
    };
    Some((
        read("tollgate_state_writes_total{outcome=\"committed\"}")?,
        read("tollgate_state_records_written_total")?,
    ))
}

/// Over HTTP: `POST /v1/acquire` of one unit, timed, on keep-alive connections; the permit is
/// committed untimed.
async fn http(binary: &str, keys_count: usize, limit: u64, duration: Duration) -> Figures {
    let directory = tempfile::tempdir().expect("tempdir");
    let (server, url) = start_server(binary, directory.path());
    let admin = Client::new(&url, Some(ADMIN_TOKEN.into()), TIMEOUT).expect("client");
    let per = if keys_count == 1 {
        serde_json::Value::Null
    } else {
        serde_json::json!("user")
    };
    let rule = serde_json::json!({"kind":"rate","limit":limit,"period_ms":60_000,
        "algorithm":"sliding","per":per});
    let put = admin
        .send(Method::PUT, "/v1/limits/bench", Some(&rule))
        .await
        .expect("put");
    assert_eq!(put.status, 200, "{}", put.text());
    let keys = Arc::new(keys(keys_count));
    // A pool: each task in flight holds a keep-alive connection of its own.
    let client = Client::new(&url, None, TIMEOUT).expect("client");
    let one = {
        move |index: usize| {
            let client = client.clone();
            let keys = keys.clone();
            async move {
                let body = match &keys[index] {
                    Some(key) => serde_json::json!({"limits":["bench"],"key":key}),
                    None => serde_json::json!({"limits":["bench"]}),
                };
                let asked = Instant::now();
                let granted = client
                    .send(Method::POST, "/v1/acquire", Some(&body))
                    .await
                    .expect("acquire");
                let latency = asked.elapsed();
                if granted.status == 429 {
                    return (latency, false);
                }
                assert_eq!(granted.status, 200, "{}", granted.text());
                let permit = granted
                    .json
                    .as_ref()
                    .and_then(|json| json["permit"].as_str())
                    .expect("a permit");
                let committed = client
                    .send(
                        Method::POST,
                        &format!("/v1/permits/{permit}/commit"),
                        Some(&serde_json::json!({"used":1})),
                    )
                    .await
                    .expect("commit");
                assert_eq!(committed.status, 200, "{}", committed.text());
                (latency, true)
            }
        }
    };
    let first = first_touch(keys_count, one.clone()).await;
    let before = written_by(&admin).await;
    let (decisions, grants, elapsed, latencies) = drive(keys_count, duration, one).await;
    let written = written_by(&admin).await.zip(before).map(
        |((batches, records), (batches_before, records_before))| {
            (batches - batches_before, records - records_before)
        },
    );
    drop(server);
    Figures {
        decisions,
        grants,
        elapsed,
        latencies,
        first,
        written,
    }
}

fn main() {
    let benching = std::env::args().any(|arg| arg == "--bench");
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(default)
    };
    let duration = if benching {
        Duration::from_secs(number("BENCH_SECONDS", 5))
    } else {
        Duration::from_millis(200)
    };
    let rounds = if benching {
        number("BENCH_ROUNDS", 1)
    } else {
        1
    };
    let cases: &[(usize, u64)] = if benching {
        &[(1, 1_000_000_000), (10_000, 100_000), (10_000, 1_000)]
    } else {
        &[(1, 1_000_000_000), (100, 1_000)]
    };
    let baseline = std::env::var("BENCH_BASELINE_BIN").ok();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for round in 1..=rounds {
        if rounds > 1 {
            println!("round {round}");
        }
        for &(keys, limit) in cases {
            for ahead in [false, true] {
                let figures = runtime.block_on(library(keys, limit, ahead, duration));
                let store = if ahead { "write-ahead" } else { "plain" };
                figures.report(&format!(
                    "library try_acquire, {keys} keys at {limit}/min, {store}"
                ));
            }
            if let Some(baseline) = &baseline {
                let figures = runtime.block_on(http(baseline, keys, limit, duration));
                figures.report(&format!(
                    "HTTP acquire, {keys} keys at {limit}/min, baseline {baseline}"
                ));
            }
            let this = env!("CARGO_BIN_EXE_tollgate");
            let figures = runtime.block_on(http(this, keys, limit, duration));
            figures.report(&format!(
                "HTTP acquire, {keys} keys at {limit}/min, this build"
            ));
            if !benching {
                return;
            }
        }
    }
}
