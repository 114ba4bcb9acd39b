//! The judging mock vendor: N calls per period (a sliding or fixed window) counted on arrival
//! on its own monotonic clock, 429 with `Retry-After` past that, the rate-limit headers of one
//! family on every answer, and a report judging the arrivals exactly (did they ever crowd more
//! than the limit into one window, how much of the capacity was used).
//!
//! [`Judge`] is the judging alone, driven with explicit times so tests can place arrivals
//! exactly; [`serve`] puts it on a socket; [`run_cli`] is `tollgate-mock-vendor`'s whole main
//! (`crates/fleet/src/bin/tollgate-mock-vendor.rs` includes this file by path). Callers' clocks
//! are never trusted: every time is the vendor's `Instant` since its start.

use std::collections::VecDeque;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tollgate_dispatch::Family;

/// How the vendor counts its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// The last period before each arrival.
    Sliding,
    /// Periods aligned to the vendor's start.
    Fixed,
}

#[derive(Clone, Debug)]
pub struct JudgeConfig {
    pub limit: u64,
    pub period: Duration,
    pub window: Window,
    /// The family of rate-limit headers on every answer; `None`: no such headers.
    pub headers: Option<Family>,
    /// A fixed `Retry-After` on 429s instead of the time until a unit comes back.
    pub retry_after_s: Option<u64>,
}

impl JudgeConfig {
    pub fn new(limit: u64, period: Duration, window: Window) -> JudgeConfig {
        JudgeConfig {
            limit,
            period,
            window,
            headers: None,
            retry_after_s: None,
        }
    }
}

pub const USAGE: &str = "usage: tollgate-mock-vendor [--listen 127.0.0.1:0] [--limit 10] \
     [--period-ms 1000] [--window sliding|fixed] \
     [--headers none|ietf|openai|anthropic|github|ietf-draft] [--retry-after-s N]";

/// The command line: the address to listen on and the vendor's rules. Errors name the flag.
pub fn parse_args(args: &[String]) -> Result<(String, JudgeConfig), String> {
    let mut listen = "127.0.0.1:0".to_owned();
    let mut config = JudgeConfig::new(10, Duration::from_secs(1), Window::Sliding);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_owned())),
            None => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next().cloned())
                .ok_or_else(|| format!("{flag}: a value is required"))
        };
        let number = |flag: &str, text: String| -> Result<u64, String> {
            text.parse::<u64>()
                .map_err(|_| format!("{flag}: {text:?} is not a whole number"))
        };
        match flag {
            "--listen" => listen = value()?,
            "--limit" => {
                config.limit = number(flag, value()?)?;
                if config.limit == 0 {
                    return Err("--limit: must be at least 1".to_owned());
                }
            }
            "--period-ms" => {
                let ms = number(flag, value()?)?;
                if ms == 0 {
                    return Err("--period-ms: must be at least 1".to_owned());
                }
                config.period = Duration::from_millis(ms);
            }
            "--window" => {
                config.window = match value()?.as_str() {
                    "sliding" => Window::Sliding,
                    "fixed" => Window::Fixed,
                    other => return Err(format!("--window: {other:?} is not sliding or fixed")),
                }
            }
            "--headers" => {
                let name = value()?;
                config.headers = match name.as_str() {
                    "none" => None,
                    _ => Some(
                        Family::from_name(&name)
                            .ok_or_else(|| format!("--headers: {name:?} is not a known family"))?,
                    ),
                }
            }
            "--retry-after-s" => config.retry_after_s = Some(number(flag, value()?)?),
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("{other}: unknown flag\n{USAGE}")),
        }
    }
    Ok((listen, config))
}

/// What the vendor answered one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answered {
    pub admitted: bool,
    /// The limit in force at the call.
    pub limit: u64,
    /// Calls left in the window after this one.
    pub remaining: u64,
    /// Until the next unit comes back (sliding) or the window ends (fixed).
    pub reset: Duration,
    /// On a 429: the `Retry-After` sent, in seconds.
    pub retry_after_s: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Arrival {
    at: Duration,
    admitted: bool,
    limit: u64,
}

/// The judging: what is admitted, and the record the report is computed from.
#[derive(Debug)]
pub struct Judge {
    config: JudgeConfig,
    limit: u64,
    arrivals: Vec<Arrival>,
    /// Admitted arrivals in the last period (sliding).
    admitted: VecDeque<Duration>,
    /// The current aligned window and the calls admitted in it (fixed).
    fixed_window: u64,
    in_fixed_window: u64,
    limit_changes: Vec<(Duration, u64)>,
}

