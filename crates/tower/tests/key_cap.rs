//! The memory bound (G7) as the layer answers it: past the store's `keys_tracked_max`, a new
//! user gets a clear 503 `too_many_keys` while users already tracked carry on; idle counters
//! are swept and their room is given to new users. Also: the RateLimit fields can be left off
//! allowed responses.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate::{Limiter, LimiterConfig, ManualClock, MemoryStore, MemoryStoreConfig, PermitSecret};
use tollgate_rules::{RawRule, Rule, Validate};
use tollgate_tower::{
    Identity, OnStoreError, Throttle, ThrottleConfig, ThrottleLayer, ThrottleRules, Unidentified,
};
use tower::{Layer, Service, ServiceExt};

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

fn throttled(
    keys_tracked_max: u64,
    headers_on_allowed: bool,
) -> (
    Throttle<Handler>,
    ThrottleLayer,
    Arc<MemoryStore>,
    Arc<ManualClock>,
) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max,
            // The store-wide cap alone: these cases are about it.
            keys_per_limit_max: u64::MAX,
        },
        clock.clone(),
    ));
    let limiter = Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max: Duration::from_secs(1),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    let layer = ThrottleLayer::new(
        limiter,
        ThrottleRules::fixed([rule(
            "endpoint",
            r#"{"kind":"rate","limit":5,"period_ms":60000,"algorithm":"fixed","per":"user",
                "match":{"method":"*","path":"/api/#"}}"#,
        )])
        .expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::Header(http::HeaderName::from_static("x-user")),
            unidentified: Unidentified::SharedKey("anonymous".to_owned()),
            headers_on_allowed,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let handler: Handler = tower::service_fn(ok as fn(_) -> _);
    (layer.layer(handler), layer, store, clock)
}

async fn call(service: &mut Throttle<Handler>, user: Option<&str>) -> Response<axum::body::Body> {
    let mut request = Request::get("/api/1");
    if let Some(user) = user {
        request = request.header("x-user", user);
    }
    let request = request.body(String::new()).expect("valid request");
    service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("answered")
}

#[tokio::test]
async fn past_the_key_cap_new_users_get_a_clear_503_and_idle_keys_make_room() {
    let (mut service, _layer, store, clock) = throttled(2, true);
    assert_eq!(call(&mut service, Some("a")).await.status(), StatusCode::OK);
    assert_eq!(call(&mut service, Some("b")).await.status(), StatusCode::OK);
    let refused = call(&mut service, Some("c")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body = refused
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("\"too_many_keys\""), "{body}");
    assert!(body.contains("maximum of 2 keys"), "{body}");
    // Users already tracked are not affected.
    assert_eq!(call(&mut service, Some("a")).await.status(), StatusCode::OK);
    assert_eq!(store.len(), 2);

    // One period later both counters are idle; the sweep drops them and c gets in.
    clock.advance_us(60_000_001);
    assert_eq!(store.sweep(usize::MAX), 2);
    assert_eq!(store.len(), 0);
    assert_eq!(call(&mut service, Some("c")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn allowed_responses_may_go_without_the_fields_and_anonymous_users_share_a_key() {
    let (mut service, layer, store, _clock) = throttled(100, false);
    let allowed = call(&mut service, None).await;
    assert_eq!(allowed.status(), StatusCode::OK);
    assert!(allowed.headers().get("ratelimit").is_none());
    assert!(allowed.headers().get("ratelimit-policy").is_none());
    for _ in 0..4 {
        assert_eq!(call(&mut service, None).await.status(), StatusCode::OK);
    }
    // The sixth anonymous request shares the five units of the first five.
    let refused = call(&mut service, None).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.headers()["ratelimit"]
            .to_str()
            .ok()
            .map(|v| v.starts_with("\"endpoint\";r=0;t=")),
        Some(true)
    );
    assert_eq!(store.len(), 1);
    // Counted on the rule whether the fields went out or not.
    let metrics = layer.metrics();
    assert_eq!(metrics.rules.len(), 1);
    assert_eq!((metrics.rules[0].allowed, metrics.rules[0].denied), (5, 1));
}
