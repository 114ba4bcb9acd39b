//! Both places a decision completes: in `call` when the store answers on the first poll (the
//! memory store), and in the response future when it does not (a remote store). A store that
//! makes the layer wait for a decision exercises the second: every request must be asked of
//! the store once and counted once, leases released when the body ends.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate::store::{Decision, Renewed, Store, StoreFuture, Take};
use tollgate::{
    Committed, Limiter, LimiterConfig, ManualClock, MemoryStore, MemoryStoreConfig, PermitSecret,
    Priority,
};
use tollgate_rules::{RawRule, Rule};
use tollgate_tower::{
    Identity, OnStoreError, Throttle, ThrottleConfig, ThrottleLayer, ThrottleRules, Unidentified,
};
use tower::{Layer, Service, ServiceExt};

/// The memory store, but every acquire yields to the runtime once before deciding, as a remote
/// store's round trip would.
#[derive(Debug)]
struct Deferred {
    inner: MemoryStore,
    /// Acquires polled at all: a remote store's request is on its way from the first poll.
    acquires_asked: AtomicU64,
    acquires_decided: AtomicU64,
}

impl Store for Deferred {
    fn acquire<'a>(
        &'a self,
        takes: &'a [Take<'a>],
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> StoreFuture<'a, Decision> {
        StoreFuture::boxed(async move {
            self.acquires_asked.fetch_add(1, Ordering::Relaxed);
            tokio::task::yield_now().await;
            self.acquires_decided.fetch_add(1, Ordering::Relaxed);
            self.inner.acquire(takes, cost, priority, refundable).await
        })
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        self.inner.commit(take, seq, used)
    }

    fn renew<'a>(&'a self, take: Take<'a>, fence: u64) -> StoreFuture<'a, Renewed> {
        self.inner.renew(take, fence)
    }

    fn pause<'a>(&'a self, take: Take<'a>, duration_us: u64) -> StoreFuture<'a, u64> {
        self.inner.pause(take, duration_us)
    }

    fn resume<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, bool> {
        self.inner.resume(take)
    }

    fn usage<'a>(&'a self, take: Take<'a>) -> StoreFuture<'a, tollgate::store::Usage> {
        self.inner.usage(take)
    }
}

fn rule(name: &str, json: &str) -> Rule {
    let raw: RawRule = serde_json::from_str(json).expect("test rule parses");
    raw.validate(name).expect("test rule is valid")
}

type Handler = tower::util::ServiceFn<
    fn(Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>>,
>;

fn ok(_: Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>> {
    std::future::ready(Ok(Response::new(String::from("ok"))))
}

fn throttled(store: Arc<dyn Store>) -> Throttle<Handler> {
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_secs(1),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    let layer = ThrottleLayer::new(
        limiter,
        ThrottleRules::fixed([
            rule(
                "user-conc",
                r#"{"kind":"concurrency","limit":1,"lease_ttl_ms":60000,"per":"user",
                    "match":{"method":"*","path":"*"}}"#,
            ),
            rule(
                "endpoint",
                r#"{"kind":"rate","limit":3,"period_ms":60000,"algorithm":"fixed","per":"user",
                    "match":{"method":"GET","path":"/api/#"}}"#,
            ),
        ])
        .expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::Header(http::HeaderName::from_static("x-user")),
            unidentified: Unidentified::Reject,
            headers_on_allowed: false,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let handler: Handler = tower::service_fn(ok as fn(_) -> _);
    layer.layer(handler)
}

fn memory_store() -> MemoryStore {
    MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000,
            keys_per_limit_max: 1_000,
        },
        Arc::new(ManualClock::new(1_000_000)),
    )
}

/// Five requests in a row, each read to the end (which releases its lease): three fit the
/// endpoint's rate, the other two are refused by it.
async fn five_in_a_row(service: &mut Throttle<Handler>) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for number in 0..5 {
        let request = Request::get(format!("/api/{number}"))
            .header("x-user", "alice")
            .body(String::new())
            .expect("valid request");
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("infallible");
        statuses.push(response.status());
        response.into_body().collect().await.expect("body");
    }
    statuses
}

const EXPECTED: [StatusCode; 5] = [
    StatusCode::OK,
    StatusCode::OK,
    StatusCode::OK,
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::TOO_MANY_REQUESTS,
];

#[tokio::test]
async fn a_store_that_answers_at_once_is_decided_in_call() {
    let mut service = throttled(Arc::new(memory_store()));
    assert_eq!(five_in_a_row(&mut service).await, EXPECTED);
}

#[tokio::test]
async fn a_store_that_makes_the_layer_wait_is_decided_in_the_response_future() {
    let store = Arc::new(Deferred {
        inner: memory_store(),
        acquires_asked: AtomicU64::new(0),
        acquires_decided: AtomicU64::new(0),
    });
    let mut service = throttled(store.clone());
    // Same answers as the in-process path, and the lease of each request came back when its
    // body ended.
    assert_eq!(five_in_a_row(&mut service).await, EXPECTED);
    // Each request asked once: the attempt begun in `call` is the one awaited, never
    // abandoned for a second (which a remote store would count twice).
    assert_eq!(store.acquires_asked.load(Ordering::Relaxed), 5);
    assert_eq!(store.acquires_decided.load(Ordering::Relaxed), 5);
}