fn window_index(at: Duration, period: Duration) -> u64 {
    u64::try_from(at.as_nanos() / period.as_nanos()).unwrap_or(u64::MAX)
}

fn ms(duration: Duration) -> f64 {
    // Microsecond precision is plenty for a report read by people and tests.
    (duration.as_micros() as f64) / 1000.0
}

impl Judge {
    pub fn new(config: JudgeConfig) -> Judge {
        Judge {
            limit: config.limit,
            config,
            arrivals: Vec::new(),
            admitted: VecDeque::new(),
            fixed_window: 0,
            in_fixed_window: 0,
            limit_changes: Vec::new(),
        }
    }

    pub fn config(&self) -> &JudgeConfig {
        &self.config
    }

    /// One call arriving `at` (since the vendor's start; never earlier than the last).
    pub fn arrive(&mut self, at: Duration) -> Answered {
        let period = self.config.period;
        let (count, reset_if_full, reset_if_not) = match self.config.window {
            Window::Sliding => {
                while self
                    .admitted
                    .front()
                    .is_some_and(|first| at.saturating_sub(*first) >= period)
                {
                    self.admitted.pop_front();
                }
                let count = u64::try_from(self.admitted.len()).unwrap_or(u64::MAX);
                // When full, a unit comes back as the (count - limit + 1)-th oldest expires.
                let back_at = |index: u64| {
                    usize::try_from(index)
                        .ok()
                        .and_then(|index| self.admitted.get(index))
                        .map_or(Duration::ZERO, |first| (*first + period).saturating_sub(at))
                };
                (count, back_at(count.saturating_sub(self.limit)), back_at(0))
            }
            Window::Fixed => {
                let window = window_index(at, period);
                if window != self.fixed_window {
                    self.fixed_window = window;
                    self.in_fixed_window = 0;
                }
                let end = u32::try_from(window + 1)
                    .ok()
                    .and_then(|windows| period.checked_mul(windows))
                    .unwrap_or(Duration::MAX);
                let left = end.saturating_sub(at);
                (self.in_fixed_window, left, left)
            }
        };
        let admitted = count < self.limit;
        self.arrivals.push(Arrival {
            at,
            admitted,
            limit: self.limit,
        });
        if !admitted {
            let retry_after_s = self
                .config
                .retry_after_s
                .unwrap_or_else(|| reset_if_full.as_nanos().div_ceil(1_000_000_000) as u64);
            return Answered {
                admitted,
                limit: self.limit,
                remaining: 0,
                reset: reset_if_full,
                retry_after_s: Some(retry_after_s),
            };
        }
        match self.config.window {
            Window::Sliding => self.admitted.push_back(at),
            Window::Fixed => self.in_fixed_window += 1,
        }
        let remaining = self.limit - count - 1;
        let reset = match self.config.window {
            Window::Sliding if remaining == 0 => {
                // Full now: the unit that comes back first is the oldest beyond the limit.
                let index = usize::try_from((count + 1).saturating_sub(self.limit)).unwrap_or(0);
                self.admitted
                    .get(index)
                    .map_or(period, |first| (*first + period).saturating_sub(at))
            }
            Window::Sliding if count == 0 => period,
            _ => reset_if_not,
        };
        Answered {
            admitted,
            limit: self.limit,
            remaining,
            reset,
            retry_after_s: None,
        }
    }

    /// The true limit changes `at`.
    pub fn set_limit(&mut self, at: Duration, limit: u64) {
        self.limit = limit;
        self.limit_changes.push((at, limit));
    }

    /// Forget everything counted, the limit back to its start.
    pub fn reset(&mut self) {
        *self = Judge::new(self.config.clone());
    }

