//! The remote quota against a real Tollgate server, started in this process on 127.0.0.1:0
//! (memory store, rules in a temporary SQLite file, limits put through the admin API, a data
//! token on the data plane), with the counting mock vendor of `common` on a real socket:
//!
//! - the vendor never counts more than N calls in one of its windows, and every job completes;
//! - a vendor's 429 becomes a pause on the server (a direct acquire is answered 429 `paused`),
//!   and nothing reaches the vendor until the cessation ends, across two dispatchers;
//! - leases are renewed and released through the server, also when an admission is dropped
//!   unsettled;
//! - an unreachable, stopped or silent server gives the caller a clear transient error within a
//!   bounded time, and nothing is sent to the vendor;
//! - two dispatchers sharing one server keep the vendor within N per window.
//!
//! Wall clock, multi-thread runtime. The assertions are about safety, never speed: deadlines
//! are far beyond what any step needs.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Tally, Vendor, VendorRules};
use serde_json::{Value, json};
use tollgate_dispatch::{
    Classifier, DispatchError, DispatchRuntime, Dispatcher, DispatcherConfig, Gate, GateConfig,
    HostLimits, Priority, Quota, RemoteQuota,
};
use tollgate_server::{ServerConfig, ServerError, StoreChoice};

const ADMIN_TOKEN: &str = "admin-token-for-the-remote-test";
const DATA_TOKEN: &str = "data-token-for-the-remote-test";
/// Only a hang takes this long.
const DEADLINE: Duration = Duration::from_secs(60);
const RATE: &str = "vendor";
const INFLIGHT: &str = "vendor-inflight";

/// A Tollgate server running on this process's runtime.
struct Server {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), ServerError>>>,
    /// Holds the rules database; removed when the server is dropped.
    _rules: tempfile::TempDir,
    http: reqwest::Client,
}

