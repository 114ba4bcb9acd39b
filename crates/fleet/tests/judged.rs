//! Fleets judged by the vendor: three `tollgate-outbound-worker` processes saturate a vendor
//! through one `tollgate serve` (memory store), and the judge is `tollgate-mock-vendor`, which
//! counts every arrival on its own clock and answers 429 past its own limit. Nothing here takes
//! Tollgate's word: the figures are the vendor's report.
//!
//! - On the defaults (no margin configured), the vendor never sees more than the limit in any
//!   of its windows: the margin learned from the delays the callers report covers them.
//! - A vendor stricter than the configured limit, advertising its limit in headers, is obeyed
//!   after its first answer; one that lowers its limit mid-run is followed; one that says
//!   nothing but 429 is learned from its refusals. Each beside pause-only (learning off) in the
//!   same run, and held to the bounds `docs/outbound.md` states.
//!
//! Each run lasts `TOLLGATE_JUDGE_SECONDS` (default 15); `docs/lab.md` has the figures of 60 s
//! runs. The `tollgate` binary is package `tollgate-cli`'s, found beside this package's
//! binaries: build it first (`cargo build -p tollgate-cli -p tollgate-fleet --bins`).

mod processes;

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use processes::{Killed, first_line, lines_of, server_command, start};
use serde_json::Value;

const ADMIN_TOKEN: &str = "admin-token-for-tests";
const DATA_TOKEN: &str = "data-token-for-tests";
const PROCESSES: usize = 3;
const CALLERS: u32 = 3;

fn seconds() -> f64 {
    std::env::var("TOLLGATE_JUDGE_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(15.0)
}

struct Server {
    _process: Killed,
    url: String,
    _directory: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let directory = tempfile::tempdir().expect("tempdir");
        let mut command = server_command(directory.path());
        command
            .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("TOLLGATE_DATA_TOKEN", DATA_TOKEN)
            .args(["serve", "--listen", "127.0.0.1:0"]);
        let (child, url) = start(
            &mut command,
            "`tollgate: listening on`",
            "tollgate: listening on ",
        );
        Server {
            _process: child,
            url,
            _directory: directory,
        }
    }

    async fn put_limit(&self, name: &str, rule: &str) {
        let answer = reqwest::Client::new()
            .put(format!("{}/v1/limits/{name}", self.url))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(rule.to_owned())
            .send()
            .await
            .expect("put");
        assert!(
            answer.status().is_success(),
            "put {name}: {:?}",
            answer.text().await
        );
    }

    async fn learned(&self, name: &str) -> Value {
        let stats: Value = reqwest::Client::new()
            .get(format!("{}/v1/stats?limit={name}", self.url))
            .bearer_auth(DATA_TOKEN)
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("json");
        stats["limits"][0]["learned"].clone()
    }
}

struct Vendor {
    _process: Killed,
    url: String,
}

impl Vendor {
    fn start(args: &[&str]) -> Vendor {
        let (child, url) = start(
            Command::new(env!("CARGO_BIN_EXE_tollgate-mock-vendor"))
                .args(["--listen", "127.0.0.1:0"])
                .args(args),
            "the vendor's address",
            "listening on ",
        );
        Vendor {
            _process: child,
            url,
        }
    }

    async fn report(&self) -> Value {
        reqwest::get(format!("{}/_vendor/report", self.url))
            .await
            .expect("report")
            .json()
            .await
            .expect("json")
    }