    /// The report, as `GET /_vendor/report` answers it.
    pub fn report(&self) -> Value {
        let period = self.config.period;
        let (mut most_in_any_window, mut windows_over) = (0_u64, 0_u64);
        let mut first = 0;
        for (index, arrival) in self.arrivals.iter().enumerate() {
            while arrival.at.saturating_sub(self.arrivals[first].at) >= period {
                first += 1;
            }
            let in_window = u64::try_from(index + 1 - first).unwrap_or(u64::MAX);
            most_in_any_window = most_in_any_window.max(in_window);
            if in_window > arrival.limit {
                windows_over += 1;
            }
        }
        let mut most_in_fixed_window = 0_u64;
        let mut current = (u64::MAX, 0_u64);
        for arrival in &self.arrivals {
            let window = window_index(arrival.at, period);
            current = if window == current.0 {
                (window, current.1 + 1)
            } else {
                (window, 1)
            };
            most_in_fixed_window = most_in_fixed_window.max(current.1);
        }
        let ok = self
            .arrivals
            .iter()
            .filter(|arrival| arrival.admitted)
            .count();
        let capacity = self.capacity();
        json!({
            "calls": self.arrivals.len(),
            "ok": ok,
            "limited": self.arrivals.len() - ok,
            "most_in_any_window": most_in_any_window,
            "most_in_fixed_window": most_in_fixed_window,
            "windows_over": windows_over,
            "capacity": capacity,
            "used_share": (capacity > 0.0).then(|| ok as f64 / capacity),
            "limit_changes": self.limit_changes.iter()
                .map(|(at, limit)| json!({"at_ms": ms(*at), "limit": limit}))
                .collect::<Vec<_>>(),
            "arrivals_ms": self.arrivals.iter().map(|arrival| ms(arrival.at)).collect::<Vec<_>>(),
        })
    }

    /// The calls the vendor would admit between the first and the last arrival: the integral
    /// of limit / period over that span.
    fn capacity(&self) -> f64 {
        let (Some(first), Some(last)) = (self.arrivals.first(), self.arrivals.last()) else {
            return 0.0;
        };
        let mut limit = self.config.limit;
        let mut from = first.at;
        let mut total = 0.0;
        for (at, next) in &self.limit_changes {
            let at = (*at).clamp(first.at, last.at);
            total += limit as f64 * at.saturating_sub(from).as_secs_f64();
            from = at;
            limit = *next;
        }
        total += limit as f64 * last.at.saturating_sub(from).as_secs_f64();
        total / self.config.period.as_secs_f64()
    }
}

/// Days since 1970-01-01 to a civil (proleptic Gregorian) date: (year, month, day).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// An instant as RFC 3339 with milliseconds, in UTC: `2026-11-28T23:59:00.250Z`.
pub fn rfc3339_ms(epoch_ms: u64) -> String {
    let seconds = i64::try_from(epoch_ms / 1000).unwrap_or(i64::MAX);
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let of_day = seconds.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        epoch_ms % 1000
    )
}

/// Milliseconds as a Go duration: `0s`, `850ms`, `1.2s`, `6m0s`, `1h2m3.5s`.
pub fn go_duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, minutes, rest) = (ms / 3_600_000, ms / 60_000 % 60, ms % 60_000);
    let mut seconds = format!("{}", rest / 1000);
    if rest % 1000 > 0 {
        let fraction = format!("{:03}", rest % 1000);
        seconds = format!("{seconds}.{}", fraction.trim_end_matches('0'));
    }
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, _) => format!("{minutes}m{seconds}s"),
        _ => format!("{hours}h{minutes}m{seconds}s"),
    }
}

fn ceil_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

fn ceil_s(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(1_000_000_000)).unwrap_or(u64::MAX)
}

/// The rate-limit headers of `family` for one answer, `wall_now` the wall clock (for the
/// families that send an instant rather than a delay).
pub fn advice_headers(
    family: Family,
    answered: &Answered,
    period: Duration,
    wall_now: SystemTime,
) -> Vec<(&'static str, String)> {
    let Answered {
        limit,
        remaining,
        reset,
        ..
    } = *answered;
    let reset_at_ms = || {
        let now = wall_now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        ceil_ms(now + reset)
    };
    match family {
        Family::Ietf => {
            // `w` is whole seconds: a period that is not one is advertised without a window
            // rather than with a wrong one.
            let window = if period.subsec_nanos() == 0 {
                format!(";w={}", period.as_secs())
            } else {
                String::new()
            };
            vec![
                ("ratelimit-policy", format!("\"default\";q={limit}{window}")),
                (
                    "ratelimit",
                    format!("\"default\";r={remaining};t={}", ceil_s(reset)),
                ),
            ]
        }
        Family::OpenAi => vec![
            ("x-ratelimit-limit-requests", limit.to_string()),
            ("x-ratelimit-remaining-requests", remaining.to_string()),
            ("x-ratelimit-reset-requests", go_duration(ceil_ms(reset))),
        ],
        Family::Anthropic => vec![
            ("anthropic-ratelimit-requests-limit", limit.to_string()),
            (
                "anthropic-ratelimit-requests-remaining",
                remaining.to_string(),
            ),
            (
                "anthropic-ratelimit-requests-reset",
                rfc3339_ms(reset_at_ms()),
            ),
        ],
        Family::GitHub => vec![
            ("x-ratelimit-limit", limit.to_string()),
            ("x-ratelimit-remaining", remaining.to_string()),
            (
                "x-ratelimit-reset",
                reset_at_ms().div_ceil(1000).to_string(),
            ),
        ],
        Family::IetfDraft => vec![
            ("ratelimit-limit", limit.to_string()),
            ("ratelimit-remaining", remaining.to_string()),
            ("ratelimit-reset", ceil_s(reset).to_string()),
        ],
    }
}

