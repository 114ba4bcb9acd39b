//! The judging mock model server: OpenAI-style (`/v1/chat/completions`, `/v1/responses`) and
//! Anthropic-style (`/v1/messages`) calls, JSON or streamed, that enforces its own requests,
//! input tokens and output tokens per period on its own clock and answers 429 past them, and
//! reports how the tokens it counted measure against its limits. It never takes a caller's
//! word: it counts input with its own tokeniser and output as it writes it.
//!
//! Its rules: a call is dated by its arrival, and every token of it (input, and output as it is
//! written, however a stream ends) counts in the windows that hold that arrival; a whole (not
//! streamed) answer that fails is a 500 and charges no tokens, as the vendors do. A call is
//! refused with 429 when, in the period before its arrival, the calls number `rpm`, the input
//! with its own would pass `itpm`, or the output has reached `otpm`. Its tokeniser: a token per
//! four bytes of message text, rounded up, and three per message.
//!
//! What a call asks for is set by test headers: `x-mock-tokens` (the answer's length, cut to
//! the request's `max_tokens`; default 50), `x-mock-fail-after` (after that many tokens, an
//! error event and the end of the stream) and `x-mock-cut-after` (after that many tokens, the
//! connection dropped). [`run_cli`] is `tollgate-mock-model`'s main.

use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub rpm: u64,
    pub itpm: u64,
    pub otpm: u64,
    pub period: Duration,
    /// Time to write one token.
    pub token_time: Duration,
    /// Tokens per streamed event.
    pub chunk_tokens: u64,
}

pub const USAGE: &str = "usage: tollgate-mock-model [--listen 127.0.0.1:0] [--rpm 600] \
     [--itpm 100000] [--otpm 20000] [--period-ms 60000] [--token-us 200] [--chunk-tokens 4]";

/// The command line. Errors name the flag.
pub fn parse_args(args: &[String]) -> Result<(String, ModelConfig), String> {
    let mut listen = "127.0.0.1:0".to_owned();
    let mut config = ModelConfig {
        rpm: 600,
        itpm: 100_000,
        otpm: 20_000,
        period: Duration::from_secs(60),
        token_time: Duration::from_micros(200),
        chunk_tokens: 4,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("{flag}: a value is required\n{USAGE}"))?;
        let number = || {
            value
                .parse::<u64>()
                .ok()
                .filter(|number| *number >= 1)
                .ok_or_else(|| {
                    format!("{flag}: must be a whole number of at least 1, not {value:?}")
                })
        };
        match flag.as_str() {
            "--listen" => listen = value.clone(),
            "--rpm" => config.rpm = number()?,
            "--itpm" => config.itpm = number()?,
            "--otpm" => config.otpm = number()?,
            "--period-ms" => config.period = Duration::from_millis(number()?),
            "--token-us" => config.token_time = Duration::from_micros(number()?),
            "--chunk-tokens" => config.chunk_tokens = number()?,
            _ => return Err(format!("{flag}: unknown flag\n{USAGE}")),
        }
    }
    Ok((listen, config))
}

#[derive(Clone, Copy, Debug, Default)]
struct Call {
    at: Duration,
    input: u64,
    output: u64,
}

#[derive(Debug)]
struct Model {
    config: ModelConfig,
    started: Instant,
    calls: Vec<Call>,
    limited: u64,
    failed: u64,
    cut: u64,
    cancelled: u64,
}

type Shared = Arc<Mutex<Model>>;

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, Model> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The model's own tokeniser over one message's content.
fn text_tokens(content: &Value) -> u64 {
    let bytes: usize = match content {
        Value::String(text) => text.len(),
        Value::Array(parts) => parts
            .iter()
            .map(|part| part.get("text").and_then(Value::as_str).map_or(0, str::len))
            .sum(),
        _ => 0,
    };
    (bytes as u64).div_ceil(4)
}

