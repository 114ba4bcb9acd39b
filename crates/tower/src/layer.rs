//! The middleware: `ThrottleLayer` holds the configuration and the state its services share,
//! `Throttle<S>` decides each request and calls the service it wraps, `ResponseFuture` awaits
//! what was not ready in `call` (a decision, the service's response).
//!
//! A request that matches no rule goes straight to the service. A matched one is decided by
//! the limiter in one all-or-nothing request (see the crate docs); the service is called only
//! when it is granted. A request one rule matches, with no lease to hold, is decided by that
//! rule's `LimitHandle` in `call` when the store answers at once. Any other is decided in one
//! future polled once in `call`, where an in-process store (the memory store) completes it; a
//! remote store's decision, the same future, is awaited in the response future.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use smallvec::SmallVec;
use tollgate::{
    COUNTERS_PER_REQUEST_MAX, Check, Denied, LimitStatus, Limiter, Outcome, Permit, Priority,
};
use tollgate_api::{Code, ErrorBody, ErrorDetail};
use tollgate_rules::{Ask, Matched, Positions};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::LeasedBody;
use crate::headers::{
    Member, RATELIMIT, RATELIMIT_POLICY, policy_value, ratelimit_members, ratelimit_value,
    retry_after_value,
};
use crate::identity::{Identity, Unidentified};
use crate::metrics::{LayerCounters, ThrottleMetrics, bump, read};
use crate::rules::{RuleIndex, RuleTracker, ThrottleRules};

/// What to do when the store cannot be reached. An explicit choice: there is no default. A
/// store that answered with a failure, and every other error, is answered 503 either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStoreError {
    /// Let the request through unthrottled while the store cannot be reached (availability
    /// over the limit).
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
        ThrottleLayer {
            shared: Arc::new(Shared {
                limiter,
                rules,
                config,
                counters: LayerCounters::default(),
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
        }
    }
}

/// A service whose matched requests are throttled.
#[derive(Clone, Debug)]
pub struct Throttle<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Throttle<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// A decision awaited in the response future.
type Decision = Pin<Box<dyn Future<Output = Settled> + Send>>;

/// A request, decided.
enum Settled {
    /// Call the service; its response gets `Extra` too.
    Call(Extra),
    /// The layer answers itself (a refusal, a failure, no user, an undecodable path).
    Answer(Response<Body>),
}

/// What an allowed response carries besides the service's own.
#[derive(Debug, Default)]
struct Extra {
    /// `RateLimit-Policy` and `RateLimit`, when allowed responses carry them.
    headers: HeaderMap,
    /// A concurrency lease, held by the response body until it ends or is dropped.
    permit: Option<Permit>,
}

impl Extra {
    fn apply<B>(self, response: Response<B>) -> Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let (mut parts, body) = response.into_parts();
        parts.headers.extend(self.headers);
        let body = match self.permit {
            Some(permit) => Body::new(LeasedBody::new(body, permit)),
            None => Body::new(body),
        };
        Response::from_parts(parts, body)
    }
}

/// What `call` found out about a request.
enum Prepared {
    Settled(Settled),
    /// Not decided on the first poll: awaited in the response future.
    Deciding(Decision),
}

/// The layer's own answer, as JSON: the wire contract's error body (`tollgate_api`), with
/// `retry_after_ms` beside it on a refusal.
fn error_response(
    status: StatusCode,
    code: Code,
    message: &str,
    retry_after_ms: Option<u64>,
) -> Response<Body> {
    let body = ErrorBody {
        error: ErrorDetail::new(code, message),
        retry_after_ms,
    };
    (status, Json(body)).into_response()
}