impl Server {
    async fn start() -> Server {
        let rules = tempfile::tempdir().expect("a temporary directory");
        let rules_url = format!("sqlite://{}", rules.path().join("rules.db").display());
        let config = ServerConfig {
            listen: "127.0.0.1:0".parse().expect("an address"),
            store: StoreChoice::Memory,
            rules_url,
            state_url: None,
            rules_table: "tollgate_limits".into(),
            reload_interval: Duration::from_secs(2),
            admin_token: Some(ADMIN_TOKEN.into()),
            data_token: Some(DATA_TOKEN.into()),
            metrics_token: None,
            body_bytes_max: tollgate_server::DEFAULT_BODY_BYTES_MAX,
            wait_ms_max: tollgate_server::DEFAULT_WAIT_MS_MAX,
            keys_tracked_max: tollgate_server::DEFAULT_KEYS_TRACKED_MAX,
            keys_per_limit_max: None,
            pause_ms_max: tollgate_server::DEFAULT_PAUSE_MS_MAX,
            learn: tollgate::LearnConfig::default(),
            shares: tollgate::Shares::default(),
            // A fresh server: nothing granted before it started can still count.
            recover_on_start: false,
            permit_secret: None,
            shutdown_grace: Duration::from_secs(2),
            redis_namespace: tollgate_server::DEFAULT_REDIS_NAMESPACE.into(),
            store_fail_open: false,
            redis_allow_eviction: false,
            redis_module: tollgate_server::DEFAULT_REDIS_MODULE,
            store_timeout: Duration::from_secs(1),
            grpc_listen: None,
            envoy_config: None,
            path_matching: tollgate_server::DEFAULT_PATH_MATCHING,
            forward_auth_user_header: None,
            forward_auth_trusted_proxies: Vec::new(),
            forward_auth_ipv6_prefix_len: tollgate_server::DEFAULT_FORWARD_AUTH_IPV6_PREFIX_LEN,
            path_encoded_slash: tollgate_server::PathEncodedSlash::default(),
            forward_auth_proxy: None,
            forward_auth_method_header: None,
            forward_auth_uri_header: None,
            forward_auth_network_keys_max: tollgate_server::DEFAULT_FORWARD_AUTH_NETWORK_KEYS_MAX,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            header_read_timeout: Duration::from_millis(
                tollgate_server::DEFAULT_HEADER_READ_TIMEOUT_MS,
            ),
            idle_timeout: Duration::from_millis(tollgate_server::DEFAULT_IDLE_TIMEOUT_MS),
            connections_max: tollgate_server::DEFAULT_CONNECTIONS_MAX,
            waiters_max: tollgate_server::DEFAULT_WAITERS_MAX,
            waiters_per_limit_max: tollgate_server::DEFAULT_WAITERS_PER_LIMIT_MAX,
            waiters_per_token_max: tollgate_server::DEFAULT_WAITERS_PER_TOKEN_MAX,
            tls_cert: None,
            tls_key: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (listening_tx, listening_rx) = tokio::sync::oneshot::channel::<SocketAddr>();
        let task = tokio::spawn(tollgate_server::run(
            config,
            async move {
                let _ = stopped.await;
            },
            move |address, _| {
                let _ = listening_tx.send(address);
            },
        ));
        let address = tokio::time::timeout(DEADLINE, listening_rx)
            .await
            .expect("the server listens in time")
            .expect("the server started");
        Server {
            url: format!("http://{address}"),
            stop: Some(stop),
            task: Some(task),
            _rules: rules,
            http: reqwest::Client::new(),
        }
    }

    /// Stop it and wait until it no longer listens.
    async fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(DEADLINE, task)
                .await
                .expect("the server stops in time")
                .expect("the server task")
                .expect("the server stopped cleanly");
        }
    }

    async fn put_limit(&self, name: &str, rule: Value) {
        let response = self
            .http
            .put(format!("{}/v1/limits/{name}", self.url))
            .bearer_auth(ADMIN_TOKEN)
            .json(&rule)
            .timeout(DEADLINE)
            .send()
            .await
            .expect("the admin API answers");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert_eq!(status, 200, "PUT /v1/limits/{name}: {body}");
    }

    /// A direct, non-waiting acquire: the status, the `Retry-After` header and the body.
    async fn acquire(&self, limits: &[&str]) -> (u16, Option<String>, Value) {
        let response = self
            .http
            .post(format!("{}/v1/acquire", self.url))
            .bearer_auth(DATA_TOKEN)
            .json(&json!({ "limits": limits, "wait_ms": 0 }))
            .timeout(DEADLINE)
            .send()
            .await
            .expect("the server answers");
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let body = response.json().await.expect("a JSON answer");
        (status, retry_after, body)
    }

    async fn commit(&self, permit: &str, used: u64) {
        let response = self
            .http
            .post(format!("{}/v1/permits/{permit}/commit", self.url))
            .bearer_auth(DATA_TOKEN)
            .json(&json!({ "used": used }))
            .timeout(DEADLINE)
            .send()
            .await
            .expect("the server answers");
        assert_eq!(response.status(), 200, "commit");
    }

    /// How many store operations of `operation` the server has run, from `/metrics`.
    async fn store_operations(&self, operation: &str) -> u64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .timeout(DEADLINE)
            .send()
            .await
            .expect("the server answers")
            .text()
            .await
            .expect("metrics text");
        let label = format!("operation=\"{operation}\"");
        text.lines()
            .filter(|line| line.contains("_count") && line.contains(&label))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn gate_config() -> GateConfig {
    GateConfig {
        wait_ms_max: 30_000,
        retries_max: 30,
        backoff_ms: 50,
        backoff_ms_max: 500,
        retry_after_ms_default: 1_000,
        retry_after_ms_max: 30_000,
        resume_jitter_ms_max: 200,
        lease_margin_ms: 1_000,
        // These cases measure the pause protocol alone; `tests/learn.rs` covers learning.
        learn: false,
    }
}

fn remote_gate(url: &str, limits: HostLimits, config: GateConfig) -> Gate {
    remote_gate_with_token(url, DATA_TOKEN, limits, config)
}