fn input_tokens(body: &Value) -> u64 {
    let mut tokens = 0;
    for field in ["messages", "input"] {
        match body.get(field) {
            Some(Value::Array(messages)) => {
                for message in messages {
                    tokens += 3 + text_tokens(message.get("content").unwrap_or(&Value::Null));
                }
            }
            Some(text @ Value::String(_)) => tokens += 3 + text_tokens(text),
            _ => {}
        }
    }
    for field in ["system", "instructions"] {
        if let Some(system) = body.get(field) {
            tokens += 3 + text_tokens(system);
        }
    }
    tokens
}

impl Model {
    /// Totals of the calls dated in the period before `at`: (calls, input, output).
    fn window(&self, at: Duration) -> (u64, u64, u64) {
        let from = at.saturating_sub(self.config.period);
        self.calls
            .iter()
            .rev()
            .take_while(|call| call.at > from || (from.is_zero() && call.at.is_zero()))
            .fold((0, 0, 0), |(n, i, o), call| {
                (n + 1, i + call.input, o + call.output)
            })
    }

    fn report(&self) -> Value {
        let period = self.config.period;
        let (mut most, mut over) = ([0_u64; 3], [0_u64; 3]);
        let limits = [self.config.rpm, self.config.itpm, self.config.otpm];
        let mut start = 0;
        let mut sums = [0_u64; 3];
        for (end, call) in self.calls.iter().enumerate() {
            sums[0] += 1;
            sums[1] += call.input;
            sums[2] += call.output;
            while self.calls[start].at + period <= call.at {
                let old = self.calls[start];
                sums[0] -= 1;
                sums[1] -= old.input;
                sums[2] -= old.output;
                start += 1;
            }
            let _ = end;
            for kind in 0..3 {
                most[kind] = most[kind].max(sums[kind]);
                if sums[kind] > limits[kind] {
                    over[kind] += 1;
                }
            }
        }
        let output: u64 = self.calls.iter().map(|call| call.output).sum();
        let input: u64 = self.calls.iter().map(|call| call.input).sum();
        // As the judging vendor measures it: the integral of otpm / period between the first
        // and the last arrival; and again from one period after the first, past the opening
        // burst a sliding window allows.
        let (first, last) = match (self.calls.first(), self.calls.last()) {
            (Some(first), Some(last)) => (first.at, last.at),
            _ => (Duration::ZERO, Duration::ZERO),
        };
        let share = |from: Duration| {
            let span = last.saturating_sub(from).as_secs_f64() / period.as_secs_f64();
            let tokens: u64 = self
                .calls
                .iter()
                .filter(|call| call.at >= from)
                .map(|call| call.output)
                .sum();
            (span > 0.0).then(|| tokens as f64 / (self.config.otpm as f64 * span))
        };
        json!({
            "calls": self.calls.len() as u64 + self.limited,
            "ok": self.calls.len(),
            "limited": self.limited,
            "failed": self.failed,
            "cut": self.cut,
            "cancelled": self.cancelled,
            "input_tokens": input,
            "output_tokens": output,
            "most_requests_in_any_window": most[0],
            "most_input_in_any_window": most[1],
            "most_output_in_any_window": most[2],
            "output_excess": most[2].saturating_sub(self.config.otpm),
            "input_excess": most[1].saturating_sub(self.config.itpm),
            "arrivals_over": {"requests": over[0], "input": over[1], "output": over[2]},
            "output_used_share": share(first),
            "output_used_share_steady": share(first + period),
            "limits": {"rpm": self.config.rpm, "itpm": self.config.itpm, "otpm": self.config.otpm,
                "period_ms": period.as_millis() as u64},
        })
    }
}

/// A streamed body fed by a channel: a send that fails means the caller has gone.
struct Channel(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl http_body::Body for Channel {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(context)
            .map(|item| item.map(|item| item.map(http_body::Frame::data)))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Chat,
    Responses,
    Messages,
}

fn header_number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
}

fn event(style: Style, kind: &str, data: Value) -> Bytes {
    match style {
        Style::Chat => Bytes::from(format!("data: {data}\n\n")),
        _ => Bytes::from(format!("event: {kind}\ndata: {data}\n\n")),
    }
}

