//! Throughput over HTTP keep-alive on loopback: 64 concurrent clients against the built
//! `tollgate serve`, doing acquire + commit pairs, then one-request decisions (`POST
//! /v1/acquire` with `refundable: false`, and `POST /v1/check`), and, when its binary is found,
//! the same one-request decision against `throttlecrab-server` (`POST /throttle`) in the same
//! round, with the ratio of each one-request decision to it. Beside them, the floor: the
//! server's HTTP stack (axum on hyper, on a multi-threaded tokio runtime, as `tollgate serve`)
//! answering `POST /v1/acquire` with a grant's JSON after reading the body's JSON, deciding
//! nothing, served by this bench binary started again as a child process. No server that reads
//! the request and decides can beat it on this load generator.
//!
//! `cargo bench -p tollgate-cli --bench http_pairs` runs each for `BENCH_SECONDS` (default 5).
//! throttlecrab-server is looked up in `THROTTLECRAB_SERVER`, then on `PATH`; install it into a
//! separate root with `cargo install throttlecrab-server --root /tmp/throttlecrab-root` and set
//! `THROTTLECRAB_SERVER=/tmp/throttlecrab-root/bin/throttlecrab-server`.
//!
//! With `BENCH_REDIS` set to a Redis URL (`redis://127.0.0.1:6379/`), it also runs Tollgate on
//! the Redis store, in a namespace of its own for each run. `BENCH_ROUNDS` (default 1) repeats
//! the whole sequence, so that rounds of the servers interleave on a noisy machine.
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it only smoke-tests itself briefly.
//! Load generator and servers share this machine's cores, so the numbers compare the two
//! servers under the same handicap; they are not the servers' capacity on dedicated hardware.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::Method;
use tollgate_cli::client::Client;

use common::{Process, free_port, throttlecrab_binary};

const CLIENTS: usize = 64;
const TIMEOUT: Duration = Duration::from_secs(10);
const ADMIN_TOKEN: &str = "bench";

/// `redis`: the store's URL and the namespace to use; the memory store without it.
fn start_tollgate(directory: &std::path::Path, redis: Option<(&str, &str)>) -> (Process, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--recover-on-start",
        "false",
        "--log",
        "warn",
    ]);
    if let Some((url, namespace)) = redis {
        command.args(["--store", url, "--redis-namespace", namespace]);
    }
    command
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .current_dir(directory);
    common::start_serving(command)
}

