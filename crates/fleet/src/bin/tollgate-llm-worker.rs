//! One process of a fleet calling a model server through a Tollgate server's token budget:
//! CALLERS tasks, each calling again as soon as its call ends, with random APIs (chat
//! completions, responses, messages), streaming or not, random lengths, and some calls that
//! the model fails, cuts off, or the caller cancels. For `tests/llm.rs`.
//!
//! Arguments: SERVER_URL TOKEN MODEL_URL CALLERS SECONDS MODE SEED. MODE: `bounded` (every
//! request sets `max_tokens`), `unbounded` (none does, and the model may write past the
//! configured estimate), `at-end` (the flawed way: a request is let go on the request count
//! alone, and its tokens are charged once its answer has ended). Prints `ready`, waits for a
//! line on stdin, runs, and prints `stats <sent> <vendor_limited> <errors> <topped_up>
//! <top_ups_refused> <charged> <settle_errors>`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tollgate_dispatch::llm::{
    Api, BudgetLimits, EstimateConfig, TokenBudget, UsageReader, estimate,
};

/// Longest answer a bounded request asks for, and its `max_tokens`.
const BOUNDED_MAX: u64 = 300;
/// The output estimate of an unbounded request (the configured model maximum), and the most
/// the model writes for one: each stream can outrun its estimate by the difference.
pub const UNBOUNDED_ESTIMATE: u64 = 200;
const UNBOUNDED_MOST: u64 = 600;

fn fail(what: &str, error: impl std::fmt::Display) -> ! {
    eprintln!("{what}: {error}");
    std::process::exit(1);
}

fn argument<T: std::str::FromStr>(args: &[String], index: usize, name: &str) -> T {
    match args.get(index).map(|text| text.parse()) {
        Some(Ok(value)) => value,
        _ => fail(
            "usage: tollgate-llm-worker SERVER_URL TOKEN MODEL_URL CALLERS SECONDS MODE SEED",
            format!("bad or missing {name}"),
        ),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|error| fail("runtime", error));
    runtime.block_on(run());
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    limited: AtomicU64,
    errors: AtomicU64,
}

/// One random call: its path, body and the model's test headers.
fn random_call(
    rng: &mut fastrand::Rng,
    bounded: bool,
) -> (String, Value, Vec<(String, String)>, Option<u64>) {
    let (path, api) = match rng.u8(0..3) {
        0 => ("/v1/chat/completions", Api::OpenAiChat),
        1 => ("/v1/responses", Api::OpenAiResponses),
        _ => ("/v1/messages", Api::AnthropicMessages),
    };
    let text: String = "word ".repeat(rng.usize(4..80));
    let stream = rng.u8(0..10) < 7;
    let mut body = match api {
        Api::AnthropicMessages => {
            json!({"model": "mock-1", "messages": [{"role": "user", "content": text}]})
        }
        Api::OpenAiResponses => {
            json!({"model": "mock-1", "input": [{"role": "user", "content": text}]})
        }
        Api::OpenAiChat => {
            json!({"model": "mock-1", "messages": [{"role": "user", "content": text}]})
        }
    };
    let most = if bounded { BOUNDED_MAX } else { UNBOUNDED_MOST };
    if bounded {
        let field = match api {
            Api::OpenAiResponses => "max_output_tokens",
            _ => "max_tokens",
        };
        body[field] = json!(BOUNDED_MAX);
    }
    if stream {
        body["stream"] = json!(true);
    }
    let tokens = rng.u64(10..=most);
    let mut headers = vec![("x-mock-tokens".to_owned(), tokens.to_string())];
    let mut cancel_after = None;
    match rng.u8(0..20) {
        0 => headers.push(("x-mock-fail-after".into(), rng.u64(0..tokens).to_string())),
        1 => headers.push(("x-mock-cut-after".into(), rng.u64(0..tokens).to_string())),
        2 if stream => cancel_after = Some(rng.u64(1..8)),
        _ => {}
    }
    (path.to_owned(), body, headers, cancel_after)
}

