//! Restarts of the real `tollgate serve` on the embedded default (memory store, SQLite rules):
//! a fresh start holds nothing back, a clean stop resumes its counters exactly, and a crash
//! holds only the limits the crashed run had, from its last heartbeat, with their own reason.

mod common;

use std::process::Command;
use std::time::Instant;

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

/// Closing the terminal (SIGHUP), Ctrl-C (SIGINT) and Ctrl-\\ (SIGQUIT) are stops like
/// SIGTERM: the counters are saved, and the next start resumes them rather than holding every
/// limit as after a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ordinary_signal_is_a_clean_stop() {
    for signal in ["HUP", "INT", "QUIT"] {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_holds_the_old_limits_from_the_last_heartbeat_and_no_others() {
    let mut server = fresh_server();
    rate_limit(&server, "hourly", 3600000).await;
    rate_limit(&server, "brief", 2000).await;
    assert_eq!(acquire(&server, "hourly").await.status, 200);
    assert_eq!(acquire(&server, "brief").await.status, 200);
    let crashed_at = Instant::now();
    let killed = Command::new("kill")
        .args(["-KILL", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    server.wait_exit();
    let restarted = restart(&mut server);
    let answer = acquire(&restarted, "hourly").await;
    assert_recovering(&answer);
    let message = answer.error_message().unwrap_or_default();
    assert!(message.contains("recover_on_start"), "{message}");
    // Held from the last heartbeat (at most two heartbeat intervals before the crash counted
    // as granting), not from this start: never past crash + 10 s + the period.
    let retry_ms = answer.json.as_ref().expect("json")["retry_after_ms"]
        .as_u64()
        .expect("retry_after_ms");
    let hour_ms = 3_600_000;
    let since_crash_ms = u64::try_from(crashed_at.elapsed().as_millis()).unwrap_or(0);
    assert!(
        retry_ms <= hour_ms + 10_000 - since_crash_ms.min(10_000) + 1_000,
        "held {retry_ms} ms"
    );
    assert!(retry_ms > hour_ms - 60_000, "held only {retry_ms} ms");
    // A limit created after the start was never granted on by the crashed run: not held.
    rate_limit(&restarted, "new", 3600000).await;
    assert_eq!(acquire(&restarted, "new").await.status, 200);
    // The brief limit's hold ends within its period after the last heartbeat.
    until("the brief limit's hold ends", async || {
        acquire(&restarted, "brief").await.status == 200
    })
    .await;
}

/// A second memory-store server on the same rules database while the first still runs cannot
/// know what the first granted: it reads the first one's heartbeat as an unclean stop and holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_rules_holds_what_the_first_may_grant() {
    let mut first = fresh_server();
    rate_limit(&first, "hourly", 3600000).await;
    assert_eq!(acquire(&first, "hourly").await.status, 200);
    let second = restart(&mut first);
    let answer = acquire(&second, "hourly").await;
    assert_recovering(&answer);
    // The first goes on as before.
    assert_eq!(acquire(&first, "hourly").await.status, 200);
}

/// A Redis namespace the rules database never knew is new: nothing is held on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_redis_namespace_grants_at_once() {
    let Ok(redis) = std::env::var("TOLLGATE_TEST_REDIS") else {
        eprintln!(
            "SKIPPED a_new_redis_namespace_grants_at_once: TOLLGATE_TEST_REDIS is unset, so it \
             did not run against Redis"
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

/// Envoy's counters on the memory store are restored after a clean stop and held after a crash,
/// as the rules' own are: a restart never grants a descriptor's window again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_counters_survive_a_clean_stop_and_are_held_after_a_crash() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let start = |directory: tempfile::TempDir| {
        Server::start_with(Options {
            args: vec!["--grpc-listen", "127.0.0.1:0", "--envoy-config", "api.yaml"],
            default_recovery: true,
            directory: Some(directory),
            ..Options::default()
        })
    };
    let ask = async |server: &Server| {
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
    };
    let directory = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        directory.path().join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
    )
    .expect("write");
    let mut server = start(directory);
    assert_eq!(ask(&server).await, Code::Ok);
    assert_eq!(ask(&server).await, Code::Ok);
    assert_eq!(ask(&server).await, Code::OverLimit);
    // A clean stop saves the counters; the next start puts them back.
    assert!(server.terminate().success());
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    let mut server = start(directory);
    assert_eq!(ask(&server).await, Code::OverLimit, "{}", server.log());
    // A crash loses them; the next start holds the limit instead of granting again.
    let status = Command::new("kill")
        .args(["-KILL", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    server.wait_exit();
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    let server = start(directory);
    assert_eq!(ask(&server).await, Code::OverLimit, "{}", server.log());
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