#[derive(Debug)]
struct Shared {
    judge: Judge,
    started: Instant,
}

type SharedState = Arc<Mutex<Shared>>;

fn lock(state: &SharedState) -> std::sync::MutexGuard<'_, Shared> {
    // A panic while holding the lock leaves plain counters; keep serving them.
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn call(State(state): State<SharedState>, uri: Uri) -> Response {
    if uri.path().starts_with("/_vendor/") {
        return (StatusCode::NOT_FOUND, "no such vendor endpoint").into_response();
    }
    let (answered, config) = {
        let mut shared = lock(&state);
        let at = shared.started.elapsed();
        let answered = shared.judge.arrive(at);
        (answered, shared.judge.config().clone())
    };
    let mut response = if answered.admitted {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::TOO_MANY_REQUESTS, "rate limited").into_response()
    };
    let headers = response.headers_mut();
    if let Some(seconds) = answered.retry_after_s {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    if let Some(family) = config.headers {
        for (name, value) in advice_headers(family, &answered, config.period, SystemTime::now()) {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.append(HeaderName::from_static(name), value);
            }
        }
    }
    response
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, message).into_response()
}

async fn set_limit(State(state): State<SharedState>, body: Bytes) -> Response {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(error) => return bad_request(format!("body: not JSON: {error}")),
    };
    let Some(object) = body.as_object() else {
        return bad_request("body: must be an object {\"limit\": N}".to_owned());
    };
    if let Some(unknown) = object.keys().find(|key| *key != "limit") {
        return bad_request(format!("{unknown}: unknown field"));
    }
    let Some(limit) = object
        .get("limit")
        .and_then(Value::as_u64)
        .filter(|limit| *limit >= 1)
    else {
        return bad_request("limit: required, a whole number of at least 1".to_owned());
    };
    let mut shared = lock(&state);
    let at = shared.started.elapsed();
    shared.judge.set_limit(at, limit);
    axum::Json(json!({"limit": limit, "at_ms": ms(at)})).into_response()
}

async fn report(State(state): State<SharedState>) -> Response {
    axum::Json(lock(&state).judge.report()).into_response()
}

async fn reset(State(state): State<SharedState>) -> Response {
    let mut shared = lock(&state);
    shared.judge.reset();
    shared.started = Instant::now();
    StatusCode::NO_CONTENT.into_response()
}

/// Serves the vendor on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, config: JudgeConfig) -> std::io::Result<()> {
    let state: SharedState = Arc::new(Mutex::new(Shared {
        judge: Judge::new(config),
        started: Instant::now(),
    }));
    let router = axum::Router::new()
        .route("/_vendor/limit", axum::routing::post(set_limit))
        .route("/_vendor/report", axum::routing::get(report))
        .route("/_vendor/reset", axum::routing::post(reset))
        .fallback(call)
        .with_state(state);
    axum::serve(listener, router).await
}

/// A judging vendor on 127.0.0.1:0 of the current runtime, for in-process tests.
#[derive(Debug)]
pub struct JudgeVendor {
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl JudgeVendor {
    pub async fn start(config: JudgeConfig) -> JudgeVendor {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the vendor");
        let address = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            let _ = serve(listener, config).await;
        });
        JudgeVendor { address, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }
}

impl Drop for JudgeVendor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `tollgate-mock-vendor`'s main: parse the flags, bind, print `listening on http://ADDR` as
/// the first stdout line (flushed, so a parent process can read the port), serve. Returns the
/// process exit code.
pub fn run_cli() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (listen, config) = match parse_args(&args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
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
        let address = match listener.local_addr() {
            Ok(address) => address,
            Err(error) => {
                eprintln!("--listen: {error}");
                return 1;
            }
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
