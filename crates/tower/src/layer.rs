//! The middleware: `ThrottleLayer` holds the configuration and shared state, `Throttle<S>`
//! wraps a service, `ResponseFuture` decides and then calls the service.
//!
//! A request that matches no rule costs at most a path normalization and a hash lookup (none
//! when every rule in force matches every path), and goes straight to the service. A matched
//! one is decided by the limiter in one all-or-nothing request (see the crate docs); the inner
//! service is called only when it is granted.
//!
//! With an in-process store (the memory store) the decision is complete on its first poll, so
//! it is taken inside `call`: the limit names and the user key are borrowed from the rules
//! index and the request, nothing is boxed, and the service that was polled ready is called at
//! once. A request that one keyed GCRA rule decides, counted under its connection's peer
//! (`PeerAddr`, held by a throttle made for its connection or carried in the connection
//! info), is decided on the connection's handle on its client's key: one
//! compare-and-swap on the key's word. With a remote store the acquire is boxed with owned copies and awaited in the
//! response future, calling a clone of the service once it is granted.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use smallvec::SmallVec;
use tollgate::{
    COUNTERS_PER_REQUEST_MAX, Check, Denied, LimitHandle, LimitStatus, Limiter, Outcome, Permit,
    Priority,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::LeasedBody;
use crate::headers::{
    Member, RATELIMIT, RATELIMIT_POLICY, policy_value, ratelimit_members, ratelimit_value,
    retry_after_value,
};
use crate::identity::{AddressText, Identity, PeerAddr, Unidentified, User};
use crate::metrics::{LayerCounters, ThrottleMetrics, bump, read};
use crate::rules::{Matched, Matching, RuleIndex, RuleTracker, ThrottleRules};

/// What to do when the store cannot decide (unreachable, failing). An explicit choice: there
/// is no default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStoreError {
    /// Let the request through unthrottled (availability over the limit).
    FailOpen,
    /// Answer `503 Service Unavailable` (the limit over availability).
    FailClosed,
}

/// How the layer behaves; every field is the caller's decision (no defaults).
#[derive(Clone, Debug)]
pub struct ThrottleConfig {
    /// Where the user key comes from.
    pub identity: Identity,
    /// What to do with a request whose user cannot be told, when a matched rule counts per user.
    pub unidentified: Unidentified,
    /// Send `RateLimit-Policy` and `RateLimit` on allowed responses too (always on refusals).
    pub headers_on_allowed: bool,
    pub on_store_error: OnStoreError,
}

/// How long a client told "too many keys" should wait: keys come back as counters go idle,
/// which the background sweep notices within its interval.
const TOO_MANY_KEYS_RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Shared {
    limiter: Limiter,
    rules: RuleTracker,
    config: ThrottleConfig,
    counters: LayerCounters,
    /// Which kind of connection info a client address was last found in (`PeerAddr` or
    /// `SocketAddr`): looked for first.
    peer_addr_first: AtomicBool,
    /// Whether the store answers without I/O, so a decision completes on its first poll and
    /// is taken in `call`. Starts from the store's `answers_at_once`, and is cleared for good the first time a decision turns out to need waiting.
    decides_in_call: AtomicBool,
}

/// Applies Tollgate limits to the requests of the services it wraps. Clones share one state.
#[derive(Clone, Debug)]
pub struct ThrottleLayer {
    shared: Arc<Shared>,
}

impl ThrottleLayer {
    /// A layer over `limiter`. With [`ThrottleRules::Fixed`], the rules are put in force on
    /// `limiter` now; with [`ThrottleRules::Sql`], `limiter` must be the one the `Rules` feed
    /// (`rules.limiter()`), since that is where each reload puts its limits.
    pub fn new(limiter: Limiter, rules: ThrottleRules, config: ThrottleConfig) -> ThrottleLayer {
        let rules = RuleTracker::new(rules, &limiter);
        let in_process = limiter.store().answers_at_once();
        ThrottleLayer {
            shared: Arc::new(Shared {
                limiter,
                rules,
                config,
                counters: LayerCounters::default(),
                decides_in_call: AtomicBool::new(in_process),
                peer_addr_first: AtomicBool::new(true),
            }),
        }
    }

