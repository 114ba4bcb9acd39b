//! The grant on a Tollgate server and its settlement.
//!
//! A request takes its three costs before it goes, in one acquire (`POST /v1/acquire` with
//! `costs`): one request, its input tokens (their estimate) and its output tokens (their
//! estimate), all or none, waiting up to the budget's wait; a request that sets no output cap
//! takes the `overrun` lease in the same acquire. Nothing is sent before all of it is held, so
//! no concurrent request passes a check that another has not yet been counted against, and no
//! grant ages while another limit is waited for.
//!
//! While the answer streams, text beyond the output estimate is taken at once by a top-up (an
//! acquire that does not wait, made beside the stream, never in its way); what a top-up cannot
//! get is charged (`POST /v1/charge`): counted on the server even past the limit, a debt that
//! every later acquire in the fleet waits out. At the end the permit is committed with what the
//! vendor reported, limit by limit, the rest refunded, and what the answer used beyond its
//! grant and its top-ups is charged before the overrun lease is given back. An answer that
//! fails or is cancelled is charged what the vendor charges: its reported usage when it has
//! one, else its input estimate and the output streamed so far.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_api::data::{AcquireBody, ChargeBody, CommitBody, Granted, RateLimited, Used};

use super::estimate::{Api, Estimate, EstimateConfig, estimate};
use super::usage::{Usage, UsageReader};
use crate::error::DispatchError;

/// Smallest top-up asked for, in tokens: fewer calls to the server while a stream runs.
const TOP_UP_STEP: u64 = 64;
/// Least time between two top-ups of one stream after a refusal.
const TOP_UP_RETRY: Duration = Duration::from_millis(100);

/// The names of the limits on the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Requests per period: one unit per request.
    pub requests: String,
    /// Input tokens per period.
    pub input: String,
    /// Output tokens per period.
    pub output: String,
    /// A concurrency limit of one lease, taken by every request that sets no output cap and
    /// held until its stream has settled and what it ran past its grant is charged: then at
    /// most one stream at a time, fleet-wide, can outrun its estimate, which is what bounds
    /// the vendor's count to the limit plus one stream's excess. `None`: no such lease, and
    /// the bound is one stream's excess per uncapped stream in flight.
    pub overrun: Option<String>,
}

/// What a budget has done, for tests and figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetStats {
    /// Requests sent.
    pub sent: u64,
    /// Answers the vendor refused with 429.
    pub vendor_limited: u64,
    /// Tokens taken by top-ups while streams ran.
    pub topped_up: u64,
    /// Top-ups refused (the limit was full): their tokens were charged instead.
    pub top_ups_refused: u64,
    /// Tokens charged past a grant (`POST /v1/charge`): a debt the whole fleet waits out.
    pub charged: u64,
    /// Settlements that failed to reach the server (their permits keep every unit).
    pub settle_errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    vendor_limited: AtomicU64,
    topped_up: AtomicU64,
    top_ups_refused: AtomicU64,
    charged: AtomicU64,
    settle_errors: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    base_url: String,
    token: Option<String>,
    limits: BudgetLimits,
    config: EstimateConfig,
    client: reqwest::Client,
    /// The longest a request waits for its grant.
    wait: Duration,
    counters: Counters,
}

/// Token budgets for one vendor on a Tollgate server, shared by clones.
#[derive(Clone, Debug)]
pub struct TokenBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Permit {
    id: String,
    /// Its tokens: (input, output); a top-up holds one of the two.
    tokens: (u64, u64),
    /// When the server granted it, as near as this process knows: the time from it to the
    /// request's sending is reported, so that the limit's margin covers it.
    granted_at: Instant,
}

/// A top-up's state: shared between the stream and the task that takes top-ups beside it.
#[derive(Debug, Default)]
struct TopUps {
    /// Granted beyond the reservation: (input, output).
    extra: (u64, u64),
    permits: Vec<Permit>,
}

/// One request's grant: what it holds.
#[derive(Debug)]
pub struct Reservation {
    budget: TokenBudget,
    estimate: Estimate,
    /// The request, its input and output tokens, and the overrun lease for a request without
    /// an output cap.
    permit: Permit,
    sent_at: Option<Instant>,
    top_ups: Arc<Mutex<TopUps>>,
    /// What the stream has shown so far: (input, output) tokens at least.
    seen: Option<watch::Sender<(u64, u64)>>,
    topping: Option<tokio::task::JoinHandle<()>>,
}