async fn run() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let server: String = argument(&args, 0, "SERVER_URL");
    let token: String = argument(&args, 1, "TOKEN");
    let model: String = argument(&args, 2, "MODEL_URL");
    let callers: u32 = argument(&args, 3, "CALLERS");
    let seconds: f64 = argument(&args, 4, "SECONDS");
    let mode: String = argument(&args, 5, "MODE");
    let seed: u64 = argument(&args, 6, "SEED");
    if !["bounded", "unbounded", "at-end"].contains(&mode.as_str()) {
        fail("MODE", "bounded, unbounded or at-end");
    }
    let config = EstimateConfig {
        output_default: UNBOUNDED_ESTIMATE,
        ..EstimateConfig::default()
    };
    let budget = TokenBudget::new(
        &server,
        Some(token.clone()),
        BudgetLimits {
            requests: "llm-requests".into(),
            input: "llm-input".into(),
            output: "llm-output".into(),
            overrun: Some("llm-overrun".into()),
        },
        config.clone(),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|error| fail("budget", error));
    let client = reqwest::Client::new();
    println!("ready");
    let mut line = String::new();
    if let Err(error) = std::io::stdin().read_line(&mut line) {
        fail("stdin", error);
    }
    let tally = Arc::new(Tally::default());
    let until = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let (budget, client, model, tally, mode, server, token, config) = (
            budget.clone(),
            client.clone(),
            model.clone(),
            tally.clone(),
            mode.clone(),
            server.clone(),
            token.clone(),
            config.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed * 1000 + u64::from(caller));
            while tokio::time::Instant::now() < until {
                let (path, body, headers, cancel_after) = random_call(&mut rng, mode == "bounded");
                let mut request = client.post(format!("{model}{path}")).json(&body);
                for (name, value) in &headers {
                    request = request.header(name, value);
                }
                let Ok(request) = request.build() else {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if mode == "at-end" {
                    at_end(
                        &client,
                        &server,
                        &token,
                        &config,
                        request,
                        cancel_after,
                        &tally,
                    )
                    .await;
                    continue;
                }
                let mut metered = match budget.send(&client, request, None).await {
                    Ok(metered) => metered,
                    Err(error) => {
                        eprintln!("send: {error}");
                        tally.errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                tally.sent.fetch_add(1, Ordering::Relaxed);
                if metered.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
                    tally.limited.fetch_add(1, Ordering::Relaxed);
                }
                let mut chunks = 0;
                loop {
                    if cancel_after.is_some_and(|after| chunks >= after) {
                        metered.cancel().await;
                        break;
                    }
                    match metered.chunk().await {
                        Ok(Some(_)) => chunks += 1,
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let stats = budget.stats();
    println!(
        "stats {} {} {} {} {} {} {}",
        tally.sent.load(Ordering::Relaxed),
        tally.limited.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        stats.topped_up,
        stats.top_ups_refused,
        stats.charged,
        stats.settle_errors
    );
    std::process::exit(0);
}

async fn acquire(
    client: &reqwest::Client,
    server: &str,
    token: &str,
    limit: &str,
    cost: u64,
    wait_ms: u64,
) -> bool {
    let body =
        json!({"limits": [limit], "cost": cost.max(1), "wait_ms": wait_ms, "refundable": false});
    client
        .post(format!("{server}/v1/acquire"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .is_ok_and(|answer| answer.status().is_success())
}

/// The flawed way, as gateways that charge a stream once it has ended do it: the request is
/// let go while the token limit has room, and its tokens are counted after its answer.
async fn at_end(
    client: &reqwest::Client,
    server: &str,
    token: &str,
    config: &EstimateConfig,
    request: reqwest::Request,
    cancel_after: Option<u64>,
    tally: &Tally,
) {
    let Some(api) = Api::recognise(request.url().path()) else {
        return;
    };
    let Some(found) = request
        .body()
        .and_then(reqwest::Body::as_bytes)
        .and_then(|body| estimate(api, body, None, config).ok())
    else {
        return;
    };
    if !acquire(client, server, token, "llm-requests", 1, 60_000).await {
        tally.errors.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // "Has the limit room?": one unit, given back at once.
    while !acquire(client, server, token, "llm-output", 1, 60_000).await {}
    tally.sent.fetch_add(1, Ordering::Relaxed);
    let Ok(mut response) = client.execute(request).await else {
        tally.errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
        tally.limited.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let events = response
        .headers()
        .get("content-type")
        .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
    let mut reader = UsageReader::new(api, events);
    let mut chunks = 0;
    while let Ok(Some(chunk)) = response.chunk().await {
        reader.feed(&chunk);
        chunks += 1;
        if cancel_after.is_some_and(|after| chunks >= after) {
            break;
        }
    }
    reader.end();
    let usage = reader.usage();
    let output = usage.output.unwrap_or(usage.streamed.min(found.output));
    let input = usage.input.unwrap_or(found.input);
    // Counted after the answer, past the limits if need be: the gateways' own accounting.
    let body = json!({
        "limits": ["llm-input", "llm-output"],
        "costs": {"llm-input": input.max(1), "llm-output": output.max(1)},
    });
    let charged = client
        .post(format!("{server}/v1/charge"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await;
    if !charged.is_ok_and(|answer| answer.status().is_success()) {
        tally.errors.fetch_add(1, Ordering::Relaxed);
    }
}