impl Shared {
    /// Matches the request's rules, names its user, and decides it here if the decision is
    /// ready on its first poll.
    fn prepare<B>(self: &Arc<Self>, request: &Request<B>) -> Prepared {
        let index = self.rules.index();
        let found = match index.matching_request(request) {
            Ok(found) => found,
            Err(error) => {
                bump(&self.counters.bad_path);
                return Prepared::Settled(Settled::Answer(error_response(
                    StatusCode::BAD_REQUEST,
                    Code::BadRequest,
                    &format!("path: {error}"),
                    None,
                )));
            }
        };
        let ask = found.ask();
        let Matched {
            positions: matched,
            per_user,
            ..
        } = found;
        if matched.is_empty() {
            bump(&self.counters.unmatched);
            return Prepared::Settled(Settled::Call(Extra::default()));
        }
        let key = if per_user {
            match self
                .config
                .identity
                .user_of(request.headers(), request.extensions())
            {
                Some(key) => Some(key),
                None => {
                    bump(&self.counters.unidentified);
                    match &self.config.unidentified {
                        Unidentified::SharedKey(key) => Some(Cow::Borrowed(key.as_str())),
                        Unidentified::Reject => {
                            return Prepared::Settled(Settled::Answer(error_response(
                                StatusCode::UNAUTHORIZED,
                                Code::Unauthorized,
                                "this endpoint is limited per user, and the request names no user",
                                None,
                            )));
                        }
                    }
                }
            }
        } else {
            None
        };
        // One rule with nothing to hold: its handle answers here when the store can (the
        // memory store), and asks nothing when it cannot.
        if let [position] = matched[..]
            && ask == Ask::Check
            && let Some(handle) = &index.entries[position as usize].handle
            && let Some(checked) = handle.check_now(key.as_deref(), 1, Priority::Normal)
        {
            return Prepared::Settled(self.settle_check(&index, &matched, checked));
        }
        let shared = Arc::clone(self);
        let key = key.map(Cow::into_owned);
        let mut decision: Decision =
            Box::pin(async move { shared.decide(&index, &matched, ask, key.as_deref()).await });
        // An in-process store answers on the first poll. A remote store's decision goes on in
        // the response future: the same future, so a request is never asked twice.
        match decision
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(settled) => Prepared::Settled(settled),
            Poll::Pending => Prepared::Deciding(decision),
        }
    }

    /// Asks the limiter for one unit of every matched rule's limit at once, keyed by `key`,
    /// and settles its answer. Without a lease among them nothing is held, so the limiter is
    /// asked for a `check`, which hands out no permit.
    async fn decide(
        &self,
        index: &RuleIndex,
        matched: &Positions,
        ask: Ask,
        key: Option<&str>,
    ) -> Settled {
        let names: SmallVec<[&str; COUNTERS_PER_REQUEST_MAX]> = matched
            .iter()
            .map(|&position| index.entries[position as usize].rule.name())
            .collect();
        // The layer never commits for a refund (a served request used its unit), so the store
        // need not record the reservation; leases are held and released as always.
        let mut request = tollgate::Request::all(&names).refundable(false);
        if let Some(key) = key {
            request = request.key(key);
        }
        match ask {
            Ask::Acquire => {
                let outcome = self.limiter.try_acquire(&request).await;
                self.settle(index, matched, outcome)
            }
            Ask::Check => {
                let checked = self.limiter.check(&request).await;
                self.settle_check(index, matched, checked)
            }
        }
    }

    /// What to do once the limiter has answered an acquire.
    fn settle(
        &self,
        index: &RuleIndex,
        matched: &Positions,
        outcome: tollgate::Result<Outcome>,
    ) -> Settled {
        match outcome {
            Ok(Outcome::Granted(permit)) => {
                let ratelimit = || lease_ratelimit(index, matched, &permit.limits());
                let headers = self.allowed(index, matched, ratelimit);
                // Only a lease needs holding; dropping a rate-only permit keeps its units
                // used, which is what a served request means.
                let permit = permit.fence().is_some().then_some(permit);
                Settled::Call(Extra { headers, permit })
            }
            Ok(Outcome::Denied(denied)) => Settled::Answer(self.refused(index, matched, &denied)),
            Err(error) => self.failed(&error),
        }
    }

    /// What to do once the limiter has answered a check: its statuses are in the rules' order.
    fn settle_check(
        &self,
        index: &RuleIndex,
        matched: &Positions,
        checked: tollgate::Result<Check>,
    ) -> Settled {
        match checked {
            Ok(Check::Allowed(statuses)) => {
                let ratelimit = || {
                    ratelimit_members(matched.iter().zip(&statuses).map(|(&position, status)| {
                        Member {
                            name: index.entries[position as usize].rule.name(),
                            remaining: status.remaining,
                            reset_after: status.reset_after,
                            is_lease: false,
                        }
                    }))
                };
                Settled::Call(Extra {
                    headers: self.allowed(index, matched, ratelimit),
                    permit: None,
                })
            }
            Ok(Check::Denied(denied)) => Settled::Answer(self.refused(index, matched, &denied)),
            Err(error) => self.failed(&error),
        }
    }

    /// Counts an allowed request on its rules; the fields for it, if allowed answers carry
    /// them (`ratelimit` gives the `RateLimit` value).
    fn allowed(
        &self,
        index: &RuleIndex,
        matched: &Positions,
        ratelimit: impl FnOnce() -> Option<HeaderValue>,
    ) -> HeaderMap {
        for &position in matched {
            bump(&index.entries[position as usize].counters.allowed);
        }
        if self.config.headers_on_allowed {
            rate_headers(index, matched, ratelimit())
        } else {
            HeaderMap::new()
        }
    }

    fn refused(&self, index: &RuleIndex, matched: &Positions, denied: &Denied) -> Response<Body> {
        for (status, &position) in denied.limits.iter().zip(matched) {
            // A limit with no unit left is one that refused (requests cost one unit).
            if status.remaining == 0 {
                bump(&index.entries[position as usize].counters.denied);
            }
        }
        let retry_after_ms =
            u64::try_from(denied.retry_after.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX);
        let mut response = error_response(
            StatusCode::TOO_MANY_REQUESTS,
            Code::RateLimited,
            &format!("too many requests; retry after {retry_after_ms} ms"),
            Some(retry_after_ms),
        );
        let headers = response.headers_mut();
        headers.extend(rate_headers(
            index,
            matched,
            lease_ratelimit(index, matched, &denied.limits),
        ));
        headers.insert(
            http::header::RETRY_AFTER,
            retry_after_value(denied.retry_after),
        );
        response
    }

    /// Not the client's fault, and not a limit of theirs: a 503, so clients and monitors
    /// treat it as the server's capacity problem it is.
    fn too_many_keys(&self, message: String) -> Settled {
        bump(&self.counters.too_many_keys);
        let mut response = error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::TooManyKeys,
            &message,
            None,
        );
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            retry_after_value(TOO_MANY_KEYS_RETRY_AFTER),
        );
        Settled::Answer(response)
    }

    fn failed(&self, error: &tollgate::Error) -> Settled {
        match error {
            tollgate::Error::TooManyKeys { keys_tracked_max } => self.too_many_keys(format!(
                "the throttle tracks its maximum of {keys_tracked_max} keys; retry shortly"
            )),
            tollgate::Error::TooManyKeysForLimit { limit, keys_max } => {
                self.too_many_keys(format!(
                    "the throttle tracks its maximum of {keys_max} keys for limit {limit:?}; \
                     retry shortly"
                ))
            }
            tollgate::Error::InvalidRequest {
                field: "key",
                reason,
            } => Settled::Answer(error_response(
                StatusCode::BAD_REQUEST,
                Code::BadRequest,
                &format!("the request's user identity is not usable: {reason}"),
                None,
            )),
            other => {
                bump(&self.counters.store_errors);
                tracing::warn!(error = %other, "throttle could not decide");
                match self.config.on_store_error {
                    // Only a store that cannot be reached: a caller may cause any other
                    // failure (filling the store), and must not get through by it.
                    OnStoreError::FailOpen if other.fails_open() => Settled::Call(Extra::default()),
                    _ => Settled::Answer(error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        Code::StoreUnavailable,
                        "the throttle cannot decide now; retry shortly",
                        None,
                    )),
                }
            }
        }
    }
}

