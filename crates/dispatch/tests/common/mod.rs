//! What the dispatcher's tests share, the fleet of dispatchers in `crates/fleet` included: a
//! mock vendor on a real socket that counts every call itself, enforces N calls per fixed
//! window, and answers 429 with a `Retry-After` that doubles (up to a cap) for every request
//! arriving during a cessation, as Google Ads does; and the judging mock vendor (`judge`).

#![allow(dead_code)]

pub mod judge;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

#[derive(Clone, Copy, Debug)]
pub struct VendorRules {
    /// Calls allowed per fixed window (aligned to the vendor's start).
    pub limit: u64,
    pub period: Duration,
    /// The first `Retry-After` of a cessation, in seconds, and the most it escalates to.
    pub retry_after_s: u64,
    pub retry_after_s_max: u64,
}

#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub calls: u64,
    pub ok: u64,
    pub limited: u64,
    /// Requests that arrived during a cessation (each one escalated the wait).
    pub escalations: u64,
    /// Per process (the `x-process` header): requests that arrived before the end of the wait
    /// the vendor had told that same process.
    pub disobeyed: HashMap<String, u64>,
    /// The most calls counted in any one window.
    pub most_in_a_window: u64,
    /// Arrival of each successful call, from the vendor's start.
    pub ok_at: Vec<Duration>,
}

struct Inner {
    rules: VendorRules,
    started: Instant,
    window: u64,
    in_window: u64,
    cessation_until: Option<Instant>,
    retry_after_s: u64,
    told_until: HashMap<String, Instant>,
    tally: Tally,
}

#[derive(Clone)]
pub struct Vendor {
    inner: Arc<Mutex<Inner>>,
    pub address: SocketAddr,
}

impl Vendor {
    pub fn url(&self) -> String {
        format!("http://{}/call", self.address)
    }

    pub fn tally(&self) -> Tally {
        self.inner.lock().expect("vendor state").tally.clone()
    }

    /// Start on 127.0.0.1:0 on the current runtime.
    pub async fn start(rules: VendorRules) -> Vendor {
        let inner = Arc::new(Mutex::new(Inner {
            rules,
            started: Instant::now(),
            window: 0,
            in_window: 0,
            cessation_until: None,
            retry_after_s: rules.retry_after_s,
            told_until: HashMap::new(),
            tally: Tally::default(),
        }));
        let router = axum::Router::new()
            .route("/call", axum::routing::get(call).post(call))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the vendor");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Vendor { inner, address }
    }
}

fn limited(retry_after_s: u64) -> Response {
    let mut response = StatusCode::TOO_MANY_REQUESTS.into_response();
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_str(&retry_after_s.to_string()).expect("digits"),
    );
    response
}

async fn call(State(inner): State<Arc<Mutex<Inner>>>, headers: HeaderMap) -> Response {
    let process = headers
        .get("x-process")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let now = Instant::now();
    let mut state = inner.lock().expect("vendor state");
    let state = &mut *state;
    state.tally.calls += 1;
    if state
        .told_until
        .get(&process)
        .is_some_and(|until| now < *until)
    {
        *state.tally.disobeyed.entry(process.clone()).or_default() += 1;
    }
    if let Some(until) = state.cessation_until {
        if now < until {
            state.tally.escalations += 1;
            state.tally.limited += 1;
            state.retry_after_s = (state.retry_after_s * 2).min(state.rules.retry_after_s_max);
            let wait = Duration::from_secs(state.retry_after_s);
            state.cessation_until = Some(now + wait);
            state.told_until.insert(process, now + wait);
            return limited(state.retry_after_s);
        }
        state.cessation_until = None;
        state.retry_after_s = state.rules.retry_after_s;
    }
    let since = now - state.started;
    let window = (since.as_nanos() / state.rules.period.as_nanos()) as u64;
    if window != state.window {
        state.window = window;
        state.in_window = 0;
    }
    if state.in_window >= state.rules.limit {
        state.tally.limited += 1;
        let wait = Duration::from_secs(state.retry_after_s);
        state.cessation_until = Some(now + wait);
        state.told_until.insert(process, now + wait);
        return limited(state.retry_after_s);
    }
    state.in_window += 1;
    state.tally.most_in_a_window = state.tally.most_in_a_window.max(state.in_window);
    state.tally.ok += 1;
    state.tally.ok_at.push(since);
    StatusCode::OK.into_response()
}
