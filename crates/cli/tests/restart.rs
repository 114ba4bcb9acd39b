//! Restarts of the real `tollgate serve` on the embedded default (memory store, SQLite rules):
//! a fresh start holds nothing back, a clean stop resumes its counters exactly, and after a
//! crash each rate counter resumes from its last record with at most its budget held back,
//! counted here by the test itself over both runs; concurrency limits are held from the last
//! heartbeat, with their own reason. A second server on the same state database fences the
//! first off, and a failing state database refuses only what needs a new record.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use hyper::Method;

use common::*;

/// Restart in the same directory (and so on the same rules database).
fn restart(server: &mut Server) -> Server {
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    Server::start_with(Options {
        default_recovery: true,
        directory: Some(directory),
        ..Options::default()
    })
}

/// A server on a new rules database, with the default recovery.
fn fresh_server() -> Server {
    Server::start_with(Options {
        default_recovery: true,
        ..Options::default()
    })
}

async fn acquire(server: &Server, limit: &str) -> tollgate_cli::client::Answer {
    post(
        &server.anonymous(),
        "/v1/acquire",
        &format!(r#"{{"limits":["{limit}"]}}"#),
    )
    .await
}

async fn acquire_key(server: &Server, limit: &str, key: &str) -> tollgate_cli::client::Answer {
    post(
        &server.anonymous(),
        "/v1/acquire",
        &format!(r#"{{"limits":["{limit}"],"key":"{key}"}}"#),
    )
    .await
}

/// Kill the server as the kernel's OOM killer would (SIGKILL): nothing runs after.
fn kill_hard(server: &mut Server) {
    let killed = Command::new("kill")
        .args(["-KILL", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    server.wait_exit();
}

/// The test's own count of grants: when each answer said granted, on the test's clock.
#[derive(Default)]
struct Tally {
    granted: Vec<Instant>,
}

impl Tally {
    /// Count a 200; returns whether it was one.
    fn count(&mut self, answer: &tollgate_cli::client::Answer) -> bool {
        let granted = answer.status == 200;
        if granted {
            self.granted.push(Instant::now());
        }
        granted
    }

    /// The most grants this count saw in any span of `period`.
    fn most_within(&self, period: Duration) -> usize {
        (0..self.granted.len())
            .map(|first| {
                self.granted[first..]
                    .iter()
                    .take_while(|at| at.duration_since(self.granted[first]) < period)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

/// A rate limit of 5 units per `period_ms`.
async fn rate_limit(server: &Server, name: &str, period_ms: u64) {
    put_limit(
        server,
        name,
        &format!(r#"{{"kind":"rate","limit":5,"period_ms":{period_ms}}}"#),
    )
    .await;
}

#[track_caller]
fn assert_recovering(answer: &tollgate_cli::client::Answer) {
    assert_error(answer, 429, "rate_limited", None);
    assert_eq!(reason(answer), "recovering", "{}", answer.text());
}

fn reason(answer: &tollgate_cli::client::Answer) -> String {
    let json = answer.json.as_ref().expect("json");
    json["reason"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_grants_a_new_limit_at_once() {
    let server = fresh_server();
    rate_limit(&server, "daily", 86_400_000).await;
    let answer = acquire(&server, "daily").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_resumes_the_counters_exactly() {
    let mut server = fresh_server();
    for (name, algorithm) in [("sliding", "sliding"), ("fixed", "fixed"), ("gcra", "gcra")] {
        put_limit(
            &server,
            name,
            &format!(
                r#"{{"kind":"rate","limit":2,"period_ms":3600000,"algorithm":"{algorithm}"}}"#
            ),
        )
        .await;
    }
    put_limit(
        &server,
        "spare",
        r#"{"kind":"rate","limit":2,"period_ms":3600000}"#,
    )
    .await;
    for name in ["sliding", "fixed", "gcra"] {
        for _ in 0..2 {
            let answer = acquire(&server, name).await;
            assert_eq!(answer.status, 200, "{name}: {}", answer.text());
        }
    }
    assert_eq!(acquire(&server, "spare").await.status, 200);
    assert!(server.terminate().success(), "{}", server.log());
    let restarted = restart(&mut server);
    assert!(
        restarted
            .log()
            .contains("counters of the previous run restored"),
        "{}",
        restarted.log()
    );
    for name in ["sliding", "fixed", "gcra"] {
        let answer = acquire(&restarted, name).await;
        assert_eq!(answer.status, 429, "{name}: {}", answer.text());
        assert_eq!(reason(&answer), "capacity", "{name}: {}", answer.text());
    }
    // One unit of the spare limit was used before the stop: one is left, not two, not none.
    assert_eq!(acquire(&restarted, "spare").await.status, 200);
    let answer = acquire(&restarted, "spare").await;
    assert_eq!(reason(&answer), "capacity", "{}", answer.text());
}

/// Ctrl-C (SIGINT) and Ctrl-\\ (SIGQUIT) are stops like SIGTERM: the counters are saved, and
/// the next start resumes them rather than holding every limit as after a crash. (SIGHUP
/// reloads the rules: `operator.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ordinary_signal_is_a_clean_stop() {
    for signal in ["INT", "QUIT"] {
        let mut server = fresh_server();
        put_limit(
            &server,
            "hourly",
            r#"{"kind":"rate","limit":2,"period_ms":3600000}"#,
        )
        .await;
        assert_eq!(acquire(&server, "hourly").await.status, 200);
        let status = server.stop_with(signal);
        assert!(
            status.success(),
            "SIG{signal}: {status:?}\n{}",
            server.log()
        );
        let restarted = restart(&mut server);
        assert!(
            restarted
                .log()
                .contains("counters of the previous run restored"),
            "SIG{signal}: {}",
            restarted.log()
        );
        // One unit was used before the stop: one is left, and nothing is held.
        assert_eq!(
            acquire(&restarted, "hourly").await.status,
            200,
            "SIG{signal}"
        );
        let answer = acquire(&restarted, "hourly").await;
        assert_eq!(
            reason(&answer),
            "capacity",
            "SIG{signal}: {}",
            answer.text()
        );
    }
}

/// The embedded default's bound after kill -9: a limit of 100 per hour that granted 10 grants
/// at least 77 more at once after the restart (each counter holds back at most its budget, an
/// eighth of the limit), and the test's own count over both runs never sees more than 100 in
/// an hour; for each algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_holds_back_at_most_each_counters_budget() {
    let mut server = fresh_server();
    let algorithms = ["sliding", "fixed", "gcra"];
    for algorithm in algorithms {
        let burst = if algorithm == "gcra" {
            r#","burst":100"#
        } else {
            ""
        };
        put_limit(
            &server,
            algorithm,
            &format!(
                r#"{{"kind":"rate","limit":100,"period_ms":3600000,"algorithm":"{algorithm}"{burst}}}"#
            ),
        )
        .await;
    }
    let started = Instant::now();
    let mut tallies: Vec<Tally> = algorithms.iter().map(|_| Tally::default()).collect();
    for (algorithm, tally) in algorithms.iter().zip(&mut tallies) {
        for _ in 0..10 {
            let answer = acquire(&server, algorithm).await;
            assert!(tally.count(&answer), "{algorithm}: {}", answer.text());
        }
    }
    kill_hard(&mut server);
    let restarted = restart(&mut server);
    for (algorithm, tally) in algorithms.iter().zip(&mut tallies) {
        let before = tally.granted.len();
        let refusal = loop {
            let answer = acquire(&restarted, algorithm).await;
            if !tally.count(&answer) {
                break answer;
            }
            assert!(
                tally.granted.len() <= 200,
                "{algorithm}: no end to the grants"
            );
        };
        let after = tally.granted.len() - before;
        assert!(
            after >= 77,
            "{algorithm}: only {after} granted after the crash; refused with {}",
            refusal.text()
        );
        assert_eq!(refusal.status, 429, "{algorithm}: {}", refusal.text());
        assert_eq!(
            reason(&refusal),
            "capacity",
            "{algorithm}: {}",
            refusal.text()
        );
        let hour = Duration::from_secs(3600);
        assert!(
            tally.most_within(hour) <= 100,
            "{algorithm}: {} granted within an hour",
            tally.most_within(hour)
        );
    }
    // Every grant fell within one hour of the test's clock (and one fixed window would have
    // to roll over between the runs for the count to restart: see the last assertion's bound).
    assert!(started.elapsed() < Duration::from_secs(3600));
}

/// Grants in flight when the process is killed: four callers at once, killed mid-burst. The
/// answers lost with the process were at most the four in flight; over both runs the test's
/// count stays within the limit, and the restart grants all but a budget and those four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_burst_stays_within_the_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let mut server = fresh_server();
    put_limit(
        &server,
        "burst",
        r#"{"kind":"rate","limit":1000,"period_ms":3600000}"#,
    )
    .await;
    let granted = Arc::new(AtomicUsize::new(0));
    let pid = server.pid().to_string();
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let client = server.anonymous();
            let granted = granted.clone();
            let pid = pid.clone();
            tokio::spawn(async move {
                let body = br#"{"limits":["burst"]}"#;
                // Until refused, or the server is gone.
                while let Ok(answer) = client
                    .send_raw(Method::POST, "/v1/acquire", body.to_vec(), DEADLINE)
                    .await
                    && answer.status == 200
                {
                    // The caller that counts the 300th grant kills the server at once, while
                    // the other three are in flight: however slow the machine, the burst is
                    // cut short there, not wherever a watcher happens to wake.
                    if granted.fetch_add(1, Ordering::SeqCst) + 1 == 300 {
                        let killed = Command::new("kill")
                            .args(["-KILL", &pid])
                            .status()
                            .expect("kill");
                        assert!(killed.success());
                    }
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("caller");
    }
    server.wait_exit();
    let before = granted.load(Ordering::SeqCst);
    assert!(before < 1000, "the burst ended before the kill");
    let restarted = restart(&mut server);
    let mut after = 0;
    while acquire(&restarted, "burst").await.status == 200 {
        after += 1;
        assert!(after <= 1000, "no end to the grants");
    }
    assert!(before + after <= 1000, "{before} + {after} granted");
    // Lost with the process: at most the 4 answers in flight and the budget of 125.
    assert!(
        before + 4 + 125 + after >= 1000,
        "only {after} granted after {before}\n{}",
        restarted.log()
    );
}

/// Counters made right before the crash, each granted once and killed at once: each was
/// recorded before its first grant, so each resumes with its grant and its budget counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_made_just_before_a_crash_resume_within_their_limit() {
    let mut server = fresh_server();
    put_limit(
        &server,
        "per-user",
        r#"{"kind":"rate","limit":8,"period_ms":3600000,"per":"user"}"#,
    )
    .await;
    let keys: Vec<String> = (0..20).map(|n| format!("user-{n}")).collect();
    for key in &keys {
        let answer = acquire_key(&server, "per-user", key).await;
        assert_eq!(answer.status, 200, "{key}: {}", answer.text());
    }
    kill_hard(&mut server);
    let restarted = restart(&mut server);
    for key in &keys {
        let mut after = 0;
        let refusal = loop {
            let answer = acquire_key(&restarted, "per-user", key).await;
            if answer.status != 200 {
                break answer;
            }
            after += 1;
            assert!(after <= 8, "{key}: no end to the grants");
        };
        // 1 before the crash, so at most 7 after it, of a limit of 8.
        assert!(after <= 7, "{key}: 1 + {after} granted");
        assert!(
            after >= 6,
            "{key}: only {after} after the crash; refused with {}",
            refusal.text()
        );
        assert_eq!(reason(&refusal), "capacity", "{key}: {}", refusal.text());
    }
}

/// How far ahead of itself a heartbeat vouches that the run may be granting
/// (`crates/server/src/runs.rs`: two heartbeat intervals of 5 s).
const HEARTBEAT_VOUCHES_MS: u64 = 10_000;

/// Leases have no budget: a crash holds each concurrency limit the crashed run had until one
/// lease TTL after what its last heartbeat vouched for, with reason `recovering`; a limit created
/// since is not held, nor is a rate limit. The server stays down for longer than a heartbeat
/// vouches, so a hold counted from the restart would show: the hour-long limit would be held a
/// full hour from the restart, and the brief one (2 s) would be held at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_holds_concurrency_limits_from_the_last_heartbeat_not_from_the_restart() {
    let mut server = fresh_server();
    put_limit(
        &server,
        "exports",
        r#"{"kind":"concurrency","limit":5,"lease_ttl_ms":3600000}"#,
    )
    .await;
    put_limit(
        &server,
        "brief",
        r#"{"kind":"concurrency","limit":5,"lease_ttl_ms":2000}"#,
    )
    .await;
    rate_limit(&server, "hourly", 3_600_000).await;
    assert_eq!(acquire(&server, "exports").await.status, 200);
    assert_eq!(acquire(&server, "brief").await.status, 200);
    assert_eq!(acquire(&server, "hourly").await.status, 200);
    let crashed_at = Instant::now();
    kill_hard(&mut server);
    // Down past what the last heartbeat vouched for and the brief limit's TTL after it. Nothing
    // runs to be waited on: the gap itself is what the test measures against.
    let down = Duration::from_millis(HEARTBEAT_VOUCHES_MS + 2_000 + 1_000);
    std::thread::sleep(down.saturating_sub(crashed_at.elapsed()));
    let restarted = restart(&mut server);
    // The brief limit's hold ended while the server was down: granted at once.
    let brief = acquire(&restarted, "brief").await;
    assert_eq!(brief.status, 200, "held from the restart: {}", brief.text());
    let answer = acquire(&restarted, "exports").await;
    assert_recovering(&answer);
    let message = answer.error_message().unwrap_or_default();
    assert!(message.contains("recover_on_start"), "{message}");
    // Held until at most heartbeat + 10 s + the TTL, the heartbeat no later than the crash:
    // an hour less the time since the crash beyond those 10 s (1 s of room for the clocks).
    // Counted from the restart it would be a full hour.
    let retry_ms = answer.json.as_ref().expect("json")["retry_after_ms"]
        .as_u64()
        .expect("retry_after_ms");
    let hour_ms = 3_600_000;
    let since_crash_ms = u64::try_from(crashed_at.elapsed().as_millis()).unwrap_or(u64::MAX);
    assert!(
        retry_ms + since_crash_ms <= hour_ms + HEARTBEAT_VOUCHES_MS + 1_000,
        "held {retry_ms} ms, {since_crash_ms} ms after the crash: counted from the restart?"
    );
    assert!(retry_ms > hour_ms - 60_000, "held only {retry_ms} ms");
    // The rate limit resumes: 1 granted of 5, and at most its budget of 1 held back.
    for _ in 0..3 {
        let answer = acquire(&restarted, "hourly").await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    // A limit created after the start was never granted on by the crashed run: not held.
    put_limit(
        &restarted,
        "new",
        r#"{"kind":"concurrency","limit":5,"lease_ttl_ms":3600000}"#,
    )
    .await;
    assert_eq!(acquire(&restarted, "new").await.status, 200);
}

/// A second memory-store server on the same state database while the first still runs takes
/// the run over: the first is fenced off, grants at most what its recorded budget leaves, then
/// refuses with `store_unavailable`; the second resumes from the first's records, each with its
/// budget held back. Over both servers the test's count stays within the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_state_fences_the_first_off() {
    let mut first = fresh_server();
    put_limit(
        &first,
        "hourly",
        r#"{"kind":"rate","limit":16,"period_ms":3600000}"#,
    )
    .await;
    let mut tally = Tally::default();
    for _ in 0..3 {
        let answer = acquire(&first, "hourly").await;
        assert!(tally.count(&answer), "{}", answer.text());
    }
    let second = restart(&mut first);
    let mut first_after = 0;
    let mut second_after = 0;
    let mut first_refused = None;
    for _ in 0..40 {
        let answer = acquire(&first, "hourly").await;
        if tally.count(&answer) {
            first_after += 1;
        } else {
            first_refused = Some(answer);
        }
        let answer = acquire(&second, "hourly").await;
        if tally.count(&answer) {
            second_after += 1;
        }
    }
    let hour = Duration::from_secs(3600);
    assert!(
        tally.most_within(hour) <= 16,
        "3 + {first_after} + {second_after} granted"
    );
    // The first spent no more than its budget of 2 past its last record.
    assert!(first_after <= 2, "the fenced server granted {first_after}");
    assert!(
        second_after >= 16 - 3 - 2,
        "only {second_after} granted by the second\n{}",
        second.log()
    );
    let refused = first_refused.expect("the first refuses");
    assert_error(&refused, 503, "store_unavailable", None);
    until("the fenced server says so", async || {
        first.log().contains("took over")
    })
    .await;
}

/// A state database that cannot take the records (another program holds its write lock):
/// counters grant what their recorded budgets leave; a request that needs a new record is
/// refused with `store_unavailable` naming the state database, and `/readyz` says the store is
/// failing; once the database takes writes again, grants resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_state_database_refuses_only_what_needs_a_new_record() {
    use sqlx::Connection;

    let server = fresh_server();
    put_limit(
        &server,
        "per-user",
        r#"{"kind":"rate","limit":64,"period_ms":3600000,"per":"user"}"#,
    )
    .await;
    // A budget of 8, recorded before the first grant.
    assert_eq!(acquire_key(&server, "per-user", "known").await.status, 200);
    let url = format!(
        "sqlite://{}",
        server.directory.path().join("tollgate.db").display()
    );
    let mut lock = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("tollgate.db");
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut lock)
        .await
        .expect("lock");
    // Within its budget: granted.
    let answer = acquire_key(&server, "per-user", "known").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    // A counter with no record yet grants nothing until one is written.
    let answer = acquire_key(&server, "per-user", "new").await;
    assert_error(&answer, 503, "store_unavailable", None);
    let message = answer.error_message().unwrap_or_default();
    assert!(message.contains("state database"), "{message}");
    let ready = call(&server.anonymous(), Method::GET, "/readyz", "").await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    sqlx::query("ROLLBACK")
        .execute(&mut lock)
        .await
        .expect("unlock");
    until("grants resume", async || {
        acquire_key(&server, "per-user", "new").await.status == 200
    })
    .await;
}

/// A Redis namespace the rules database never knew is new: nothing is held on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_redis_namespace_grants_at_once() {
    let Ok(redis) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(
            "a_new_redis_namespace_grants_at_once: TOLLGATE_TEST_REDIS is unset, so it did not \
             run against Redis",
        );
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    let namespace = format!("restart-{}-{nanos}", std::process::id());
    let server = Server::start_with(Options {
        default_recovery: true,
        args: vec!["--store", &redis, "--redis-namespace", &namespace],
        ..Options::default()
    });
    rate_limit(&server, "daily", 86_400_000).await;
    let answer = acquire(&server, "daily").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// A server with Envoy's service on the configuration `api.yaml` in `directory`, recovering as a
/// default start does.
fn start_envoy(directory: tempfile::TempDir) -> Server {
    Server::start_with(Options {
        args: vec!["--grpc-listen", "127.0.0.1:0", "--envoy-config", "api.yaml"],
        default_recovery: true,
        directory: Some(directory),
        ..Options::default()
    })
}

/// One hit of the descriptor `user=u1` in domain `api`: Envoy's answer.
async fn ask_envoy(
    server: &Server,
) -> envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let url = server.grpc.clone().expect("the gRPC address");
    let mut client = RateLimitServiceClient::connect(url).await.expect("connect");
    let request = RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "u1".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    let answer = client.should_rate_limit(request).await.expect("answered");
    Code::try_from(answer.into_inner().overall_code).expect("a code")
}

/// Envoy's counters on the memory store are restored after a clean stop, and after a crash
/// resume from their records: a restart never grants a descriptor's window again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_counters_survive_a_clean_stop_and_are_held_after_a_crash() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let directory = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        directory.path().join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
    )
    .expect("write");
    let mut server = start_envoy(directory);
    assert_eq!(ask_envoy(&server).await, Code::Ok);
    assert_eq!(ask_envoy(&server).await, Code::Ok);
    assert_eq!(ask_envoy(&server).await, Code::OverLimit);
    // A clean stop saves the counters; the next start puts them back.
    assert!(server.terminate().success());
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    let mut server = start_envoy(directory);
    assert_eq!(
        ask_envoy(&server).await,
        Code::OverLimit,
        "{}",
        server.log()
    );
    // After a crash the next start puts back the last records: the window stays spent.
    let status = Command::new("kill")
        .args(["-KILL", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    server.wait_exit();
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    let server = start_envoy(directory);
    assert_eq!(
        ask_envoy(&server).await,
        Code::OverLimit,
        "{}",
        server.log()
    );
}

/// Envoy's counters after kill -9, as the rules' own: a descriptor of 100 per hour that
/// granted 10 grants at least 77 more at once after the restart, and the test's own count over
/// both runs never sees more than 100 in an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_counters_resume_with_at_most_a_budget_held_back_after_a_crash() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let directory = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        directory.path().join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
    )
    .expect("write");
    let mut server = start_envoy(directory);
    let mut granted = Vec::new();
    for _ in 0..10 {
        assert_eq!(ask_envoy(&server).await, Code::Ok);
        granted.push(Instant::now());
    }
    kill_hard(&mut server);
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    let server = start_envoy(directory);
    let mut after = 0;
    while ask_envoy(&server).await == Code::Ok {
        granted.push(Instant::now());
        after += 1;
        assert!(after <= 100, "no end to the grants");
    }
    assert!(
        after >= 77,
        "only {after} granted after the crash\n{}",
        server.log()
    );
    let hour = Duration::from_secs(3600);
    let tally = Tally { granted };
    assert!(
        tally.most_within(hour) <= 100,
        "{} within an hour",
        tally.most_within(hour)
    );
}

/// The last valid version of a rule is kept in the state database: a row broken while the
/// server was down is served as it last was, and reported; a row that was never valid is absent
/// and reported; a row deleted while the server was down is not brought back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_broken_while_the_server_was_down_keeps_its_last_valid_version() {
    let mut server = fresh_server();
    rate_limit(&server, "login", 3_600_000).await;
    rate_limit(&server, "gone", 3_600_000).await;
    assert!(server.terminate().success(), "{}", server.log());
    let url = format!(
        "sqlite://{}",
        server.directory.path().join("tollgate.db").display()
    );
    {
        let pool = sqlx::SqlitePool::connect(&url).await.expect("tollgate.db");
        for sql in [
            "UPDATE tollgate_limits SET period_ms = '1m' WHERE name = 'login'",
            "DELETE FROM tollgate_limits WHERE name = 'gone'",
            "INSERT INTO tollgate_limits (name, kind, limit_units, period_ms) VALUES ('typo', 'rate', 5, -1)",
        ] {
            sqlx::query(sql)
                .execute(&pool)
                .await
                .unwrap_or_else(|error| panic!("{sql}: {error}"));
        }
        pool.close().await;
    }
    let restarted = restart(&mut server);
    // The kept version is enforced: 5 per hour, the sixth refused.
    for attempt in 0..5 {
        let answer = acquire(&restarted, "login").await;
        assert_eq!(answer.status, 200, "grant {attempt}: {}", answer.text());
    }
    let answer = acquire(&restarted, "login").await;
    assert_eq!(answer.status, 429, "{}", answer.text());
    assert_eq!(reason(&answer), "capacity", "{}", answer.text());
    let limits = call(&restarted.admin(), Method::GET, "/v1/limits", "").await;
    let json = limits.json.clone().expect("json");
    let rejected = json["rejected"].as_array().expect("rejected rows");
    let row = |name: &str| {
        rejected
            .iter()
            .find(|row| row["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not reported: {}", limits.text()))
            .clone()
    };
    assert_eq!(row("login")["column"], "period_ms", "{}", limits.text());
    assert_eq!(row("login")["previous_in_force"], true, "{}", limits.text());
    assert_eq!(row("typo")["previous_in_force"], false, "{}", limits.text());
    let names: Vec<&str> = json["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .filter_map(|limit| limit["name"].as_str())
        .collect();
    assert_eq!(names, ["login"], "{}", limits.text());
    let ready = call(&restarted.anonymous(), Method::GET, "/readyz", "").await;
    assert!(
        ready.text().contains("its previous version stays in force"),
        "{}",
        ready.text()
    );
}

/// A user's record in the state database (its counter's state: grant times to the
/// microsecond) lives only as long as its counter counts: it is gone within seconds of the
/// counter going idle, and its bytes with it, so after a clean stop neither the key nor its
/// hex id is anywhere in the database's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_grant_times_leave_the_state_database_when_its_counter_goes_idle() {
    let mut server = fresh_server();
    put_limit(
        &server,
        "per-user",
        r#"{"kind":"rate","limit":4,"period_ms":1000,"per":"user"}"#,
    )
    .await;
    let key = "alice-0c5e2b";
    let answer = acquire_key(&server, "per-user", key).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let granted = Instant::now();
    let database = server.directory.path().join("tollgate.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", database.display()))
        .await
        .expect("open the state database");
    let rows = async || -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM tollgate_limits_ahead WHERE counter_key = ?")
            .bind(key)
            .fetch_one(&pool)
            .await
            .expect("count")
    };
    // Written before its first grant.
    assert_eq!(rows().await, 1);
    until("the idle counter's record goes", async || rows().await == 0).await;
    // One period to go idle, a sweep (1 s) to forget it, the writer's next batch (1 s).
    assert!(
        granted.elapsed() < Duration::from_secs(5),
        "the record stayed {:?}",
        granted.elapsed()
    );
    pool.close().await;
    assert!(server.terminate().success(), "{}", server.log());
    let hex: String = key.bytes().map(|byte| format!("{byte:02x}")).collect();
    for entry in std::fs::read_dir(server.directory.path()).expect("read dir") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().contains("tollgate.db") {
            continue;
        }
        let bytes = std::fs::read(&path).expect("read");
        for needle in [key.as_bytes(), hex.as_bytes()] {
            assert!(
                !bytes.windows(needle.len()).any(|window| window == needle),
                "{} still holds {:?}",
                path.display(),
                String::from_utf8_lossy(needle)
            );
        }
    }
}
