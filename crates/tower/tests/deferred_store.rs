//! Both places a decision completes: in `call` when the store answers on the first poll (the
//! memory store), and in the response future when it does not (a remote store). A store that
//! makes the layer wait for a decision exercises the second, as Redis does: every request must
//! be asked of the store once and counted once, leases released when the body ends. And what
//! the layer does when the store fails under it: a Redis that cannot be reached is let through
//! only by `FailOpen`, a Redis that answers with a failure never.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate::store::{Ask, Decision, Forward, Offers, Store, StoreFuture};
use tollgate::{Limiter, LimiterConfig, ManualClock, MemoryStore, MemoryStoreConfig, PermitSecret};
use tollgate_redis::{RedisStore, RedisStoreConfig};
use tollgate_rules::{RawRule, Rule, Validate};
use tollgate_tower::{
    Identity, OnStoreError, Throttle, ThrottleConfig, ThrottleLayer, ThrottleRules, Unidentified,
};
use tower::{Layer, Service, ServiceExt};

// The Redis store's tests' private Redis processes, started and stopped here too.
#[path = "../../redis/tests/nodes/mod.rs"]
mod nodes;

/// A store that counts the acquires asked of it and decided by it; with `yields`, every acquire
/// yields to the runtime once before deciding, as a remote store's round trip would.
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn Store>,
    yields: bool,
    /// Acquires polled at all: a remote store's request is on its way from the first poll.
    acquires_asked: AtomicU64,
    acquires_decided: AtomicU64,
}

impl Counted {
    fn new(inner: Arc<dyn Store>, yields: bool) -> Counted {
        Counted {
            inner,
            yields,
            acquires_asked: AtomicU64::new(0),
            acquires_decided: AtomicU64::new(0),
        }
    }
}

impl Forward for Counted {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        StoreFuture::boxed(async move {
            self.acquires_asked.fetch_add(1, Ordering::Relaxed);
            if self.yields {
                tokio::task::yield_now().await;
            }
            let decision = self.inner.acquire(ask).await;
            self.acquires_decided.fetch_add(1, Ordering::Relaxed);
            decision
        })
    }

    /// No in-process way: every decision is counted here, as a remote store makes them.
    fn offers(&self) -> Offers<'_> {
        Offers {
            in_process: None,
            ..self.inner.offers()
        }
    }

    /// A remote store that always answers.
    fn ping(&self) -> StoreFuture<'_, ()> {
        StoreFuture::ready(Ok(()))
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
    layer_with(store, OnStoreError::FailClosed).layer(handler())
}

fn handler() -> Handler {
    tower::service_fn(ok as fn(_) -> _)
}

fn layer_with(store: Arc<dyn Store>, on_store_error: OnStoreError) -> ThrottleLayer {
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_secs(1),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    ThrottleLayer::new(
        limiter,
        ThrottleRules::fixed([
            rule(
                "user-conc",
                r#"{"kind":"concurrency","limit":1,"lease_ttl_ms":60000,"per":"user",
                    "match":{"method":"*","path":"*"}}"#,
            ),
            rule(
                "endpoint",
                r#"{"kind":"rate","limit":3,"period_ms":60000,"algorithm":"sliding","per":"user",
                    "match":{"method":"GET","path":"/api/#"}}"#,
            ),
        ])
        .expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::Header(http::HeaderName::from_static("x-user")),
            unidentified: Unidentified::Reject,
            headers_on_allowed: false,
            on_store_error,
        },
    )
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

/// One request of `user` for `path`, read to the end (which releases its lease): its status.
async fn ask(service: &mut Throttle<Handler>, user: &str, path: &str) -> StatusCode {
    let request = Request::get(path)
        .header("x-user", user)
        .body(String::new())
        .expect("valid request");
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("infallible");
    let status = response.status();
    response.into_body().collect().await.expect("body");
    status
}

/// Five requests in a row, each read to the end (which releases its lease): three fit the
/// endpoint's rate, the other two are refused by it.
async fn five_in_a_row(service: &mut Throttle<Handler>) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for number in 0..5 {
        statuses.push(ask(service, "alice", &format!("/api/{number}")).await);
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
    let store = Arc::new(Counted::new(Arc::new(memory_store()), true));
    let mut service = throttled(store.clone());
    // Same answers as the in-process path, and the lease of each request came back when its
    // body ended.
    assert_eq!(five_in_a_row(&mut service).await, EXPECTED);
    // Each request asked once: the attempt begun in `call` is the one awaited, never
    // abandoned for a second (which a remote store would count twice).
    assert_eq!(store.acquires_asked.load(Ordering::Relaxed), 5);
    assert_eq!(store.acquires_decided.load(Ordering::Relaxed), 5);
}