/// Run `clients` loops of `one` for `duration`; returns operations per second.
async fn drive<F, Fut>(url: &str, clients: usize, duration: Duration, one: F) -> f64
where
    F: Fn(Client) -> Fut + Send + Sync + 'static + Clone,
    Fut: std::future::Future<Output = Client> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let url = url.to_owned();
        let one = one.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            // One client, so one keep-alive connection, per task.
            let mut client = Client::new(&url, None, TIMEOUT).expect("client");
            while Instant::now() < deadline {
                client = one(client).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// The bench's limit: acquired by name, and matched by `/v1/check` on `GET /bench`.
async fn put_bench_limit(admin: &Client) {
    // Far above what the benchmark reaches, and no finer than the microsecond a GCRA counter
    // counts in: a billion a second would be a microsecond per unit all the same, with a
    // burst a thousand seconds long for a new Redis namespace to wait out (G6).
    let rule = serde_json::json!({"kind":"rate","limit":1_000_000,"period_ms":1000,
        "algorithm":"gcra","match":{"method":"GET","path":"/bench"}});
    let put = admin
        .send(Method::PUT, "/v1/limits/bench", Some(&rule))
        .await
        .expect("put");
    assert_eq!(put.status, 200, "{}", put.text());
    // A Redis namespace never seen before is treated like one that lost its state: it grants
    // nothing for one period (G6). Wait for the first grant before timing anything.
    let probe_body = serde_json::json!({"limits":["bench"],"refundable":false});
    let started = Instant::now();
    loop {
        let probe = admin
            .send(Method::POST, "/v1/acquire", Some(&probe_body))
            .await
            .expect("acquire");
        if probe.status == 200 {
            break;
        }
        assert!(started.elapsed() < TIMEOUT, "no grant: {}", probe.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn tollgate_pairs(url: String, clients: usize, duration: Duration) -> f64 {
    let admin = Client::new(&url, Some(ADMIN_TOKEN.into()), TIMEOUT).expect("client");
    put_bench_limit(&admin).await;
    let acquire = serde_json::json!({"limits":["bench"]});
    let commit = serde_json::json!({"used":1});
    drive(&url, clients, duration, move |client| {
        let acquire = acquire.clone();
        let commit = commit.clone();
        async move {
            common::acquire_and_commit(&client, &acquire, &commit).await;
            client
        }
    })
    .await
}

/// One-request decisions: `path` with `body`, each answered 200 (the limit never binds).
async fn tollgate_decisions(
    url: String,
    clients: usize,
    duration: Duration,
    path: &'static str,
    body: serde_json::Value,
) -> f64 {
    let admin = Client::new(&url, Some(ADMIN_TOKEN.into()), TIMEOUT).expect("client");
    put_bench_limit(&admin).await;
    drive(&url, clients, duration, move |client| {
        let body = body.clone();
        async move {
            let answer = client
                .send(Method::POST, path, Some(&body))
                .await
                .expect("decision");
            assert_eq!(answer.status, 200, "{path}: {}", answer.text());
            client
        }
    })
    .await
}

/// The one-request decisions measured on each store: a label, the path and its body.
fn one_request_cases() -> [(&'static str, &'static str, serde_json::Value); 2] {
    [
        (
            "POST /v1/acquire, refundable: false",
            "/v1/acquire",
            serde_json::json!({"limits":["bench"],"refundable":false}),
        ),
        (
            "POST /v1/check",
            "/v1/check",
            serde_json::json!({"method":"GET","path":"/bench"}),
        ),
    ]
}

/// A store's one-request decisions per second, in `one_request_cases` order.
fn run_one_request(
    runtime: &tokio::runtime::Runtime,
    directory: &std::path::Path,
    redis: Option<(&str, &str)>,
    store: &str,
    clients: usize,
    duration: Duration,
) -> Vec<f64> {
    let mut rates = Vec::new();
    for (label, path, body) in one_request_cases() {
        // A server of its own per case, so that no case inherits another's counters.
        let (tollgate, url) = start_tollgate(directory, redis);
        let rate = runtime.block_on(tollgate_decisions(url, clients, duration, path, body));
        drop(tollgate);
        println!(
            "tollgate serve ({store}): {rate:.0} decisions/s, {label}, {clients} clients, {duration:?}"
        );
        rates.push(rate);
    }
    rates
}

async fn throttlecrab_decisions(url: String, clients: usize, duration: Duration) -> f64 {
    let body = serde_json::json!({"key":"bench","max_burst":1_000_000_000,
        "count_per_period":1_000_000_000,"period":1,"quantity":1});
    drive(&url, clients, duration, move |client| {
        let body = body.clone();
        async move {
            let answer = client
                .send(Method::POST, "/throttle", Some(&body))
                .await
                .expect("throttle");
            assert_eq!(answer.status, 200, "{}", answer.text());
            client
        }
    })
    .await
}

fn report_tollgate(store: &str, pairs: f64, clients: usize, duration: Duration) {
    println!(
        "tollgate serve ({store}): {pairs:.0} acquire+commit pairs/s ({:.0} requests/s), {clients} clients, {duration:?}",
        pairs * 2.0
    );
}

/// The floor's answer: the size and shape of a grant's.
const FLOOR_ANSWER: &str = r#"{"permit":"0101000000000000000000000000000000000000000000000000000000000000","limits":[{"name":"bench","remaining":999999,"reset_ms":1}]}"#;

/// `main` serves the floor when this is set (`common::start_floor`).
const FLOOR_VARIABLE: &str = "HTTP_FLOOR_SERVE";

fn serve_floor(address: &str) {
    let (address, runtime) = common::floor_runtime(address);
    runtime.block_on(async {
        let app = axum::Router::new().route(
            "/v1/acquire",
            axum::routing::post(|body: axum::Json<serde_json::Value>| async move {
                drop(body);
                (
                    [(hyper::header::CONTENT_TYPE, "application/json")],
                    FLOOR_ANSWER,
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("bind the floor");
        axum::serve(listener, app).await.expect("serve the floor");
    });
}

/// The floor's answers per second (`start_floor`), with `body` as one-request decisions send it.
fn run_floor(runtime: &tokio::runtime::Runtime, clients: usize, duration: Duration) -> f64 {
    let (floor, url) = common::start_floor(FLOOR_VARIABLE);
    let rate = runtime.block_on(async {
        let probe = Client::new(&url, None, TIMEOUT).expect("client");
        let started = Instant::now();
        let body = serde_json::json!({"limits":["bench"],"refundable":false});
        while probe
            .send(Method::POST, "/v1/acquire", Some(&body))
            .await
            .is_err()
        {
            assert!(started.elapsed() < TIMEOUT, "the floor did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drive(&url, clients, duration, move |client| {
            let body = body.clone();
            async move {
                let answer = client
                    .send(Method::POST, "/v1/acquire", Some(&body))
                    .await
                    .expect("floor");
                assert_eq!(answer.status, 200, "floor: {}", answer.text());
                client
            }
        })
        .await
    });
    drop(floor);
    rate
}

fn main() {
    if let Ok(address) = std::env::var(FLOOR_VARIABLE) {
        serve_floor(&address);
        return;
    }
    let benching = std::env::args().any(|arg| arg == "--bench");
    let seconds: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(5);
    let rounds: u32 = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1);
    let redis_url = std::env::var("BENCH_REDIS").ok();
    let (clients, duration) = if benching {
        (CLIENTS, Duration::from_secs(seconds))
    } else {
        (4, Duration::from_millis(200))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let directory = tempfile::tempdir().expect("tempdir");
    let throttlecrab = if benching {
        throttlecrab_binary()
    } else {
        None
    };
    for round in 1..=if benching { rounds } else { 1 } {
        if rounds > 1 {
            println!("round {round}");
        }
        let (tollgate, url) = start_tollgate(directory.path(), None);
        let pairs = runtime.block_on(tollgate_pairs(url, clients, duration));
        drop(tollgate);
        report_tollgate("memory store", pairs, clients, duration);
        let memory = run_one_request(
            &runtime,
            directory.path(),
            None,
            "memory store",
            clients,
            duration,
        );
        if !benching {
            return;
        }
        let floor = run_floor(&runtime, clients, duration);
        println!(
            "floor (the HTTP stack answering, no decision): {floor:.0} answers/s, {clients} clients, {duration:?}"
        );
        if let Some(redis_url) = &redis_url {
            let namespace = format!(
                "bench-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_micros())
            );
            let redis = Some((redis_url.as_str(), namespace.as_str()));
            let (tollgate, url) = start_tollgate(directory.path(), redis);
            let pairs = runtime.block_on(tollgate_pairs(url, clients, duration));
            drop(tollgate);
            report_tollgate("redis store", pairs, clients, duration);
            run_one_request(
                &runtime,
                directory.path(),
                redis,
                "redis store",
                clients,
                duration,
            );
        }
        match &throttlecrab {
            Some(binary) => {
                let decisions = run_throttlecrab(&runtime, binary, clients, duration);
                println!(
                    "throttlecrab-server: {decisions:.0} throttle decisions/s (one request each; it has no commit), {clients} clients, {duration:?}"
                );
                for ((label, ..), rate) in one_request_cases().iter().zip(&memory) {
                    println!(
                        "ratio tollgate (memory store, {label}) / throttlecrab: {:.2}",
                        rate / decisions
                    );
                }
                println!(
                    "ratio floor (no decision) / throttlecrab: {:.2}",
                    floor / decisions
                );
            }
            None => println!("throttlecrab-server: SKIPPED (not found; set THROTTLECRAB_SERVER)"),
        }
    }
}

fn run_throttlecrab(
    runtime: &tokio::runtime::Runtime,
    binary: &str,
    clients: usize,
    duration: Duration,
) -> f64 {
    let port = free_port();
    let child = Command::new(binary)
        // It reads THROTTLECRAB_* variables as settings; ours is not one of them.
        .env_remove("THROTTLECRAB_SERVER")
        .args([
            "--http",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn throttlecrab-server");
    let _throttlecrab = Process(child);
    let url = format!("http://127.0.0.1:{port}");
    runtime.block_on(async {
        let probe = Client::new(&url, None, TIMEOUT).expect("client");
        let started = Instant::now();
        while probe.send(Method::GET, "/health", None).await.is_err() {
            assert!(
                started.elapsed() < TIMEOUT,
                "throttlecrab-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    runtime.block_on(throttlecrab_decisions(url, clients, duration))
}
