//! Token budgets judged by the model: three `tollgate-llm-worker` processes call
//! `tollgate-mock-model` through one `tollgate serve` (memory store), with mixed APIs, streamed
//! and whole answers of random lengths, and calls that fail, are cut off or are cancelled. The
//! model counts requests, input and output tokens on its own clock and answers 429 past its
//! limits; the figures are its report, never Tollgate's word.
//!
//! - Every request sets `max_tokens`: no 429 and no window over any of the model's limits.
//! - No request sets it, and the model writes up to 400 tokens past the configured estimate:
//!   the model's output count passes its limit by at most one stream's excess.
//! - The flawed way (tokens charged once the answer has ended) overruns the same model.
//!
//! Each run lasts `TOLLGATE_LLM_SECONDS` (default 20); `docs/lab.md` has the figures of 60 s
//! runs. Build the binaries first: `cargo build -p tollgate-cli -p tollgate-fleet --bins`.

mod processes;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use processes::{Killed, lines_of, server_binary};
use serde_json::Value;

const ADMIN_TOKEN: &str = "admin-token-for-tests";
const DATA_TOKEN: &str = "data-token-for-tests";
const PROCESSES: usize = 3;
const CALLERS: u32 = 3;
/// The model's limits, per period.
const PERIOD_MS: u64 = 5_000;
const RPM: u64 = 200;
const ITPM: u64 = 60_000;
const OTPM: u64 = 6_000;
/// The worker's output estimate of a request without `max_tokens`, and the most the model
/// writes for one (`tollgate-llm-worker`'s constants): one stream's excess is their difference.
const STREAM_EXCESS_MOST: u64 = 600 - 200;

/// One run at a time: the safety figures are wall-clock ones.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn seconds() -> f64 {
    std::env::var("TOLLGATE_LLM_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20.0)
}

fn first_line(lines: &Receiver<String>, what: &str, prefix: &str) -> String {
    loop {
        match lines.recv_timeout(Duration::from_secs(180)) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return rest.to_owned();
                }
            }
            Err(error) => panic!("no {what}: {error}"),
        }
    }
}

fn start(command: &mut Command, what: &str, prefix: &str) -> (Killed, String) {
    let mut child = Killed(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("start {what}: {error}")),
    );
    let lines = lines_of(&mut child.0);
    let url = first_line(&lines, what, prefix);
    (child, url)
}

/// What the fleet's processes said: sent, vendor 429s, errors, topped up, top-ups refused,
/// debt carried, settlements failed.
#[derive(Debug, Default)]
struct Sent([u64; 7]);

async fn run(mode: &str) -> (Value, Sent) {
    let _serial = SERIAL.lock().await;
    let directory = tempfile::tempdir().expect("tempdir");
    let log = std::fs::File::create(directory.path().join("server.log")).expect("log");
    let mut command = Command::new(server_binary());
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("TOLLGATE_")) {
        command.env_remove(name);
    }
    command
        .current_dir(directory.path())
        .env("XDG_STATE_HOME", directory.path().join(".state"))
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("TOLLGATE_DATA_TOKEN", DATA_TOKEN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stderr(log);
    let (_server, server) = start(&mut command, "tollgate serve", "tollgate: listening on ");
    let client = reqwest::Client::new();
    for (name, rule) in [
        (
            "llm-requests",
            format!(r#"{{"kind":"rate","limit":{RPM},"period_ms":{PERIOD_MS}}}"#),
        ),
        (
            "llm-input",
            format!(r#"{{"kind":"rate","limit":{ITPM},"period_ms":{PERIOD_MS}}}"#),
        ),
        (
            "llm-output",
            format!(r#"{{"kind":"rate","limit":{OTPM},"period_ms":{PERIOD_MS}}}"#),
        ),
        (
            "llm-overrun",
            r#"{"kind":"concurrency","limit":1,"lease_ttl_ms":120000}"#.to_owned(),
        ),
    ] {
        let answer = client
            .put(format!("{server}/v1/limits/{name}"))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(rule)
            .send()
            .await
            .expect("put a limit");
        assert!(
            answer.status().is_success(),
            "{name}: {:?}",
            answer.text().await
        );
    }
    let (_model, model) = start(
        Command::new(env!("CARGO_BIN_EXE_tollgate-mock-model")).args([
            "--rpm",
            &RPM.to_string(),
            "--itpm",
            &ITPM.to_string(),
            "--otpm",
            &OTPM.to_string(),
            "--period-ms",
            &PERIOD_MS.to_string(),
        ]),
        "tollgate-mock-model",
        "listening on ",
    );
    let mut workers = Vec::new();
    for seed in 0..PROCESSES {
        let mut child = Killed(
            Command::new(env!("CARGO_BIN_EXE_tollgate-llm-worker"))
                .args([
                    server.as_str(),
                    DATA_TOKEN,
                    model.as_str(),
                    &CALLERS.to_string(),
                    &seconds().to_string(),
                    mode,
                    &(seed + 1).to_string(),
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
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
    for (_, _, stdin) in &mut workers {
        stdin.write_all(b"go\n").expect("go");
        stdin.flush().expect("flush");
    }
    let sent = tokio::task::spawn_blocking(move || {
        let mut total = Sent::default();
        for (_, lines, _) in &workers {
            let stats = first_line(lines, "a worker's stats", "stats ");
            for (slot, word) in total.0.iter_mut().zip(stats.split(' ')) {
                *slot += word.parse::<u64>().expect("a number");
            }
        }
        total
    })
    .await
    .expect("the fleet finished");
    let report: Value = client
        .get(format!("{model}/_model/report"))
        .send()
        .await
        .expect("report")
        .json()
        .await
        .expect("json");
    println!("{mode}: {report}; workers {sent:?}");
    (report, sent)
}

fn number(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_tokens_the_model_never_refuses_nor_counts_past_its_limits() {
    let (report, sent) = run("bounded").await;
    assert!(sent.0[0] > 0 && sent.0[2] == 0, "{sent:?}");
    assert_eq!(number(&report, "limited"), 0, "{report}");
    assert!(
        number(&report, "most_output_in_any_window") <= OTPM,
        "{report}"
    );
    assert!(
        number(&report, "most_input_in_any_window") <= ITPM,
        "{report}"
    );
    assert!(
        number(&report, "most_requests_in_any_window") <= RPM,
        "{report}"
    );
    assert!(number(&report, "failed") + number(&report, "cut") + number(&report, "cancelled") > 0);
    // The exact figure is in docs/lab.md; this floor leaves room for a slow machine.
    assert!(
        report["output_used_share_steady"]
            .as_f64()
            .is_some_and(|share| share >= 0.7),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_max_tokens_the_model_is_passed_by_at_most_one_streams_excess() {
    let (report, sent) = run("unbounded").await;
    assert!(sent.0[0] > 0 && sent.0[2] == 0, "{sent:?}");
    assert!(
        number(&report, "output_excess") <= STREAM_EXCESS_MOST,
        "{report}"
    );
    assert!(
        number(&report, "most_input_in_any_window") <= ITPM,
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charging_tokens_once_the_answer_has_ended_overruns_the_model() {
    let (report, _) = run("at-end").await;
    assert!(
        number(&report, "limited") > 0 && number(&report, "most_output_in_any_window") > OTPM,
        "{report}"
    );
}