fn usage(style: Style, input: u64, output: u64) -> Value {
    match style {
        Style::Chat => json!({"prompt_tokens": input, "completion_tokens": output,
            "total_tokens": input + output}),
        _ => json!({"input_tokens": input, "output_tokens": output}),
    }
}

fn delta(style: Style, text: &str) -> Bytes {
    match style {
        Style::Chat => event(
            style,
            "",
            json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}),
        ),
        Style::Responses => event(
            style,
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "delta": text}),
        ),
        Style::Messages => event(
            style,
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        ),
    }
}

async fn call(State(state): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path();
    let style = if path.ends_with("/chat/completions") {
        Style::Chat
    } else if path.ends_with("/responses") {
        Style::Responses
    } else if path.ends_with("/messages") {
        Style::Messages
    } else {
        return (StatusCode::NOT_FOUND, "no such model endpoint").into_response();
    };
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "body: not JSON").into_response();
    };
    let cap = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|field| request.get(*field).and_then(Value::as_u64));
    let wanted = header_number(&headers, "x-mock-tokens").unwrap_or(50);
    let output = cap.map_or(wanted, |cap| wanted.min(cap));
    let fail_after = header_number(&headers, "x-mock-fail-after");
    let cut_after = header_number(&headers, "x-mock-cut-after");
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    let include_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    let input = input_tokens(&request);
    let (index, config) = {
        let mut model = lock(&state);
        let at = model.started.elapsed();
        let (calls, input_in, output_in) = model.window(at);
        let config = model.config.clone();
        if calls >= config.rpm || input_in + input > config.itpm || output_in >= config.otpm {
            model.limited += 1;
            let mut response = (
                StatusCode::TOO_MANY_REQUESTS,
                axum::Json(
                    json!({"error": {"type": "rate_limit_error", "message": "rate limited"}}),
                ),
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1));
            return response;
        }
        model.calls.push(Call {
            at,
            input,
            output: 0,
        });
        (model.calls.len() - 1, config)
    };
    // Output counts as it is written, so a stream that stops is charged what it wrote.
    let add = {
        let state = state.clone();
        move |tokens: u64| lock(&state).calls[index].output += tokens
    };
    if !stream {
        let stops = fail_after.or(cut_after).map_or(output, |at| at.min(output));
        tokio::time::sleep(config.token_time * u32::try_from(stops).unwrap_or(u32::MAX)).await;
        // A whole answer that fails is a 500, and charges no tokens, as the vendors do.
        if stops == output {
            add(stops);
        }
        if stops < output {
            lock(&state).failed += 1;
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"error": {"type": "api_error", "message": "failed on demand"}})),
            )
                .into_response();
        }
        let text = "tok ".repeat(usize::try_from(output).unwrap_or(0));
        let answer = match style {
            Style::Chat => json!({"object": "chat.completion", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": usage(style, input, output)}),
            Style::Responses => json!({"object": "response", "status": "completed",
                "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
                "usage": usage(style, input, output)}),
            Style::Messages => json!({"type": "message", "role": "assistant",
                "content": [{"type": "text", "text": text}], "usage": usage(style, input, output)}),
        };
        return axum::Json(answer).into_response();
    }
    let (sender, receiver) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        let send = |bytes: Bytes| sender.send(Ok(bytes));
        let opening = match style {
            Style::Messages => Some(event(
                style,
                "message_start",
                json!({"type": "message_start", "message": {"type": "message", "role": "assistant",
                    "content": [], "usage": {"input_tokens": input, "output_tokens": 1}}}),
            )),
            Style::Responses => Some(event(
                style,
                "response.created",
                json!({"type": "response.created", "response": {"status": "in_progress"}}),
            )),
            Style::Chat => None,
        };
        if let Some(opening) = opening
            && send(opening).await.is_err()
        {
            lock(&state).cancelled += 1;
            return;
        }
        let mut written = 0;
        while written < output {
            if fail_after.is_some_and(|at| written >= at) {
                let error = match style {
                    Style::Chat => {
                        json!({"error": {"message": "failed on demand", "type": "server_error"}})
                    }
                    Style::Responses => {
                        json!({"type": "response.failed", "response": {"status": "failed",
                        "usage": usage(style, input, written)}})
                    }
                    Style::Messages => {
                        json!({"type": "error", "error": {"type": "overloaded_error",
                        "message": "failed on demand"}})
                    }
                };
                let kind = if style == Style::Responses {
                    "response.failed"
                } else {
                    "error"
                };
                let _ = send(event(style, kind, error)).await;
                lock(&state).failed += 1;
                return;
            }
            if cut_after.is_some_and(|at| written >= at) {
                let _ = sender
                    .send(Err(std::io::Error::other("cut on demand")))
                    .await;
                lock(&state).cut += 1;
                return;
            }
            let tokens = config.chunk_tokens.min(output - written);
            tokio::time::sleep(config.token_time * u32::try_from(tokens).unwrap_or(1)).await;
            // Counted before it is written: a caller gone meanwhile was still charged.
            add(tokens);
            written += tokens;
            let text = "tok ".repeat(usize::try_from(tokens).unwrap_or(0));
            if send(delta(style, &text)).await.is_err() {
                lock(&state).cancelled += 1;
                return;
            }
        }
        let closing: Vec<Bytes> = match style {
            Style::Chat => {
                let mut closing = vec![event(
                    style,
                    "",
                    json!({"object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                )];
                if include_usage {
                    closing.push(event(
                        style,
                        "",
                        json!({"object": "chat.completion.chunk",
                        "choices": [], "usage": usage(style, input, output)}),
                    ));
                }
                closing.push(Bytes::from_static(b"data: [DONE]\n\n"));
                closing
            }
            Style::Responses => vec![event(
                style,
                "response.completed",
                json!({
                "type": "response.completed", "response": {"status": "completed",
                "usage": usage(style, input, output)}}),
            )],
            Style::Messages => vec![
                event(
                    style,
                    "message_delta",
                    json!({"type": "message_delta",
                    "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output}}),
                ),
                event(style, "message_stop", json!({"type": "message_stop"})),
            ],
        };
        for bytes in closing {
            if send(bytes).await.is_err() {
                return;
            }
        }
    });
    let mut response = Body::new(Channel(receiver)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response
}

async fn report(State(state): State<Shared>) -> Response {
    axum::Json(lock(&state).report()).into_response()
}

async fn reset(State(state): State<Shared>) -> Response {
    let mut model = lock(&state);
    model.calls.clear();
    (model.limited, model.failed, model.cut, model.cancelled) = (0, 0, 0, 0);
    model.started = Instant::now();
    StatusCode::NO_CONTENT.into_response()
}

/// Serves the model on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, config: ModelConfig) -> std::io::Result<()> {
    let state: Shared = Arc::new(Mutex::new(Model {
        config,
        started: Instant::now(),
        calls: Vec::new(),
        limited: 0,
        failed: 0,
        cut: 0,
        cancelled: 0,
    }));
    let router = axum::Router::new()
        .route("/_model/report", axum::routing::get(report))
        .route("/_model/reset", axum::routing::post(reset))
        .fallback(call)
        .with_state(state);
    axum::serve(listener, router).await
}

/// `tollgate-mock-model`'s main: parse the flags, bind, print `listening on http://ADDR` as the
/// first stdout line, serve. Returns the exit code.
pub fn run_cli() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (listen, config) = match parse_args(&args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("runtime: {error}");
            return 1;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(&listen).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("--listen: cannot bind {listen}: {error}");
                return 1;
            }
        };
        let Ok(address) = listener.local_addr() else {
            return 1;
        };
        let mut stdout = std::io::stdout();
        if writeln!(stdout, "listening on http://{address}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return 1;
        }
        match serve(listener, config).await {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("serve: {error}");
                1
            }
        }
    })
}