/// `RateLimit-Policy` for the matched rules, and `ratelimit` as `RateLimit`.
fn rate_headers(
    index: &RuleIndex,
    matched: &Positions,
    ratelimit: Option<HeaderValue>,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let items = matched
        .iter()
        .map(|&position| index.entries[position as usize].policy_item.as_str());
    if let Some(value) = policy_value(items) {
        headers.insert(HeaderName::from_static(RATELIMIT_POLICY), value);
    }
    if let Some(value) = ratelimit {
        headers.insert(HeaderName::from_static(RATELIMIT), value);
    }
    headers
}

/// The `RateLimit` value of a permit's or a refusal's statuses, which name their limits.
fn lease_ratelimit(
    index: &RuleIndex,
    matched: &Positions,
    statuses: &[LimitStatus],
) -> Option<HeaderValue> {
    ratelimit_value(statuses.iter().map(|status| {
        let is_lease = matched
            .iter()
            .map(|&position| &index.entries[position as usize])
            .find(|entry| entry.rule.name() == status.name)
            .is_some_and(|entry| entry.is_lease);
        (status, is_lease)
    }))
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
        let state = match self.shared.prepare(&request) {
            Prepared::Settled(Settled::Call(extra)) => State::Called {
                future: self.inner.call(request),
                extra,
            },
            Prepared::Settled(Settled::Answer(response)) => State::Answered { response },
            Prepared::Deciding(decision) => {
                // The service that was polled ready goes with the request; this one gets a
                // fresh clone that will be polled ready before its own next call.
                let fresh = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, fresh);
                State::Deciding {
                    decision,
                    call: Some((ready, request)),
                }
            }
        };
        ResponseFuture { state }
    }
}

