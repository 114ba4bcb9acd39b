//! How long interactive (high-priority) requests wait while bulk (low-priority) work keeps a
//! shared limit saturated, across a fleet of two `tollgate serve` servers and two library
//! processes (`tollgate-fleet-worker --priority`) on one Redis namespace. One limit, `vendor`:
//! GCRA, 20 a second, burst left at its default (20).
//!
//! - bulk: server 1's API, 20 loops, and library process A, 20 loops; each asks at `low`,
//!   waiting up to 30 s, and asks again once answered;
//! - interactive: server 2's API and library process B, one request a second each, at `high`,
//!   waiting up to 5 s.
//!
//! Every grant is followed by one call to a mock vendor in this test process, carrying the
//! priority and the wall-clock time the request started. The vendor stamps each call's arrival
//! with its own clock, and every figure is counted from its records, never from Tollgate's
//! counters: an interactive request's wait is its call's arrival less its start (so it includes
//! the trip to the vendor); the calls in any 1 s window are judged against what the policy can
//! grant in that window and a bounded delay from decision to arrival.
//!
//! It asserts safety only (the vendor never sees more than the policy allows, both kinds of
//! work were served, nothing failed) and prints the waits: how fast the machine is decides
//! those, and they are the figures to compare across changes to the store's waiting.
//!
//! It starts package `tollgate-cli`'s `tollgate` binary, found beside this package's worker in
//! the target directory: build it first (`cargo build -p tollgate-cli -p tollgate-fleet
//! --bins`; `cargo test --workspace` builds it too).

#[path = "../../redis/tests/common.rs"]
mod common;
mod fleets;
mod processes;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleets::{most_in_a_window, wall_clock_us};
use processes::{Killed, lines_of, server_command};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tollgate_core::{Algorithm, Kind, Policy, Reserve};

const LIMIT: u64 = 20;
const PERIOD_MS: u64 = 1_000;
const LIMITS_FILE: &str = r#"
[limits.vendor]
kind = "rate"
limit = 20
period_ms = 1000
algorithm = "gcra"
"#;
const BULK_LOOPS: u64 = 20;
const BULK_WAIT_MS: u64 = 30_000;
const INTERACTIVE_WAIT_MS: u64 = 5_000;
const MEASURED: Duration = Duration::from_secs(30);
/// The longest a grant takes from its decision in Redis to its call's arrival at the vendor:
/// the answer back to the server or library process, the HTTP answer back to this test, a
/// connection to the vendor on loopback. Milliseconds on an idle machine; this allows for a
/// scheduler stall on a busy one. Each GCRA emission interval (50 ms) of it lets one more call
/// into a window of arrivals, so it is kept to two.
const DECISION_TO_ARRIVAL_MAX_US: u64 = 100_000;
/// Far beyond what any step needs; only a hang takes this long.
const DEADLINE: Duration = Duration::from_secs(30);

/// The limit's policy, as the limits file states it.
fn policy() -> Policy {
    Policy::rate(
        LIMIT,
        PERIOD_MS * 1_000,
        0,
        Algorithm::Gcra { burst: LIMIT },
        Reserve::default(),
    )
    .expect("a valid policy")
}

/// The most grants a GCRA policy decides within any half-open span of `span_us`. Each grant
/// moves the backlog's end on by the emission interval T (from at least the grant's time), and
/// one is admitted only while the backlog is at most `(burst - 1) * T`: n grants decided at
/// `s_1 <= ... <= s_n` need `s_n - s_1 >= (n - burst) * T`, so n is at most
/// `burst + ceil(span / T) - 1`.
fn most_decided_within(policy: &Policy, span_us: u64) -> u64 {
    let Kind::Rate(rate) = policy.kind() else {
        panic!("a rate policy");
    };
    policy.capacity() + span_us.div_ceil(rate.emission_us()) - 1
}

/// The next line of `lines` that `wanted` accepts, within `DEADLINE`.
fn wait_for(
    lines: &Receiver<String>,
    what: &str,
    wanted: impl Fn(&str) -> Option<String>,
) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                if let Some(found) = wanted(&line) {
                    return found;
                }
            }
            Err(RecvTimeoutError::Timeout) => panic!("no {what} within {DEADLINE:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("the process ended before {what}"),
        }
    }
}

/// A `tollgate serve` on Redis, in a directory of its own, serving `LIMITS_FILE`.
struct Server {
    _process: Killed,
    url: String,
    directory: tempfile::TempDir,
}