fn remote_gate_with_token(url: &str, token: &str, limits: HostLimits, config: GateConfig) -> Gate {
    let remote = RemoteQuota::new(url, Some(token.into()), limits, Duration::from_secs(5))
        .expect("a remote quota");
    Gate::new(Quota::remote(remote), Classifier::new(), config).expect("a gate")
}

fn dispatcher(gate: Gate, connections_max: u32) -> Dispatcher<reqwest::Client, ()> {
    let client = reqwest::Client::new();
    Dispatcher::start(
        gate,
        DispatcherConfig {
            queued_max: 1_000,
            connections_max,
        },
        move |_: &()| {
            let client = client.clone();
            async move { Ok(client) }
        },
        DispatchRuntime::Current,
    )
    .expect("a dispatcher")
}

/// Submit `jobs` GETs of the vendor tagged with `process`; the status of each, or its error.
async fn run_jobs(
    dispatcher: &Dispatcher<reqwest::Client, ()>,
    vendor: &Vendor,
    process: &str,
    jobs: usize,
) -> Vec<Result<u16, String>> {
    let mut pending = Vec::new();
    for index in 0..jobs {
        let url = vendor.url();
        let process = process.to_owned();
        // Some interactive work among the bulk: every priority goes through the server.
        let priority = if index % 4 == 0 {
            Priority::High
        } else {
            Priority::Low
        };
        pending.push(
            dispatcher
                .submit((), priority, move |client: reqwest::Client| {
                    client.get(&url).header("x-process", &process).send()
                })
                .expect("queued"),
        );
    }
    let mut results = Vec::new();
    for job in pending {
        let result = match tokio::time::timeout(DEADLINE, job).await {
            Err(_) => Err("no answer within the deadline".to_owned()),
            Ok(Err(error)) => Err(format!("dispatch: {error}")),
            Ok(Ok(Err(error))) => Err(format!("vendor: {error}")),
            Ok(Ok(Ok(response))) => Ok(response.status().as_u16()),
        };
        results.push(result);
    }
    results
}

fn assert_all_ok(results: &[Result<u16, String>]) {
    let failed: Vec<_> = results
        .iter()
        .filter(|result| **result != Ok(200))
        .collect();
    assert!(
        failed.is_empty(),
        "jobs that did not end in 200: {failed:?}"
    );
}