/// A Redis store on `url` and `namespace`, declared new (nothing to recover).
async fn redis_store(url: &str, namespace: &str, fail_open: bool) -> RedisStore {
    let store = RedisStore::connect(RedisStoreConfig {
        url: url.to_owned(),
        namespace: namespace.to_owned(),
        fail_open,
        allow_eviction: false,
        module: tollgate_redis::Module::Auto,
        keys_per_limit_max: 100_000,
        // Short: a stopped Redis is found unreachable within it.
        timeout: Duration::from_secs(1),
    })
    .await
    .expect("connect to Redis");
    store
        .begin_new_namespace()
        .await
        .expect("declare the namespace new");
    store
}

fn namespace(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.subsec_nanos())
        .unwrap_or(0);
    format!("t-tower-{test}-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_is_decided_in_the_response_future_and_counted_in_redis() {
    let Ok(url) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(
            "a_redis_store_is_decided_in_the_response_future_and_counted_in_redis: \
             TOLLGATE_TEST_REDIS is unset",
        );
        return;
    };
    let namespace = namespace("deferred");
    let store = Arc::new(Counted::new(
        Arc::new(redis_store(&url, &namespace, false).await),
        false,
    ));
    let mut service = throttled(store.clone());
    assert_eq!(five_in_a_row(&mut service).await, EXPECTED);
    assert_eq!(store.acquires_asked.load(Ordering::Relaxed), 5);
    assert_eq!(store.acquires_decided.load(Ordering::Relaxed), 5);
    // Another process's layer on the same namespace: the endpoint's three units are spent in
    // Redis, and every lease came back (bob, on another key of both rules, is let through).
    let mut elsewhere = throttled(Arc::new(redis_store(&url, &namespace, false).await));
    assert_eq!(
        ask(&mut elsewhere, "alice", "/api/9").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(ask(&mut elsewhere, "bob", "/api/9").await, StatusCode::OK);
    assert_eq!(ask(&mut elsewhere, "alice", "/other").await, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_redis_under_the_layer_is_let_through_only_when_unreachable_and_fail_open() {
    let Some(binary) = nodes::redis_server(
        "a_failing_redis_under_the_layer_is_let_through_only_when_unreachable_and_fail_open",
    ) else {
        return;
    };
    let mut redis = nodes::Single::start(&binary, &[]);
    let url = redis.node.url();
    let namespace = namespace("fail");
    // The store itself fails closed: the layer's choice is what is tested.
    let store: Arc<dyn Store> = Arc::new(redis_store(&url, &namespace, false).await);
    let open_layer = layer_with(store.clone(), OnStoreError::FailOpen);
    let closed_layer = layer_with(store, OnStoreError::FailClosed);
    let mut open = open_layer.layer(handler());
    let mut closed = closed_layer.layer(handler());
    assert_eq!(ask(&mut open, "alice", "/api/1").await, StatusCode::OK);
    assert_eq!(ask(&mut closed, "alice", "/api/2").await, StatusCode::OK);

    // Out of memory: Redis answers with a failure, which no layer lets through.
    redis
        .node
        .query(&["CONFIG", "SET", "maxmemory", "1"])
        .expect("maxmemory set");
    for service in [&mut open, &mut closed] {
        assert_eq!(
            ask(service, "carol", "/api/1").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    redis
        .node
        .query(&["CONFIG", "SET", "maxmemory", "0"])
        .expect("maxmemory unset");

    // Unreachable: FailOpen lets requests through, beyond the endpoint's three; FailClosed
    // answers 503.
    redis.node.kill();
    for number in 0..4 {
        assert_eq!(
            ask(&mut open, "alice", &format!("/api/{number}")).await,
            StatusCode::OK,
            "request {number} through FailOpen"
        );
        assert_eq!(
            ask(&mut closed, "alice", &format!("/api/{number}")).await,
            StatusCode::SERVICE_UNAVAILABLE,
            "request {number} through FailClosed"
        );
    }
    // One failure out of memory and four unreachable, through each.
    for layer in [&open_layer, &closed_layer] {
        assert_eq!(layer.metrics().store_errors, 5);
    }
}