    /// A layer over the SQL rules table, on the limiter it feeds.
    pub fn from_sql(rules: tollgate_rules::Rules, config: ThrottleConfig) -> ThrottleLayer {
        let limiter = rules.limiter().clone();
        ThrottleLayer::new(limiter, ThrottleRules::Sql(rules), config)
    }

    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }

    /// The counters so far, by rule in force.
    pub fn metrics(&self) -> ThrottleMetrics {
        let index = self.shared.rules.index();
        read(
            index
                .entries
                .iter()
                .map(|entry| (entry.rule.name().to_owned(), entry.counters.clone())),
            &self.shared.counters,
        )
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            shared: self.shared.clone(),
            peer: None,
        }
    }
}

/// A service whose matched requests are throttled.
#[derive(Clone, Debug)]
pub struct Throttle<S> {
    inner: S,
    shared: Arc<Shared>,
    /// The connection's peer, for a throttle made for one connection (`crate::serve`): read
    /// before any connection info a request carries.
    peer: Option<PeerAddr>,
}

impl<S> Throttle<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// This throttle for the connection of `peer`.
    pub(crate) fn with_peer(&self, peer: PeerAddr) -> Throttle<S>
    where
        S: Clone,
    {
        Throttle {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            peer: Some(peer),
        }
    }
}

type Acquire = Pin<Box<dyn Future<Output = tollgate::Result<Outcome>> + Send>>;

/// The layer's own answer, turned into a response once the body type is known.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    // A Vec, not inline: answers are the rare path, and this keeps what carries them small.
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

impl Answer {
    fn error(status: StatusCode, code: &str, message: &str) -> Answer {
        let body = format!(
            "{{\"error\":{{\"code\":\"{code}\",\"message\":{}}}}}",
            json_string(message)
        );
        Answer {
            status,
            headers: Vec::new(),
            body: Bytes::from(body),
        }
    }

