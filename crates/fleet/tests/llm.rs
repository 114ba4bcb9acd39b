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
use std::time::Duration;

use processes::{Killed, first_line, lines_of, server_command, start};
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

/// What the fleet's processes said: sent, vendor 429s, errors, topped up, top-ups refused,
/// tokens charged past a grant, settlements failed.
#[derive(Debug, Default)]
struct Sent([u64; 7]);

/// A server with the four limits, and the model: (server, its URL, model, its URL, the
/// server's directory).
async fn server_and_model() -> (Killed, String, Killed, String, tempfile::TempDir) {
    let directory = tempfile::tempdir().expect("tempdir");
    let mut command = server_command(directory.path());
    command
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("TOLLGATE_DATA_TOKEN", DATA_TOKEN)
        .args(["serve", "--listen", "127.0.0.1:0"]);
    let (server_process, server) = start(&mut command, "tollgate serve", "tollgate: listening on ");
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
    let (model_process, model) = start(
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
    (server_process, server, model_process, model, directory)
}

async fn run(mode: &str) -> (Value, Sent) {
    let _serial = SERIAL.lock().await;
    let (_server, server, _model, model, _directory) = server_and_model().await;
    let client = reqwest::Client::new();
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
    // Safety is the assertion; how much of the model was used is a figure (docs/lab.md), which
    // a loaded machine lowers. This floor only shows the fleet ran at all, so that "never over"
    // is not met by sending nothing.
    assert!(
        report["output_used_share_steady"]
            .as_f64()
            .is_some_and(|share| share >= 0.3),
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

/// What the server counts now on one limit.
async fn used(server: &str, limit: &str) -> u64 {
    let stats: Value = reqwest::Client::new()
        .get(format!("{server}/v1/stats?limit={limit}"))
        .bearer_auth(DATA_TOKEN)
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    stats["limits"][0]["usage"]["used"]
        .as_u64()
        .unwrap_or_else(|| panic!("{stats}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_way_an_answer_ends_is_charged_what_the_model_charged() {
    use tollgate_dispatch::llm::{BudgetLimits, EstimateConfig, TokenBudget};
    let _serial = SERIAL.lock().await;
    let (_server, server, _model, model, _directory) = server_and_model().await;
    let budget = || {
        TokenBudget::new(
            &server,
            Some(DATA_TOKEN.to_owned()),
            BudgetLimits {
                requests: "llm-requests".into(),
                input: "llm-input".into(),
                output: "llm-output".into(),
                overrun: Some("llm-overrun".into()),
            },
            EstimateConfig {
                output_default: 200,
                ..EstimateConfig::default()
            },
            Duration::from_secs(10),
        )
        .expect("budget")
    };
    let client = reqwest::Client::new();
    let call = |path: &str, body: Value, tokens: u64, extra: Option<(&str, &str)>| {
        let mut request = client
            .post(format!("{model}{path}"))
            .header("x-mock-tokens", tokens.to_string())
            .json(&body);
        if let Some((name, value)) = extra {
            request = request.header(name, value);
        }
        request.build().expect("request")
    };
    let hello = serde_json::json!([{"role": "user", "content": "hello"}]);
    let mut before = (0, 0);
    let mut charged = async |what: &str| {
        let now = (
            used(&server, "llm-input").await,
            used(&server, "llm-output").await,
        );
        let charged = (now.0 - before.0, now.1 - before.1);
        println!("{what}: input {} output {}", charged.0, charged.1);
        before = now;
        charged
    };

    // A Responses API answer, whole: its `usage`, never 0.
    let budget_one = budget();
    let body = serde_json::json!({"model": "m", "max_output_tokens": 100, "input": hello});
    let mut answer = budget_one
        .send(&client, call("/v1/responses", body, 40, None), None)
        .await
        .expect("sent");
    while answer.chunk().await.expect("chunk").is_some() {}
    assert_eq!(charged("responses, JSON").await, (5, 40));

    // An Anthropic stream cancelled after its first event: the input it reported and the text
    // streamed, neither refunded whole nor kept whole.
    let body =
        serde_json::json!({"model": "m", "max_tokens": 100, "stream": true, "messages": hello});
    let mut answer = budget_one
        .send(&client, call("/v1/messages", body.clone(), 100, None), None)
        .await
        .expect("sent");
    answer.chunk().await.expect("chunk");
    answer.chunk().await.expect("chunk");
    answer.cancel().await;
    let (input, output) = charged("messages, cancelled").await;
    assert_eq!(input, 5);
    // The model wrote at least the four tokens of the one text event read.
    assert!((4..100).contains(&output), "{output}");

    // A stream the model fails after 30 tokens: what it streamed (a byte a token, so at least
    // the 30 the model counted).
    let mut answer = budget_one
        .send(
            &client,
            call("/v1/messages", body, 100, Some(("x-mock-fail-after", "30"))),
            None,
        )
        .await
        .expect("sent");
    while answer.chunk().await.expect("chunk").is_some() {}
    let (input, output) = charged("messages, failed").await;
    assert_eq!(input, 5);
    assert!((30..=100).contains(&output), "{output}");

    // A chat stream without `max_tokens` that writes 500 past an estimate of 200: topped up
    // as it runs, settled at the model's 500.
    let body = serde_json::json!({"model": "m", "stream": true, "messages": hello});
    let mut answer = budget_one
        .send(&client, call("/v1/chat/completions", body, 500, None), None)
        .await
        .expect("sent");
    while answer.chunk().await.expect("chunk").is_some() {}
    assert_eq!(charged("chat, uncapped").await, (5, 500));
    assert!(
        budget_one.stats().topped_up >= 300,
        "{:?}",
        budget_one.stats()
    );
    assert_eq!(
        budget_one.stats().charged,
        0,
        "room for every top-up: nothing charged past a grant"
    );

    // A vendor with one TPM for input and output: one limit named as both, both counted on it.
    let shared = TokenBudget::new(
        &server,
        Some(DATA_TOKEN.to_owned()),
        BudgetLimits {
            requests: "llm-requests".into(),
            input: "llm-input".into(),
            output: "llm-input".into(),
            overrun: None,
        },
        EstimateConfig::default(),
        Duration::from_secs(10),
    )
    .expect("budget");
    let body = serde_json::json!({"model": "m", "max_output_tokens": 100, "input": hello});
    let mut answer = shared
        .send(&client, call("/v1/responses", body, 40, None), None)
        .await
        .expect("one limit named as input and output is asked once");
    while answer.chunk().await.expect("chunk").is_some() {}
    assert_eq!(charged("one TPM").await, (45, 0));
    assert_eq!(shared.stats().settle_errors, 0, "{:?}", shared.stats());
}