pin_project! {
    /// Decides, if that was not done in `call`, then calls the service and adds the layer's
    /// fields and lease to its response.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // Granted (or unmatched): the service's response, then what it carries besides.
        Called {
            #[pin]
            future: S::Future,
            extra: Extra,
        },
        // A decision still to await, and the service to call with the request if granted.
        Deciding {
            decision: Decision,
            call: Option<(S, Request<ReqBody>)>,
        },
        // The layer's own answer.
        Answered {
            response: Response<Body>,
        },
    }
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
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Called { future, extra } => {
                    let response = ready!(future.poll(cx))?;
                    return Poll::Ready(Ok(std::mem::take(extra).apply(response)));
                }
                StateProj::Deciding { decision, call } => {
                    let settled = ready!(decision.as_mut().poll(cx));
                    let Some((mut service, request)) = call.take() else {
                        unreachable!("ResponseFuture polled after completion");
                    };
                    match settled {
                        Settled::Call(extra) => state.set(State::Called {
                            future: service.call(request),
                            extra,
                        }),
                        Settled::Answer(response) => return Poll::Ready(Ok(response)),
                    }
                }
                StateProj::Answered { response } => {
                    return Poll::Ready(Ok(std::mem::take(response)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// The layer's answers are the server's error bodies, field for field and in order.
    #[tokio::test]
    async fn answers_are_the_server_s_error_bodies() {
        let body = |response: Response<Body>| async move {
            assert_eq!(response.headers()["content-type"], "application/json");
            let bytes = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let refused = error_response(
            StatusCode::TOO_MANY_REQUESTS,
            Code::RateLimited,
            "too many requests; retry after 5 ms",
            Some(5),
        );
        assert_eq!(
            body(refused).await,
            r#"{"error":{"code":"rate_limited","message":"too many requests; retry after 5 ms"},"retry_after_ms":5}"#
        );
        let failed = error_response(
            StatusCode::BAD_REQUEST,
            Code::BadRequest,
            "a \"quote\"\n",
            None,
        );
        assert_eq!(
            body(failed).await,
            r#"{"error":{"code":"bad_request","message":"a \"quote\"\n"}}"#
        );
    }
}