    fn into_response(self) -> Response<Body> {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}

/// A JSON string literal; messages are ours, but escaping keeps the body valid whatever they say.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The `RateLimit-Policy` and `RateLimit` fields, inline: an allowed response carries them in
/// a box already (`Extra`).
type Headers = SmallVec<[(HeaderName, HeaderValue); 2]>;

/// A matched request, decided.
enum Settled {
    /// Call the service, with what its response carries besides its own, if anything.
    Call { extra: Option<Box<Extra>> },
    /// The layer answers itself (a refusal, a failure, no user, an undecodable path).
    Answer(Answer),
}

/// What `call` found out about a request.
enum Prepared {
    /// Matched no rule: call the service untouched.
    Pass,
    Settled(Settled),
    /// A remote store: the decision is awaited in the response future.
    Acquire {
        acquire: Acquire,
        index: Arc<RuleIndex>,
        matched: Matched,
    },
}

impl Shared {
    /// `peer`: the connection's, when the throttle was made for one.
    fn prepare<B>(&self, request: &Request<B>, peer: Option<&PeerAddr>) -> Prepared {
        let index = self.rules.index();
        let Matching {
            matched,
            per_user,
            leases,
        } = match index.matching_request(request) {
            Ok(matching) => matching,
            Err(error) => {
                bump(&self.counters.bad_path);
                return Prepared::Settled(Settled::Answer(Answer::error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    &format!("path: {error}"),
                )));
            }
        };
        if matched.is_empty() {
            bump(&self.counters.unmatched);
            return Prepared::Pass;
        }
        let mut address = AddressText::default();
        let user = if per_user {
            match self.config.identity.user_of(
                request.headers(),
                request.extensions(),
                peer,
                &mut address,
                &self.peer_addr_first,
            ) {
                Some(user) => Some(user),
                None => {
                    bump(&self.counters.unidentified);
                    match &self.config.unidentified {
                        Unidentified::SharedKey(key) => Some(User {
                            key: key.as_str(),
                            connection: None,
                        }),
                        Unidentified::Reject => {
                            return Prepared::Settled(Settled::Answer(Answer::error(
                                StatusCode::UNAUTHORIZED,
                                "unauthorized",
                                "this endpoint is limited per user, and the request names no user",
                            )));
                        }
                    }
                }
            }
        } else {
            None
        };
        let key = user.map(|user| user.key);
        if self.decides_in_call.load(Ordering::Relaxed) {
            // One rule with nothing to hold: checked by the handle the index keeps, with no
            // name to look up; by the connection's handle on its key, when the request is
            // counted under its connection's peer and that handle can decide alone.
            let by_handle = match matched[..] {
                [position] if !leases => {
                    let entry = &index.entries[position as usize];
                    match (entry.handle.as_ref(), user.and_then(|user| user.connection)) {
                        (Some(handle), Some(connection)) if handle.key_handles_decide() => {
                            // Allowed with nothing to send but counts: one unit taken on the
                            // word, with no numbers worked out.
                            if !self.config.headers_on_allowed && connection.take_now(handle) {
                                bump(&entry.counters.allowed);
                                return Prepared::Settled(Settled::Call { extra: None });
                            }
                            connection.check_now(handle)
                        }
                        (Some(handle), _) => handle.check_now(key, 1, Priority::Normal),
                        (None, _) => None,
                    }
                }
                _ => None,
            };
            let settled = match by_handle {
                // Without fields to send, an allowed request needs only counting: handing its
                // statuses to `settle_check` costs more than that.
                Some(Ok(Check::Allowed(_))) if !self.config.headers_on_allowed => {
                    Some(Settled::Call {
                        extra: self.allowed(&index, &matched, Headers::new),
                    })
                }
                Some(checked) => Some(self.settle_check(&index, &matched, checked)),
                // Several rules, or a handle that needs the general way (its limit changed
                // and the index has not caught up yet): by name.
                None => self.decide_in_call(&index, &matched, key, leases),
            };
            match settled {
                Some(settled) => return Prepared::Settled(settled),
                None => {
                    // The store is not in-process after all. The limiter's decisions are
                    // cancel-safe: dropping one here holds nothing, and a grant whose answer is
                    // lost stays counted, the safe side. Every later request awaits instead.
                    self.decides_in_call.store(false, Ordering::Relaxed);
                }
            }
        }
        self.deferred(Arc::clone(&index), matched, key)
    }

    /// The decision on `matched` by the rules' names, taken in `call` with an in-process store:
    /// `None` when the store turns out to need waiting.
    fn decide_in_call(
        &self,
        index: &RuleIndex,
        matched: &Matched,
        key: Option<&str>,
        leases: bool,
    ) -> Option<Settled> {
        // Every matched rule by name: past what one request may name (which the rules in force
        // never allow), the limiter's own error answers rather than some rule being left out.
        let names: SmallVec<[&str; COUNTERS_PER_REQUEST_MAX]> = matched
            .iter()
            .map(|&position| index.entries[position as usize].rule.name())
            .collect();
        // The layer never commits for a refund (a served request used its unit), so the store
        // need not record the reservation; leases are held and released as always.
        let mut acquire = tollgate::Request::all(&names).refundable(false);
        if let Some(key) = key {
            acquire = acquire.key(key);
        }
        let mut context = Context::from_waker(Waker::noop());
        if !leases {
            // Nothing to hold: a decision without a permit.
            return match std::pin::pin!(self.limiter.check(&acquire)).poll(&mut context) {
                Poll::Ready(checked) => Some(self.settle_check(index, matched, checked)),
                Poll::Pending => None,
            };
        }
        // The index's handles, when it has one for every rule: the limiter then looks none of
        // them up by name.
        let mut handles: SmallVec<[&LimitHandle; COUNTERS_PER_REQUEST_MAX]> = SmallVec::new();
        let every_rule = matched.iter().all(|&position| {
            match index.entries[position as usize].handle.as_ref() {
                Some(handle) => {
                    handles.push(handle);
                    true
                }
                None => false,
            }
        });
        let by_handles = every_rule
            .then(|| self.limiter.try_acquire_now_with(&acquire, &handles))
            .flatten();
        let outcome = match by_handles {
            Some(outcome) => outcome,
            None => match std::pin::pin!(self.limiter.try_acquire(&acquire)).poll(&mut context) {
                Poll::Ready(outcome) => outcome,
                Poll::Pending => return None,
            },
        };
        Some(self.settle(index, matched, outcome))
    }