/// The most calls the vendor saw in any half-open interval of `period`, from the vendor's own
/// arrival times (its refusals count per aligned window, which an overshoot straddling two
/// windows escapes).
fn most_in_any_period(tally: &Tally, period: Duration) -> usize {
    let mut arrivals = tally.ok_at.clone();
    arrivals.sort();
    let mut most = 0;
    let mut first = 0;
    for last in 0..arrivals.len() {
        while arrivals[last] - arrivals[first] >= period {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// The vendor's window and the server's rate limit: N per period, sliding, plus a margin for
/// the spread of delays between a grant on the server and the call's arrival at the vendor.
const N: u64 = 4;
const PERIOD_MS: u64 = 300;
const MARGIN_MS: u64 = 200;

/// A vendor allowing `limit` per `PERIOD_MS` window, answering `Retry-After` from 1 s up to
/// `retry_after_s_max` while a caller keeps overdrawing.
async fn vendor(limit: u64, retry_after_s_max: u64) -> Vendor {
    Vendor::start(VendorRules {
        limit,
        period: Duration::from_millis(PERIOD_MS),
        retry_after_s: 1,
        retry_after_s_max,
    })
    .await
}

/// A host limited by the server's rate limit alone.
fn rate_only() -> HostLimits {
    HostLimits {
        rate: Some(RATE.into()),
        concurrency: None,
    }
}

fn rate_rule(limit: u64) -> Value {
    json!({"kind": "rate", "limit": limit, "period_ms": PERIOD_MS, "algorithm": "sliding",
        "margin_ms": MARGIN_MS})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_vendor_sees_at_most_n_per_window_and_every_job_completes() {
    let server = Server::start().await;
    server.put_limit(RATE, rate_rule(N)).await;
    let vendor = vendor(N, 8).await;
    let limits = rate_only();
    let dispatcher = dispatcher(remote_gate(&server.url, limits, gate_config()), 16);
    let results = run_jobs(&dispatcher, &vendor, "p0", 24).await;
    let tally = vendor.tally();
    eprintln!(
        "one dispatcher: calls {} ok {} limited {} most in a window {} most in any {PERIOD_MS} ms {}",
        tally.calls,
        tally.ok,
        tally.limited,
        tally.most_in_a_window,
        most_in_any_period(&tally, Duration::from_millis(PERIOD_MS))
    );
    assert_all_ok(&results);
    assert_eq!(tally.limited, 0, "the vendor refused a call: {tally:?}");
    assert!(tally.most_in_a_window <= N, "{tally:?}");
    // The server counts in spans of period + margin, and the margin absorbs the spread of
    // delays between grant and arrival: no interval of a period sees more than N.
    let most = most_in_any_period(&tally, Duration::from_millis(PERIOD_MS));
    assert!(
        most <= N as usize,
        "{most} calls within {PERIOD_MS} ms: {tally:?}"
    );
    assert_eq!(tally.calls, 24, "each job reached the vendor exactly once");
    assert_eq!(dispatcher.gate().stats().sent, 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dispatchers_sharing_a_server_keep_the_vendor_within_n_per_window() {
    let server = Server::start().await;
    server.put_limit(RATE, rate_rule(N)).await;
    let vendor = vendor(N, 8).await;
    let limits = rate_only();
    // Two dispatchers with their own gates and HTTP clients, as two processes would have.
    let first = dispatcher(remote_gate(&server.url, limits.clone(), gate_config()), 16);
    let second = dispatcher(remote_gate(&server.url, limits, gate_config()), 16);
    let (first_results, second_results) = tokio::join!(
        run_jobs(&first, &vendor, "p0", 16),
        run_jobs(&second, &vendor, "p1", 16)
    );
    let tally = vendor.tally();
    eprintln!(
        "two dispatchers: calls {} ok {} limited {} most in a window {} most in any {PERIOD_MS} ms {}",
        tally.calls,
        tally.ok,
        tally.limited,
        tally.most_in_a_window,
        most_in_any_period(&tally, Duration::from_millis(PERIOD_MS))
    );
    assert_all_ok(&first_results);
    assert_all_ok(&second_results);
    assert_eq!(tally.limited, 0, "the vendor refused a call: {tally:?}");
    assert!(tally.most_in_a_window <= N, "{tally:?}");
    let most = most_in_any_period(&tally, Duration::from_millis(PERIOD_MS));
    assert!(
        most <= N as usize,
        "{most} calls within {PERIOD_MS} ms: {tally:?}"
    );
    assert_eq!(tally.calls, 32);
}

/// The vendor is stricter than the server's rate limit (3 vs 6 per window), so it answers 429.
/// The host's concurrency limit of 1 on the server, released only after the pause is recorded
/// there, makes zero escalations hold by construction; two dispatchers share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vendors_429_pauses_the_server_and_nothing_reaches_the_vendor_until_it_ends() {
    let server = Arc::new(Server::start().await);
    server.put_limit(RATE, rate_rule(6)).await;
    server
        .put_limit(
            INFLIGHT,
            json!({"kind": "concurrency", "limit": 1, "lease_ttl_ms": 30_000}),
        )
        .await;
    let vendor = vendor(3, 8).await;
    let limits = HostLimits {
        rate: Some(RATE.into()),
        concurrency: Some(INFLIGHT.into()),
    };
    let first = dispatcher(remote_gate(&server.url, limits.clone(), gate_config()), 8);
    let second = dispatcher(remote_gate(&server.url, limits, gate_config()), 8);

    // Ask the server directly until it says the host is paused. Grants it gives meanwhile are
    // refunded at once; only the rate limit is asked, so no lease is taken from the jobs.
    let probe = {
        let server = server.clone();
        let vendor = vendor.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            while started.elapsed() < DEADLINE {
                if vendor.tally().limited > 0 {
                    let (status, retry_after, body) = server.acquire(&[RATE]).await;
                    if status == 429 && body["reason"] == "paused" {
                        return Some((retry_after, body));
                    }
                    if let Some(permit) = body["permit"].as_str() {
                        server.commit(permit, 0).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        })
    };
    let (first_results, second_results) = tokio::join!(
        run_jobs(&first, &vendor, "p0", 10),
        run_jobs(&second, &vendor, "p1", 10)
    );
    let tally = vendor.tally();
    let stats = [first.gate().stats(), second.gate().stats()];
    eprintln!(
        "429 and pause: calls {} ok {} limited {} escalations {} disobeyed {:?}; gates {stats:?}",
        tally.calls, tally.ok, tally.limited, tally.escalations, tally.disobeyed
    );
    assert!(
        tally.limited >= 1,
        "the test must provoke the vendor: {tally:?}"
    );
    let (retry_after, denial) = probe
        .await
        .expect("the probe ran")
        .expect("the server answered 429 paused while the vendor's cessation ran");
    eprintln!("the server's answer during the pause: Retry-After {retry_after:?}, {denial}");
    assert_eq!(denial["error"]["code"], "rate_limited");
    assert!(denial["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0));
    assert!(retry_after.is_some(), "a Retry-After header");
    assert_eq!(
        tally.escalations, 0,
        "a request reached the vendor during a cessation"
    );
    assert!(tally.disobeyed.is_empty(), "{:?}", tally.disobeyed);
    assert_all_ok(&first_results);
    assert_all_ok(&second_results);
    assert_eq!(tally.ok, 20, "each job got through exactly once");
    let rate_limited: u64 = stats.iter().map(|stats| stats.rate_limited).sum();
    assert_eq!(
        rate_limited, tally.limited,
        "every 429 was seen by a gate, which paused the server"
    );
}

/// Every admission renews its lease through the server (the margin is longer than the TTL),
/// and every settled attempt releases it: with a TTL far beyond the gate's wait, the jobs
/// behind the first could not get the only lease otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_are_renewed_and_released_through_the_server() {
    let server = Server::start().await;
    server
        .put_limit(
            INFLIGHT,
            json!({"kind": "concurrency", "limit": 1, "lease_ttl_ms": 60_000}),
        )
        .await;
    let vendor = vendor(1_000, 1).await;
    let limits = HostLimits {
        rate: None,
        concurrency: Some(INFLIGHT.into()),
    };
    let mut config = gate_config();
    config.wait_ms_max = 20_000;
    config.lease_margin_ms = 120_000;
    let gate = remote_gate(&server.url, limits, config);
    let dispatcher = dispatcher(gate.clone(), 8);
    let renewed_before = server.store_operations("renew").await;

    let in_flight = Arc::new(AtomicU64::new(0));
    let most_in_flight = Arc::new(AtomicU64::new(0));
    let mut pending = Vec::new();
    for _ in 0..8 {
        let url = vendor.url();
        let in_flight = in_flight.clone();
        let most_in_flight = most_in_flight.clone();
        pending.push(
            dispatcher
                .submit((), Priority::Normal, move |client: reqwest::Client| {
                    let url = url.clone();
                    let in_flight = in_flight.clone();
                    let most_in_flight = most_in_flight.clone();
                    async move {
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        most_in_flight.fetch_max(now, Ordering::SeqCst);
                        let answer = client.get(&url).send().await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        answer
                    }
                })
                .expect("queued"),
        );
    }
    for job in pending {
        let response = tokio::time::timeout(DEADLINE, job)
            .await
            .expect("no hang")
            .expect("the dispatcher ran it")
            .expect("the vendor answered");
        assert_eq!(response.status(), 200);
    }
    let renewed = server.store_operations("renew").await - renewed_before;
    eprintln!(
        "leases: 8 jobs, at most {} in flight, {renewed} renewals on the server; gate {:?}",
        most_in_flight.load(Ordering::SeqCst),
        gate.stats()
    );
    assert_eq!(most_in_flight.load(Ordering::SeqCst), 1);
    assert_eq!(vendor.tally().calls, 8);
    assert!(renewed >= 8, "each admission renewed its lease: {renewed}");
    assert_eq!(gate.stats().refused_stale, 0);

    // Released: a direct acquire is granted at once, under a newer fence.
    let (status, _, body) = server.acquire(&[INFLIGHT]).await;
    assert_eq!(status, 200, "the lease was released: {body}");
    let fence = body["limits"][0]["fence"]
        .as_u64()
        .expect("a lease's fence");
    assert!(fence >= 8, "fences only grow: {fence}");
    let permit = body["permit"].as_str().expect("a permit");
    server.commit(permit, 1).await;

    // An admission dropped unsettled (its caller went away) gives its lease back too, long
    // before the TTL.
    let admission = tokio::time::timeout(DEADLINE, gate.admit(Priority::Normal))
        .await
        .expect("no hang")
        .expect("admitted");
    assert!(admission.fence().is_some_and(|held| held > fence));
    drop(admission);
    let released = tokio::time::timeout(DEADLINE, async {
        loop {
            let (status, _, body) = server.acquire(&[INFLIGHT]).await;
            if status == 200 {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a dropped admission's lease was released well before its 60 s TTL");
    assert!(released["permit"].is_string());
}

/// An admission that the server does not grant fails with a remote error (transient when the
/// server could not be reached); the job never runs, so nothing reaches the vendor.
async fn assert_remote_failure(
    url: &str,
    token: &str,
    config: GateConfig,
    vendor: &Vendor,
    transient: bool,
) -> DispatchError {
    let limits = rate_only();
    let dispatcher = dispatcher(remote_gate_with_token(url, token, limits, config), 4);
    let ran = Arc::new(AtomicU64::new(0));
    let counted = ran.clone();
    let url = vendor.url();
    let result = tokio::time::timeout(
        DEADLINE,
        dispatcher.run((), Priority::High, move |client: reqwest::Client| {
            counted.fetch_add(1, Ordering::SeqCst);
            client.get(&url).send()
        }),
    )
    .await
    .expect("a clear answer, not a hang");
    let Err(error) = result else {
        panic!("the job ran without the server");
    };
    assert!(
        matches!(error, DispatchError::Remote { .. }),
        "a remote quota error: {error}"
    );
    assert_eq!(error.is_transient(), transient, "{error}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the job did not run");
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_is_a_clear_transient_error_and_nothing_is_sent() {
    let vendor = vendor(1_000, 1).await;

    // Nobody listens on the port.
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        listener.local_addr().expect("address")
    };
    let started = tokio::time::Instant::now();
    let error = assert_remote_failure(
        &format!("http://{closed}"),
        DATA_TOKEN,
        gate_config(),
        &vendor,
        true,
    )
    .await;
    eprintln!("nobody listening: {error} (after {:?})", started.elapsed());

    // A server that worked, then stopped.
    let mut server = Server::start().await;
    server.put_limit(RATE, rate_rule(N)).await;
    let limits = rate_only();
    let working = dispatcher(remote_gate(&server.url, limits, gate_config()), 4);
    assert_all_ok(&run_jobs(&working, &vendor, "p0", 2).await);
    // A wrong data token: refused, and not worth retrying unchanged.
    let error = assert_remote_failure(
        &server.url,
        "not-the-data-token",
        gate_config(),
        &vendor,
        false,
    )
    .await;
    eprintln!("wrong token: {error}");
    server.shut_down().await;
    let error = assert_remote_failure(&server.url, DATA_TOKEN, gate_config(), &vendor, true).await;
    eprintln!("stopped server: {error}");

    // A server that accepts connections and never answers: bounded by the gate's wait, the
    // remote timeout and the client's slack.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_address = silent.local_addr().expect("address");
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let mut config = gate_config();
    config.wait_ms_max = 500;
    let started = tokio::time::Instant::now();
    let error = assert_remote_failure(
        &format!("http://{silent_address}"),
        DATA_TOKEN,
        config,
        &vendor,
        true,
    )
    .await;
    eprintln!("silent server: {error} (after {:?})", started.elapsed());
    holder.abort();

    assert_eq!(
        vendor.tally().calls,
        2,
        "only the jobs run while the server was up"
    );
}