impl Server {
    fn start(redis: &str, namespace: &str) -> Server {
        let directory = tempfile::tempdir().expect("tempdir");
        std::fs::write(directory.path().join("limits.toml"), LIMITS_FILE).expect("limits file");
        let mut command = server_command(directory.path());
        command
            .env("TOLLGATE_ADMIN_TOKEN", "admin-token-for-tests")
            .args(["serve", "--listen", "127.0.0.1:0", "--store", redis])
            .args([
                "--redis-namespace",
                namespace,
                "--rules",
                "file://limits.toml",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = Killed(command.spawn().expect("start tollgate serve"));
        let lines = lines_of(&mut child.0);
        let url = wait_for(&lines, "`tollgate: listening on`", |line| {
            line.strip_prefix("tollgate: listening on ")
                .map(str::to_owned)
        });
        Server {
            _process: child,
            url,
            directory,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.directory.path().join("server.log")).unwrap_or_default()
    }
}

/// A `tollgate-fleet-worker --priority` process, connected.
struct Worker {
    child: Killed,
    lines: Receiver<String>,
}

impl Worker {
    fn start(redis: &str, namespace: &str, priority: &str, mode: &str, vendor: &str) -> Worker {
        let (limit, period_ms) = (LIMIT.to_string(), PERIOD_MS.to_string());
        // Bulk runs until stopped; interactive for the measured span.
        let duration_ms = if priority == "high" {
            MEASURED
        } else {
            10 * DEADLINE
        };
        let mut child = Killed(
            Command::new(env!("CARGO_BIN_EXE_tollgate-fleet-worker"))
                .args(["--priority", redis, namespace, "vendor", &limit, &period_ms])
                .args(["gcra", priority, mode, vendor])
                .arg(duration_ms.as_millis().to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start a fleet worker"),
        );
        let lines = lines_of(&mut child.0);
        wait_for(&lines, "`ready`", |line| {
            (line == "ready").then(String::new)
        });
        Worker { child, lines }
    }

    /// Stop it (at once, or after its `done` line) and count its `denied` and `error` lines.
    fn finish(self, after_done: bool) -> Tally {
        if after_done {
            wait_for(&self.lines, "`done`", |line| {
                line.starts_with("done").then(String::new)
            });
        }
        drop(self.child);
        let tally = Tally::default();
        for line in self.lines.iter() {
            if line.starts_with("denied") {
                tally.denials.fetch_add(1, Ordering::Relaxed);
            } else if let Some(error) = line.strip_prefix("error ") {
                tally.failed(error.to_owned());
            }
        }
        tally
    }
}

/// Denials and failures of one side of the fleet, as its callers saw them.
#[derive(Default)]
struct Tally {
    denials: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn failed(&self, error: String) {
        self.errors.lock().expect("tally").push(error);
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().expect("tally").clone()
    }
}

/// One call the vendor received: who made it, when its request started (the caller's wall
/// clock) and when it had its grant, and when it arrived (the vendor's own clock).
#[derive(Clone, Debug)]
struct Call {
    source: String,
    priority: String,
    start_us: u64,
    granted_us: u64,
    arrived_us: u64,
}

type Calls = Arc<Mutex<Vec<Call>>>;

/// The vendor: on loopback, answers `ok` to each line `SOURCE PRIORITY START_US GRANTED_US`,
/// stamped as it is read, and `bad` to any other line.
async fn start_vendor() -> (String, Calls) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the vendor");
    let address = listener.local_addr().expect("vendor address").to_string();
    let calls = Calls::default();
    let recorded = calls.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let calls = recorded.clone();
            tokio::spawn(async move {
                let (reading, mut writing) = stream.into_split();
                let mut lines = tokio::io::BufReader::new(reading).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let arrived_us = wall_clock_us();
                    let words: Vec<&str> = line.split(' ').collect();
                    let call = match words[..] {
                        [source, priority, start, granted] => {
                            start.parse().ok().zip(granted.parse().ok()).map(
                                |(start_us, granted_us)| Call {
                                    source: source.to_owned(),
                                    priority: priority.to_owned(),
                                    start_us,
                                    granted_us,
                                    arrived_us,
                                },
                            )
                        }
                        _ => None,
                    };
                    let answer = if call.is_some() { "ok\n" } else { "bad\n" };
                    calls.lock().expect("calls").extend(call);
                    if writing.write_all(answer.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (address, calls)
}

/// This test's side of a call to the vendor.
async fn call_vendor(vendor: &str, line: &str) -> Result<(), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(vendor).await?;
        stream.write_all(format!("{line}\n").as_bytes()).await?;
        let mut answer = String::new();
        tokio::io::BufReader::new(stream)
            .read_line(&mut answer)
            .await?;
        Ok::<_, std::io::Error>(answer)
    };
    match exchange.await {
        Ok(answer) if answer == "ok\n" => Ok(()),
        Ok(answer) => Err(format!("the vendor answered {answer:?}")),
        Err(error) => Err(format!("vendor: {error}")),
    }
}

/// One request for `vendor` through a server's API at `priority`, then, on a grant, its call to
/// the vendor; a denial or a failure is counted in `tally`.
async fn ask_server(
    http: &reqwest::Client,
    server: &str,
    vendor: &str,
    (priority, wait_ms): (&str, u64),
    tally: &Tally,
) {
    let start_us = wall_clock_us();
    let body = format!(r#"{{"limits":["vendor"],"priority":"{priority}","wait_ms":{wait_ms}}}"#);
    let answer = http
        .post(format!("{server}/v1/acquire"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let failure = match answer {
        Ok(answer) if answer.status() == 200 => {
            let granted_us = wall_clock_us();
            let _ = answer.bytes().await;
            let line = format!("server {priority} {start_us} {granted_us}");
            match call_vendor(vendor, &line).await {
                Ok(()) => return,
                Err(error) => error,
            }
        }
        Ok(answer) if answer.status() == 429 => {
            let _ = answer.bytes().await;
            tally.denials.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Ok(answer) => format!(
            "{}: {}",
            answer.status(),
            answer.text().await.unwrap_or_default()
        ),
        Err(error) => format!("{server}: {error}"),
    };
    tally.failed(failure);
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// The `q` quantile of sorted `values` (nearest rank), in milliseconds; NaN for none.
fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1_000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_waits_across_a_fleet_of_servers_and_processes() {
    let test = "interactive_waits_across_a_fleet_of_servers_and_processes";
    let Some(redis) = common::redis_url(test) else {
        return;
    };
    let namespace = common::namespace(test);
    common::declare_fresh(&redis, &namespace).await;
    let (vendor, calls) = start_vendor().await;
    let bulk_server = Server::start(&redis, &namespace);
    let interactive_server = Server::start(&redis, &namespace);
    let http = reqwest::Client::builder()
        .timeout(DEADLINE + Duration::from_millis(BULK_WAIT_MS))
        .build()
        .expect("an HTTP client");

    // Bulk: server 1's loops, then library process A's.
    let bulk_tally = Arc::new(Tally::default());
    let bulk_loops: Vec<_> = (0..BULK_LOOPS)
        .map(|_| {
            let (http, server, vendor) = (http.clone(), bulk_server.url.clone(), vendor.clone());
            let tally = bulk_tally.clone();
            tokio::spawn(async move {
                loop {
                    ask_server(&http, &server, &vendor, ("low", BULK_WAIT_MS), &tally).await;
                }
            })
        })
        .collect();
    let bulk_library = Worker::start(
        &redis,
        &namespace,
        "low",
        &format!("loops:{BULK_LOOPS}"),
        &vendor,
    );
    // Warm-up: both bulk sides served (the burst is spent), then two seconds, at 20 a second
    // enough for each of the 40 loops to have been served and to be waiting again.
    let warming = Instant::now();
    let both_served = || {
        let calls = calls.lock().expect("calls");
        ["server", "library"]
            .iter()
            .all(|source| calls.iter().any(|call| call.source == *source))
    };
    while !both_served() {
        assert!(
            warming.elapsed() < DEADLINE,
            "bulk work was not served on both sides within {DEADLINE:?}; server 1's log:\n{}",
            bulk_server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Measured: interactive requests for 30 s, one a second through server 2's API and one a
    // second from library process B, each answered (granted or given up) before the bulk stops.
    let measured_from_us = wall_clock_us();
    let interactive_library = Worker::start(&redis, &namespace, "high", "rate:1", &vendor);
    let interactive_tally = Arc::new(Tally::default());
    let started = tokio::time::Instant::now();
    let mut interactive = Vec::new();
    for second in 0..MEASURED.as_secs() {
        tokio::time::sleep_until(started + Duration::from_secs(second)).await;
        let (http, server, vendor) = (http.clone(), interactive_server.url.clone(), vendor.clone());
        let tally = interactive_tally.clone();
        interactive.push(tokio::spawn(async move {
            ask_server(
                &http,
                &server,
                &vendor,
                ("high", INTERACTIVE_WAIT_MS),
                &tally,
            )
            .await;
        }));
    }
    for request in interactive {
        request.await.expect("an interactive request");
    }
    let library_interactive = interactive_library.finish(true);
    let measured_to_us = wall_clock_us();
    for bulk in &bulk_loops {
        bulk.abort();
    }
    let library_bulk = bulk_library.finish(false);

    let calls = calls.lock().expect("calls").clone();
    // The interactive waits, sorted, of one source (or of both: `None`).
    let waits_of = |source: Option<&str>| {
        let mut waits: Vec<u64> = calls
            .iter()
            .filter(|call| call.priority == "high")
            .filter(|call| source.is_none_or(|source| call.source == source))
            .map(|call| call.arrived_us.saturating_sub(call.start_us))
            .collect();
        waits.sort_unstable();
        waits
    };
    let waits = waits_of(None);
    let (by_server, by_library) = (waits_of(Some("server")), waits_of(Some("library")));
    let bulk_measured = |source: &str| {
        calls
            .iter()
            .filter(|call| call.priority == "low" && call.source == source)
            .filter(|call| (measured_from_us..=measured_to_us).contains(&call.arrived_us))
            .count()
    };
    let (bulk_by_server, bulk_by_library) = (bulk_measured("server"), bulk_measured("library"));
    let interactive_denied = interactive_tally.denials.load(Ordering::Relaxed)
        + library_interactive.denials.load(Ordering::Relaxed);
    let mut arrivals: Vec<u64> = calls.iter().map(|call| call.arrived_us).collect();
    arrivals.sort_unstable();
    let window_us = PERIOD_MS * 1_000;
    let most = most_in_a_window(&arrivals, window_us, "sliding");
    let policy = policy();
    let window_bound = most_decided_within(&policy, window_us + DECISION_TO_ARRIVAL_MAX_US);
    let slowest_call_us = calls
        .iter()
        .map(|call| call.arrived_us.saturating_sub(call.granted_us))
        .max()
        .unwrap_or(0);
    println!(
        "priority fleet: interactive waits p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} \
         granted (p50 server {:.0} ms of {}, library {:.0} ms of {}; {interactive_denied} given \
         up after {INTERACTIVE_WAIT_MS} ms); bulk grants in \
         the measured {:.1} s: {} (server {bulk_by_server}, library {bulk_by_library}); most \
         calls in a 1 s window: {most} (bound {window_bound}); slowest grant to vendor: {:.1} ms",
        quantile_ms(&waits, 0.5),
        quantile_ms(&waits, 0.99),
        quantile_ms(&waits, 1.0),
        waits.len(),
        quantile_ms(&by_server, 0.5),
        by_server.len(),
        quantile_ms(&by_library, 0.5),
        by_library.len(),
        (measured_to_us - measured_from_us) as f64 / 1e6,
        bulk_by_server + bulk_by_library,
        slowest_call_us as f64 / 1_000.0,
    );

    let errors: Vec<String> = [
        &*bulk_tally,
        &*interactive_tally,
        &library_bulk,
        &library_interactive,
    ]
    .iter()
    .flat_map(|tally| tally.errors())
    .collect();
    assert!(
        errors.is_empty(),
        "{} failures, e.g. {:?}; server 1's log:\n{}\nserver 2's log:\n{}",
        errors.len(),
        &errors[..errors.len().min(5)],
        bulk_server.log(),
        interactive_server.log()
    );
    assert!(!waits.is_empty(), "no interactive request was granted");
    assert!(
        bulk_by_server > 0 && bulk_by_library > 0,
        "bulk work was starved while measured: server {bulk_by_server}, library {bulk_by_library}"
    );
    assert!(
        most <= window_bound,
        "the vendor saw {most} calls within 1 s; a GCRA of {LIMIT} a second with a burst of \
         {LIMIT} decides at most {window_bound} within 1 s plus {} ms",
        DECISION_TO_ARRIVAL_MAX_US / 1_000
    );
    let (first, last) = (arrivals[0], arrivals[arrivals.len() - 1]);
    let run_bound = most_decided_within(&policy, last - first + DECISION_TO_ARRIVAL_MAX_US);
    assert!(
        arrivals.len() as u64 <= run_bound,
        "the vendor saw {} calls over {} us, more than the policy's {run_bound}",
        arrivals.len(),
        last - first
    );
}