    /// The decision awaited in the response future, for a store that does not answer at once:
    /// owned copies of the names and the key go with it.
    fn deferred(&self, index: Arc<RuleIndex>, matched: Matched, key: Option<&str>) -> Prepared {
        let limiter = self.limiter.clone();
        let user: Option<Box<str>> = key.map(Box::from);
        let owned_index = Arc::clone(&index);
        let owned_matched = matched.clone();
        let acquire = Box::pin(async move {
            let names: SmallVec<[&str; COUNTERS_PER_REQUEST_MAX]> = owned_matched
                .iter()
                .map(|&position| owned_index.entries[position as usize].rule.name())
                .collect();
            let mut request = tollgate::Request::all(&names).refundable(false);
            if let Some(user) = user.as_deref() {
                request = request.key(user);
            }
            limiter.try_acquire(&request).await
        });
        Prepared::Acquire {
            acquire,
            index,
            matched,
        }
    }

    /// What to do once the limiter has answered.
    fn settle(
        &self,
        index: &RuleIndex,
        matched: &Matched,
        outcome: tollgate::Result<Outcome>,
    ) -> Settled {
        match outcome {
            Ok(Outcome::Granted(permit)) => {
                let headers = || Shared::rate_headers(index, matched, &permit.limits());
                let mut extra = self.allowed(index, matched, headers);
                // Only a lease needs holding; dropping a rate-only permit keeps its units
                // used, which is what a served request means.
                if permit.fence().is_some() {
                    extra.get_or_insert_default().permit = Some(permit);
                }
                Settled::Call { extra }
            }
            Ok(Outcome::Denied(denied)) => Settled::Answer(self.refused(index, matched, &denied)),
            Err(error) => match self.failed(&error) {
                Some(answer) => Settled::Answer(answer),
                None => Settled::Call { extra: None },
            },
        }
    }

    /// `settle` for a `check`: nothing to hold, the statuses in the rules' order.
    fn settle_check(
        &self,
        index: &RuleIndex,
        matched: &Matched,
        checked: tollgate::Result<Check>,
    ) -> Settled {
        match checked {
            Ok(Check::Allowed(statuses)) => {
                let headers = || {
                    let members = matched
                        .iter()
                        .zip(&statuses)
                        .map(|(&position, status)| Member {
                            name: index.entries[position as usize].rule.name(),
                            remaining: status.remaining,
                            reset_after: status.reset_after,
                            is_lease: false,
                        });
                    Shared::headers_with(index, matched, ratelimit_members(members))
                };
                Settled::Call {
                    extra: self.allowed(index, matched, headers),
                }
            }
            Ok(Check::Denied(denied)) => Settled::Answer(self.refused(index, matched, &denied)),
            Err(error) => self.settle(index, matched, Err(error)),
        }
    }

    /// Count an allowed request on its rules; the headers for it, if allowed answers carry
    /// them.
    fn allowed(
        &self,
        index: &RuleIndex,
        matched: &Matched,
        headers: impl FnOnce() -> Headers,
    ) -> Option<Box<Extra>> {
        for &position in matched {
            bump(&index.entries[position as usize].counters.allowed);
        }
        self.config.headers_on_allowed.then(|| {
            Box::new(Extra {
                permit: None,
                headers: headers(),
            })
        })
    }