    async fn set_limit(&self, limit: u64) {
        let answer = reqwest::Client::new()
            .post(format!("{}/_vendor/limit", self.url))
            .header("content-type", "application/json")
            .body(format!(r#"{{"limit":{limit}}}"#))
            .send()
            .await
            .expect("limit");
        assert!(answer.status().is_success());
    }
}

/// What the fleet's processes said when they were done.
#[derive(Debug, Default)]
struct Sent {
    sent: u64,
    lessons: u64,
    errors: u64,
}

struct Fleet {
    workers: Vec<(Killed, Receiver<String>, ChildStdin)>,
}

impl Fleet {
    fn start(server: &Server, limit: &str, vendor: &Vendor, learn: bool) -> Fleet {
        let mut workers = Vec::new();
        for _ in 0..PROCESSES {
            let mut child = Killed(
                Command::new(env!("CARGO_BIN_EXE_tollgate-outbound-worker"))
                    .args([
                        server.url.as_str(),
                        DATA_TOKEN,
                        limit,
                        &format!("{}/v1/things", vendor.url),
                        &CALLERS.to_string(),
                        &seconds().to_string(),
                        &learn.to_string(),
                    ])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("start a worker"),
            );
            let stdin = child.0.stdin.take().expect("stdin");
            let lines = lines_of(&mut child.0);
            workers.push((child, lines, stdin));
        }
        for (_, lines, _) in &workers {
            first_line(lines, "a worker's `ready`", "ready");
        }
        Fleet { workers }
    }

    /// Start every worker at once.
    fn go(&mut self) {
        for (_, _, stdin) in &mut self.workers {
            stdin.write_all(b"go\n").expect("go");
            stdin.flush().expect("flush");
        }
    }

    fn finish(self) -> Sent {
        let mut total = Sent::default();
        for (_, lines, _) in &self.workers {
            let stats = first_line(lines, "a worker's stats", "stats ");
            let numbers: Vec<u64> = stats
                .split(' ')
                .map(|word| word.parse().expect("a number"))
                .collect();
            total.sent += numbers[0];
            total.lessons += numbers[5];
            total.errors += numbers[6];
        }
        total
    }
}

/// One fleet run against a fresh vendor and server: the vendor's report and the workers' tally.
async fn run(
    rule: &str,
    vendor_args: &[&str],
    learn: bool,
    mid_run: Option<u64>,
) -> (Value, Sent, Value) {
    let server = Server::start();
    server.put_limit("vendor", rule).await;
    let vendor = Vendor::start(vendor_args);
    let mut fleet = Fleet::start(&server, "vendor", &vendor, learn);
    fleet.go();
    if let Some(limit) = mid_run {
        tokio::time::sleep(Duration::from_secs_f64(seconds() / 2.0)).await;
        vendor.set_limit(limit).await;
    }
    let sent = tokio::task::spawn_blocking(move || fleet.finish())
        .await
        .expect("the fleet finished");
    let report = vendor.report().await;
    let learned = server.learned("vendor").await;
    println!(
        "learn={learn} {vendor_args:?}: calls {} ok {} limited {} most in any window {} \
         used_share {:.3}; lessons {} errors {}; learned {learned}",
        report["calls"],
        report["ok"],
        report["limited"],
        report["most_in_any_window"],
        report["used_share"].as_f64().unwrap_or(0.0),
        sent.lessons,
        sent.errors
    );
    (report, sent, learned)
}

/// The same fleet pause-only, then learning: the vendor's two reports, and what the server
/// learned in the second.
async fn both(rule: &str, vendor_args: &[&str], mid_run: Option<u64>) -> (Value, Value, Value) {
    let (paused, _, _) = run(rule, vendor_args, false, mid_run).await;
    let (learned, _, state) = run(rule, vendor_args, true, mid_run).await;
    (paused, learned, state)
}

fn number(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_defaults_the_vendor_never_counts_more_than_the_limit() {
    let (report, sent, learned) = run(
        r#"{"kind":"rate","limit":10,"period_ms":1000}"#,
        &[
            "--limit",
            "10",
            "--period-ms",
            "1000",
            "--window",
            "sliding",
            "--headers",
            "none",
        ],
        true,
        None,
    )
    .await;
    assert!(sent.sent > 0 && sent.errors == 0, "{sent:?}");
    assert!(
        number(&report, "most_in_any_window") <= 10,
        "the vendor counted more than 10 in one of its windows: {report}"
    );
    assert_eq!(number(&report, "limited"), 0, "{report}");
    assert!(
        learned["margin_ms"].as_u64().is_some_and(|ms| ms > 0),
        "{learned}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advertised_limit_below_the_configured_one_is_obeyed() {
    let rule = r#"{"kind":"rate","limit":20,"period_ms":1000}"#;
    let vendor = [
        "--limit",
        "10",
        "--period-ms",
        "1000",
        "--window",
        "sliding",
        "--headers",
        "ietf",
    ];
    let (paused, learned, state) = both(rule, &vendor, None).await;
    // The first calls go before any answer: three processes of three callers, nine, below the
    // vendor's ten. Every refusal comes after an answer.
    assert!(number(&learned, "limited") <= 1, "{learned}");
    assert!(
        learned["used_share"]
            .as_f64()
            .is_some_and(|share| share >= 0.85),
        "{learned}"
    );
    assert!(
        number(&paused, "limited") > number(&learned, "limited"),
        "{paused}"
    );
    assert_eq!(state["effective"], 10, "{state}");
    assert!(
        state["learned"]["source"]
            .as_str()
            .is_some_and(|source| source.contains("ietf")),
        "{state}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vendor_that_lowers_its_limit_mid_run_is_followed() {
    let rule = r#"{"kind":"rate","limit":10,"period_ms":1000}"#;
    let vendor = [
        "--limit",
        "10",
        "--period-ms",
        "1000",
        "--window",
        "sliding",
        "--headers",
        "openai",
    ];
    let (paused, learned, _) = both(rule, &vendor, Some(5)).await;
    assert!(number(&learned, "limited") <= 2, "{learned}");
    assert!(
        number(&paused, "limited") > number(&learned, "limited"),
        "{paused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vendor_that_only_refuses_is_learned_from_its_refusals() {
    let rule = r#"{"kind":"rate","limit":20,"period_ms":1000}"#;
    let vendor = [
        "--limit",
        "10",
        "--period-ms",
        "1000",
        "--window",
        "sliding",
        "--headers",
        "none",
    ];
    let (paused, learned, _) = both(rule, &vendor, None).await;
    let (refused, refused_before) = (number(&learned, "limited"), number(&paused, "limited"));
    // A vendor that says nothing can only be learned by going over it once: the refusals are
    // those of the calls in flight when the first one came back, then none.
    assert!(
        refused <= u64::from(CALLERS) * PROCESSES as u64 && refused < refused_before,
        "learning: {refused} refusals, pause-only: {refused_before}"
    );
    assert!(
        learned["used_share"]
            .as_f64()
            .is_some_and(|share| share >= 0.75),
        "{learned}"
    );
}