fn transport(error: reqwest::Error) -> DispatchError {
    DispatchError::Remote {
        reason: format!("unreachable: {error}"),
        transient: true,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl TokenBudget {
    /// `base_url`: the server's root; `wait`: the longest a request waits for its grant.
    pub fn new(
        base_url: &str,
        token: Option<String>,
        limits: BudgetLimits,
        config: EstimateConfig,
        wait: Duration,
    ) -> Result<TokenBudget, DispatchError> {
        let base_url = base_url.trim_end_matches('/').to_owned();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(DispatchError::config(
                "base_url",
                "must start with http:// or https://",
            ));
        }
        if config.output_default == 0 {
            return Err(DispatchError::config(
                "output_default",
                "must be at least 1",
            ));
        }
        let client = reqwest::Client::builder()
            .build()
            .map_err(|error| DispatchError::config("base_url", error.to_string()))?;
        Ok(TokenBudget {
            inner: Arc::new(Inner {
                base_url,
                token,
                limits,
                config,
                client,
                wait,
                counters: Counters::default(),
            }),
        })
    }

    pub fn stats(&self) -> BudgetStats {
        let c = &self.inner.counters;
        BudgetStats {
            sent: c.sent.load(Ordering::Relaxed),
            vendor_limited: c.vendor_limited.load(Ordering::Relaxed),
            topped_up: c.topped_up.load(Ordering::Relaxed),
            top_ups_refused: c.top_ups_refused.load(Ordering::Relaxed),
            charged: c.charged.load(Ordering::Relaxed),
            settle_errors: c.settle_errors.load(Ordering::Relaxed),
        }
    }

    async fn post(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<(reqwest::StatusCode, bytes::Bytes), DispatchError> {
        let mut request = self
            .inner
            .client
            .post(format!("{}{path}", self.inner.base_url))
            .timeout(timeout)
            .json(body);
        if let Some(token) = &self.inner.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport)?;
        Ok((status, bytes))
    }

    /// One acquire of `limits`, one unit each but for `tokens` (limit, cost; a limit named
    /// twice, one TPM for input and output, takes both): the permit, holding `held` (input,
    /// output) tokens, or `None` when refused within `wait`.
    async fn take(
        &self,
        limits: Vec<String>,
        tokens: &[(&str, u64)],
        held: (u64, u64),
        wait: Duration,
    ) -> Result<Option<Permit>, DispatchError> {
        let body = AcquireBody {
            limits,
            key: None,
            cost: None,
            costs: Some(by_limit(tokens.iter().copied())),
            priority: None,
            wait_ms: Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
            refundable: None,
        };
        let (status, bytes) = self
            .post("/v1/acquire", &body, wait + Duration::from_secs(10))
            .await?;
        if status == reqwest::StatusCode::OK {
            let granted: Granted =
                serde_json::from_slice(&bytes).map_err(|error| DispatchError::Remote {
                    reason: format!("unexpected answer: {error}"),
                    transient: false,
                })?;
            return Ok(Some(Permit {
                id: granted.permit,
                tokens: held,
                granted_at: Instant::now(),
            }));
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS
            && serde_json::from_slice::<RateLimited>(&bytes).is_ok()
        {
            return Ok(None);
        }
        Err(DispatchError::Remote {
            reason: format!("{status}: {}", String::from_utf8_lossy(&bytes)),
            transient: status.is_server_error(),
        })
    }

    /// Commit `permit`: `used` (input, output) tokens, each at most what it holds, and one
    /// request when `request` (the reservation's own permit, which also takes one).
    async fn commit(
        &self,
        permit: &Permit,
        used: (u64, u64),
        request: bool,
        sent_at: Option<Instant>,
    ) {
        let limits = &self.inner.limits;
        let tokens = [
            (limits.input.as_str(), permit.tokens.0, used.0),
            (limits.output.as_str(), permit.tokens.1, used.1),
        ];
        let mut each = by_limit(
            tokens
                .into_iter()
                .filter(|(_, held, _)| *held > 0)
                .map(|(name, held, used)| (name, used.min(held))),
        );
        if request {
            each.insert(limits.requests.clone(), 1);
        }
        let body = CommitBody {
            used: Some(Used::Each(each)),
            sent_after_ms: sent_at.map(|sent| {
                tollgate_api::ms_ceil(sent.saturating_duration_since(permit.granted_at))
            }),
        };
        let path = format!("/v1/permits/{}/commit", permit.id);
        let settled = self.post(&path, &body, Duration::from_secs(10)).await;
        if !matches!(settled, Ok((status, _)) if status.is_success()) {
            self.inner
                .counters
                .settle_errors
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(permit = %permit.id, "a token permit could not be settled: {settled:?}");
        }
    }

    /// Charge (input, output) tokens spent past every grant: counted on the server at once,
    /// past the limits if need be, so that every later acquire in the fleet waits them out.
    /// A charge that fails to reach the server is counted as a settlement error.
    async fn charge(&self, tokens: (u64, u64)) {
        let limits = &self.inner.limits;
        let costs = by_limit(
            [
                (limits.input.as_str(), tokens.0),
                (limits.output.as_str(), tokens.1),
            ]
            .into_iter()
            .filter(|(_, units)| *units > 0),
        );
        if costs.is_empty() {
            return;
        }
        let body = ChargeBody {
            limits: costs.keys().cloned().collect(),
            key: None,
            cost: None,
            costs: Some(costs),
        };
        let charged = self
            .post("/v1/charge", &body, Duration::from_secs(10))
            .await;
        if matches!(charged, Ok((status, _)) if status.is_success()) {
            self.inner
                .counters
                .charged
                .fetch_add(tokens.0 + tokens.1, Ordering::Relaxed);
        } else {
            self.inner
                .counters
                .settle_errors
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!("tokens spent past a grant could not be charged: {charged:?}");
        }
    }

    /// Take a request's three costs (and the overrun lease when it sets no output cap) in one
    /// acquire, all or none, waiting up to the budget's wait.
    pub async fn reserve(&self, estimate: Estimate) -> Result<Reservation, DispatchError> {
        let limits = &self.inner.limits;
        let mut names = vec![limits.requests.clone(), limits.input.clone()];
        if limits.output != limits.input {
            names.push(limits.output.clone());
        }
        if !estimate.bounded
            && let Some(overrun) = &limits.overrun
        {
            names.push(overrun.clone());
        }
        let held = (estimate.input.max(1), estimate.output.max(1));
        let tokens = [
            (limits.input.as_str(), held.0),
            (limits.output.as_str(), held.1),
        ];
        let Some(permit) = self.take(names, &tokens, held, self.inner.wait).await? else {
            return Err(DispatchError::WaitTimedOut {
                waited_ms: u64::try_from(self.inner.wait.as_millis()).unwrap_or(u64::MAX),
                paused: false,
            });
        };
        let top_ups = Arc::new(Mutex::new(TopUps::default()));
        let (seen, watcher) = watch::channel((0, 0));
        let topping = tokio::spawn(top_up(
            self.clone(),
            watcher,
            top_ups.clone(),
            permit.tokens,
        ));
        Ok(Reservation {
            budget: self.clone(),
            estimate,
            permit,
            sent_at: None,
            top_ups,
            seen: Some(seen),
            topping: Some(topping),
        })
    }

    /// Estimate, reserve, send and meter a request of a recognised API (by its path; `None`
    /// for any other, which this does not send). `input_tokens`: the caller's own count. A
    /// streaming chat request without `stream_options.include_usage` gets it, so that the
    /// stream ends with the vendor's usage.
    pub async fn send(
        &self,
        client: &reqwest::Client,
        mut request: reqwest::Request,
        input_tokens: Option<u64>,
    ) -> Result<Metered, DispatchError> {
        let api = Api::recognise(request.url().path())
            .ok_or_else(|| DispatchError::config("url", "not a recognised model API path"))?;
        let body = request
            .body()
            .and_then(reqwest::Body::as_bytes)
            .ok_or_else(|| DispatchError::config("body", "must be a JSON body held in memory"))?
            .to_vec();
        let found = estimate(api, &body, input_tokens, &self.inner.config)?;
        if api == Api::OpenAiChat
            && found.stream
            && let Ok(mut json) = serde_json::from_slice::<Value>(&body)
            && json.pointer("/stream_options/include_usage").is_none()
        {
            let options = json
                .as_object_mut()
                .map(|object| object.entry("stream_options").or_insert(Value::Null));
            if let Some(options) = options {
                if !options.is_object() {
                    *options = Value::Object(Default::default());
                }
                if let Some(options) = options.as_object_mut() {
                    options.insert("include_usage".into(), Value::Bool(true));
                }
                if let Ok(bytes) = serde_json::to_vec(&json) {
                    *request.body_mut() = Some(bytes.into());
                }
            }
        }
        let mut reservation = self.reserve(found).await?;
        reservation.sent_at = Some(Instant::now());
        self.inner.counters.sent.fetch_add(1, Ordering::Relaxed);
        match client.execute(request).await {
            Ok(response) => Ok(Metered::new(api, response, reservation).await),
            Err(error) => {
                // Never connected: the vendor saw nothing. Otherwise it may have: keep it all.
                let nothing = error.is_connect();
                reservation.settle(Ending::Unsent { nothing }).await;
                Err(DispatchError::Remote {
                    reason: format!("the vendor: {error}"),
                    transient: true,
                })
            }
        }
    }
}

/// Takes top-ups beside one stream: whenever the stream shows more than is held, the
/// difference (at least [`TOP_UP_STEP`]) is asked for without waiting, and asked again
/// [`TOP_UP_RETRY`] after a refusal.
async fn top_up(
    budget: TokenBudget,
    mut seen: watch::Receiver<(u64, u64)>,
    state: Arc<Mutex<TopUps>>,
    held: (u64, u64),
) {
    let limits = budget.inner.limits.clone();
    while seen.changed().await.is_ok() {
        let (input, output) = *seen.borrow_and_update();
        let extra = lock(&state).extra;
        for (is_output, shown, held, extra, name) in [
            (false, input, held.0, extra.0, &limits.input),
            (true, output, held.1, extra.1, &limits.output),
        ] {
            let need = shown.saturating_sub(held + extra);
            if need == 0 {
                continue;
            }
            let ask = need.div_ceil(TOP_UP_STEP) * TOP_UP_STEP;
            let held = if is_output { (0, ask) } else { (ask, 0) };
            match budget
                .take(
                    vec![name.clone()],
                    &[(name.as_str(), ask)],
                    held,
                    Duration::ZERO,
                )
                .await
            {
                Ok(Some(permit)) => {
                    budget
                        .inner
                        .counters
                        .topped_up
                        .fetch_add(ask, Ordering::Relaxed);
                    let mut state = lock(&state);
                    if is_output {
                        state.extra.1 += ask;
                    } else {
                        state.extra.0 += ask;
                    }
                    state.permits.push(permit);
                }
                _ => {
                    budget
                        .inner
                        .counters
                        .top_ups_refused
                        .fetch_add(1, Ordering::Relaxed);
                    // Not charged yet: the text streamed is only an upper bound on the
                    // tokens (a byte a token), and a charge is never given back. The settlement
                    // charges what the vendor reports past the grant, before the overrun lease
                    // goes.
                    tokio::time::sleep(TOP_UP_RETRY).await;
                }
            }
        }
    }
}

/// Units by limit name, a limit named twice (one TPM for input and output) taking the sum.
fn by_limit<'a>(
    units: impl IntoIterator<Item = (&'a str, u64)>,
) -> std::collections::BTreeMap<String, u64> {
    let mut each = std::collections::BTreeMap::new();
    for (name, units) in units {
        *each.entry(name.to_owned()).or_insert(0) += units;
    }
    each
}

/// How an answer ended.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// The request never got an answer; `nothing`: it never reached the vendor.
    Unsent { nothing: bool },
    /// The vendor answered with a status that is not success: it charges no tokens.
    Refused,
    /// The body was read to its end, or stopped (failed, cut, cancelled): `usage` is what it
    /// showed.
    Read(Usage),
    /// The caller read the answer: what the vendor charged.
    Charged(u64, u64),
}

impl Reservation {
    /// The estimate the grant was made for.
    pub fn estimate(&self) -> Estimate {
        self.estimate
    }

    /// What the answer has shown so far: top-ups follow it.
    fn show_usage(&self, usage: &Usage) {
        let (input, output) = self.charged(usage);
        self.show(input, output);
    }

    /// For an API read by the caller: the answer has shown at least `input` and `output`
    /// tokens so far; what passes the grant is topped up beside it, without waiting.
    pub fn show(&self, input: u64, output: u64) {
        if let Some(seen) = &self.seen {
            seen.send_replace((input, output));
        }
    }

    /// For an API read by the caller: the request was sent now.
    pub fn sent(&mut self) {
        self.sent_at = Some(Instant::now());
    }

    /// For an API read by the caller: settle with what the vendor charged. Refunds the rest;
    /// a shortfall is a debt (see the module documentation).
    pub async fn finish(self, input: u64, output: u64) {
        self.settle(Ending::Charged(input, output)).await;
    }

    /// What the vendor charges for what the answer showed: its report, else the input
    /// estimate and the text streamed (never more output than a cap the request set). Until
    /// the answer is finished, a reported output (Anthropic's `message_start` says 1) is only
    /// a floor: the text streamed counts when it is more.
    fn charged(&self, usage: &Usage) -> (u64, u64) {
        let input = usage.input.unwrap_or(self.estimate.input);
        let streamed = if self.estimate.bounded {
            usage.streamed.min(self.estimate.output)
        } else {
            usage.streamed
        };
        let output = match usage.output {
            Some(reported) if usage.finished => reported,
            Some(reported) => reported.max(streamed),
            None => streamed,
        };
        (input, output)
    }

    async fn settle(mut self, ending: Ending) {
        let budget = self.budget.clone();
        let (input, output) = match ending {
            Ending::Unsent { nothing: true } | Ending::Refused => (0, 0),
            Ending::Unsent { nothing: false } => (self.estimate.input, self.estimate.output),
            Ending::Read(usage) => self.charged(&usage),
            Ending::Charged(input, output) => (input, output),
        };
        // Stop the top-ups: what they took is settled below.
        drop(self.seen.take());
        if let Some(topping) = self.topping.take() {
            let _ = topping.await;
        }
        let sent_after = self.sent_at;
        let top_ups = std::mem::take(&mut *lock(&self.top_ups));
        // The reservation first, then each top-up, as far as the tokens used go; what is left
        // past them is charged.
        let mut left = (input, output);
        let take = |left: &mut (u64, u64), held: (u64, u64)| {
            let part = (left.0.min(held.0), left.1.min(held.1));
            left.0 -= part.0;
            left.1 -= part.1;
            part
        };
        let own = take(&mut left, self.permit.tokens);
        let extra: Vec<(u64, u64)> = top_ups
            .permits
            .iter()
            .map(|permit| take(&mut left, permit.tokens))
            .collect();
        let past = left;
        // Charged before the overrun lease goes with the commit below: no other uncapped
        // stream starts before the fleet counts this one's excess.
        budget.charge(past).await;
        for (permit, used) in top_ups.permits.iter().zip(extra) {
            budget.commit(permit, used, false, None).await;
        }
        budget.commit(&self.permit, own, true, sent_after).await;
    }
}

/// An answer metered as it is read: chunks pass as they come, top-ups follow the stream, and
/// the grant is settled when the body ends, fails, or this is dropped unread (a cancellation).
#[derive(Debug)]
pub struct Metered {
    response: reqwest::Response,
    reader: UsageReader,
    reservation: Option<Reservation>,
}

impl Metered {
    async fn new(api: Api, response: reqwest::Response, reservation: Reservation) -> Metered {
        let events = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("text/event-stream"));
        let mut metered = Metered {
            reader: UsageReader::new(api, events),
            response,
            reservation: Some(reservation),
        };
        if !metered.response.status().is_success() {
            if metered.response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS
                && let Some(reservation) = &metered.reservation
            {
                reservation
                    .budget
                    .inner
                    .counters
                    .vendor_limited
                    .fetch_add(1, Ordering::Relaxed);
            }
            if let Some(reservation) = metered.reservation.take() {
                reservation.settle(Ending::Refused).await;
            }
        }
        metered
    }

    pub fn status(&self) -> reqwest::StatusCode {
        self.response.status()
    }

    pub fn headers(&self) -> &HeaderMap {
        self.response.headers()
    }

    /// What the answer has shown of its cost so far.
    pub fn usage(&self) -> Usage {
        self.reader.usage()
    }

    /// The next chunk of the body, as it came; at the end (`None`) or on an error the grant is
    /// settled before this returns.
    pub async fn chunk(&mut self) -> Result<Option<bytes::Bytes>, reqwest::Error> {
        match self.response.chunk().await {
            Ok(Some(chunk)) => {
                self.reader.feed(&chunk);
                if let Some(reservation) = &self.reservation {
                    reservation.show_usage(&self.reader.usage());
                }
                Ok(Some(chunk))
            }
            Ok(None) => {
                self.finish().await;
                Ok(None)
            }
            Err(error) => {
                self.finish().await;
                Err(error)
            }
        }
    }

    /// Stop reading: the grant is settled for what was shown (a cancellation).
    pub async fn cancel(mut self) {
        self.finish().await;
    }

    async fn finish(&mut self) {
        self.reader.end();
        if let Some(reservation) = self.reservation.take() {
            reservation.settle(Ending::Read(self.reader.usage())).await;
        }
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            self.reader.end();
            let usage = self.reader.usage();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(reservation.settle(Ending::Read(usage)));
            }
        }
    }
}