    /// `RateLimit-Policy` for the matched rules, and `ratelimit` as `RateLimit`.
    fn headers_with(
        index: &RuleIndex,
        matched: &Matched,
        ratelimit: Option<HeaderValue>,
    ) -> Headers {
        let mut headers = Headers::new();
        let entries = matched.iter().map(|&p| &index.entries[p as usize]);
        if let Some(value) = policy_value(entries.map(|entry| entry.policy_item.as_str())) {
            headers.push((HeaderName::from_static(RATELIMIT_POLICY), value));
        }
        if let Some(value) = ratelimit {
            headers.push((HeaderName::from_static(RATELIMIT), value));
        }
        headers
    }

    /// `RateLimit-Policy` and `RateLimit` for the matched rules and their statuses.
    fn rate_headers(index: &RuleIndex, matched: &Matched, statuses: &[LimitStatus]) -> Headers {
        let entries = || matched.iter().map(|&p| &index.entries[p as usize]);
        let statuses = statuses.iter().map(|status| {
            let is_lease = entries()
                .find(|entry| entry.rule.name() == status.name)
                .is_some_and(|entry| entry.is_lease);
            (status, is_lease)
        });
        Shared::headers_with(index, matched, ratelimit_value(statuses))
    }

    fn refused(&self, index: &RuleIndex, matched: &Matched, denied: &Denied) -> Answer {
        for (status, &position) in denied.limits.iter().zip(matched) {
            let counters = &index.entries[position as usize].counters;
            // A limit with no unit left is one that refused (requests cost one unit).
            if status.remaining == 0 {
                bump(&counters.denied);
            }
        }
        let retry_after_ms = denied.retry_after.as_micros().div_ceil(1_000);
        // The server's wire format for a refusal (SPEC, HTTP API v1).
        let mut answer = Answer {
            status: StatusCode::TOO_MANY_REQUESTS,
            headers: Vec::new(),
            body: Bytes::from(format!(
                "{{\"error\":{{\"code\":\"rate_limited\",\"message\":\"too many requests; retry after {retry_after_ms} ms\"}},\"retry_after_ms\":{retry_after_ms}}}"
            )),
        };
        answer.headers = Shared::rate_headers(index, matched, &denied.limits).into_vec();
        answer.headers.push((
            http::header::RETRY_AFTER,
            retry_after_value(denied.retry_after),
        ));
        answer
    }

    fn failed(&self, error: &tollgate::Error) -> Option<Answer> {
        match error {
            tollgate::Error::TooManyKeys { keys_tracked_max } => {
                bump(&self.counters.too_many_keys);
                // Not the client's fault, and not a limit of theirs: a 503, so clients and
                // monitors treat it as the server's capacity problem it is.
                let mut answer = Answer::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too_many_keys",
                    &format!(
                        "the throttle tracks its maximum of {keys_tracked_max} keys; retry shortly"
                    ),
                );
                answer.headers.push((
                    http::header::RETRY_AFTER,
                    retry_after_value(TOO_MANY_KEYS_RETRY_AFTER),
                ));
                Some(answer)
            }
            tollgate::Error::InvalidRequest {
                field: "key",
                reason,
            } => Some(Answer::error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("the request's user identity is not usable: {reason}"),
            )),
            other => {
                bump(&self.counters.store_errors);
                tracing::warn!(error = %other, "throttle could not decide");
                match self.config.on_store_error {
                    OnStoreError::FailOpen => None,
                    OnStoreError::FailClosed => Some(Answer::error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "store_unavailable",
                        "the throttle cannot decide now; retry shortly",
                    )),
                }
            }
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Throttle<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // Each arm builds the future where it is returned: a state built first and wrapped
        // after is one more copy of the inner future, on every request.
        match self.shared.prepare(&request, self.peer.as_ref()) {
            Prepared::Pass => ResponseFuture {
                future: Some(self.inner.call(request)),
                extra: None,
                waiting: None,
            },
            Prepared::Settled(Settled::Call { extra }) => ResponseFuture {
                future: Some(self.inner.call(request)),
                extra,
                waiting: None,
            },
            Prepared::Settled(Settled::Answer(answer)) => ResponseFuture {
                future: None,
                extra: None,
                waiting: Some(Box::new(Waiting::Answered(answer.into_response()))),
            },
            Prepared::Acquire {
                acquire,
                index,
                matched,
            } => {
                // The service that was polled ready goes with the request; this one gets a
                // fresh clone that will be polled ready before its own next call.
                let ready = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, ready);
                ResponseFuture {
                    future: None,
                    extra: None,
                    waiting: Some(Box::new(Waiting::Acquiring {
                        acquire,
                        shared: Arc::clone(&self.shared),
                        index,
                        matched,
                        service: ready,
                        request,
                    })),
                }
            }
        }
    }
}

pin_project! {
    /// Decides, then calls the service with the grant held.
    ///
    /// Flat, with the rare states boxed aside: a request decided in `call` (every one, with an
    /// in-process store) moves the service's future and three empty fields once, and its poll
    /// is the service's poll and two tests. (An enum of states, or the three fields as one
    /// enum, measured more: the future is then built aside and copied in.)
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // The service's future, once the request is granted.
        #[pin]
        future: Option<S::Future>,
        // A lease to hold and fields to add, if any.
        extra: Option<Box<Extra>>,
        // Before the service is called: a decision still to await, or the layer's own answer.
        waiting: Option<Box<Waiting<S, ReqBody>>>,
    }
}

/// What an allowed response carries besides the service's own: boxed where it is carried,
/// since most responses carry neither (then one null pointer, tested once and dropped free).
/// A lease's box goes on into the response body, which holds it until the body ends.
#[derive(Debug, Default)]
pub(crate) struct Extra {
    /// A lease, held by the response body.
    permit: Option<Permit>,
    /// Added to the response.
    headers: Headers,
}

/// A `ResponseFuture` that has not called the service.
enum Waiting<S, ReqBody> {
    /// A remote store's decision, awaited before the service is called.
    Acquiring {
        acquire: Acquire,
        // Only a remote decision needs the shared state after `call`.
        shared: Arc<Shared>,
        index: Arc<RuleIndex>,
        matched: Matched,
        service: S,
        request: Request<ReqBody>,
    },
    /// The layer's own answer (a refusal, a failure, no user, an undecodable path).
    Answered(Response<Body>),
}

impl<S, ReqBody> std::fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    type Output = Result<Response<Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let Some(future) = this.future.as_mut().as_pin_mut() {
                let response = ready!(future.poll(cx))?;
                let Some(extra) = this.extra.take() else {
                    // The common answer: the response as the service made it.
                    return Poll::Ready(Ok(response.map(Body::new)));
                };
                let mut extra = extra;
                let (mut parts, body) = response.into_parts();
                for (name, value) in extra.headers.drain(..) {
                    parts.headers.insert(name, value);
                }
                // An axum body passes through as it is (`Body::new` boxes only another type);
                // only a lease needs a body of the layer's own around it, which keeps the
                // permit in the box it came in.
                let body = if extra.permit.is_some() {
                    Body::new(LeasedBody::new(body, extra))
                } else {
                    Body::new(body)
                };
                return Poll::Ready(Ok(Response::from_parts(parts, body)));
            }
            let Some(mut waiting) = this.waiting.take() else {
                // Only a poll that returns the response leaves neither a future nor a wait.
                unreachable!("ResponseFuture polled after completion");
            };
            let outcome = match &mut *waiting {
                Waiting::Acquiring { acquire, .. } => match acquire.as_mut().poll(cx) {
                    Poll::Ready(outcome) => outcome,
                    Poll::Pending => {
                        *this.waiting = Some(waiting);
                        return Poll::Pending;
                    }
                },
                Waiting::Answered(response) => return Poll::Ready(Ok(std::mem::take(response))),
            };
            let Waiting::Acquiring {
                shared,
                index,
                matched,
                mut service,
                request,
                ..
            } = *waiting
            else {
                unreachable!("an answer is returned above");
            };
            match shared.settle(&index, &matched, outcome) {
                Settled::Call { extra } => {
                    *this.extra = extra;
                    this.future.set(Some(service.call(request)));
                }
                Settled::Answer(answer) => return Poll::Ready(Ok(answer.into_response())),
            }
        }
    }
}
