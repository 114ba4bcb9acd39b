//! An axum service throttled as in the throttle-table scenario (docs/guarantees.md): rules in a
//! SQLite table that an administrator edits with plain SQL, the user from an authentication layer,
//! the chain per-user concurrency
//! -> per-user frequency -> endpoint rule, a cap on tracked counters, and a background sweep
//! that gives memory back when users go quiet. docs/inbound.md walks through it.
//!
//! `cargo run -p tollgate-tower --example axum_service -- [RULES_DB] [LISTEN]`, then
//! `curl -i -H 'Authorization: Bearer alice' http://127.0.0.1:3000/repo/v1/entity/123/bundle`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::StatusCode;
use tollgate::{
    Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, MonotonicClock, PermitSecret,
};
use tollgate_rules::{DEFAULT_TABLE, RawRule, Rules, SqlSource};
use tollgate_tower::{
    Identity, OnStoreError, ThrottleConfig, ThrottleLayer, Unidentified, spawn_sweeper,
};

/// The authenticated user, put in the request's extensions by `authenticate`.
#[derive(Clone, Debug)]
struct User(String);

/// Stand-in for real authentication: `Authorization: Bearer <user>` names the user.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|user| User(user.to_owned()));
    match user {
        Some(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        // Public paths (none here are throttled) still work without a user.
        None => next.run(request).await,
    }
}

/// The starting rules, written once to an empty table. From then on the table is the truth.
const SEED_RULES: [(&str, &str); 3] = [
    (
        "user-concurrency",
        r#"{"kind":"concurrency","limit":4,"lease_ttl_ms":60000,"per":"user",
            "match":{"method":"*","path":"*"}}"#,
    ),
    (
        "user-frequency",
        r#"{"kind":"rate","limit":600,"period_ms":60000,"algorithm":"fixed","per":"user",
            "match":{"method":"*","path":"*"}}"#,
    ),
    // An endpoint throttle row (docs/inbound.md, *The rules*): normalized URI, max calls, period.
    (
        "entity-bundle",
        r#"{"kind":"rate","limit":10,"period_ms":60000,"algorithm":"fixed","per":"user",
            "match":{"method":"GET","path":"/repo/v1/entity/#/bundle"}}"#,
    ),
];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let database = args
        .next()
        .unwrap_or_else(|| "inbound-example.db".to_owned());
    let listen: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned())
        .parse()?;

    // G7: at most a million counters; past it, new users get a 503 `too_many_keys`.
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000_000,
            keys_per_limit_max: 1_000_000,
        },
        Arc::new(MonotonicClock::new()),
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
    // Counters of users who went quiet are dropped within a few seconds of going idle.
    let _sweeper = spawn_sweeper(&store, Duration::from_secs(1), 4096);

    let source = SqlSource::connect(&format!("sqlite://{database}"), DEFAULT_TABLE).await?;
    let rules = Rules::start(source, limiter).await?;
    if rules.snapshot().is_empty() {
        for (name, json) in SEED_RULES {
            let raw: RawRule = serde_json::from_str(json)?;
            rules.put(name, &raw).await?;
        }
    }
    // An administrator's `UPDATE tollgate_limits SET limit_units = 20 WHERE name =
    // 'entity-bundle'` is in force within this interval.
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let _reloader = rules.spawn_reloader(Duration::from_secs(2), stop);

    let throttle = ThrottleLayer::from_sql(
        rules,
        ThrottleConfig {
            identity: Identity::principal(|extensions| {
                extensions.get::<User>().map(|user| user.0.as_str())
            }),
            unidentified: Unidentified::Reject,
            headers_on_allowed: true,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let metrics_layer = throttle.clone();

    let app = Router::new()
        .route(
            "/repo/v1/entity/{id}/bundle",
            get(|Path(id): Path<u64>| async move { format!("bundle of {id}\n") }),
        )
        .route(
            "/repo/v1/entity/{id}",
            get(|Path(id): Path<u64>| async move { format!("entity {id}\n") }),
        )
        .layer(throttle)
        // Outermost, so it runs first and the throttle sees the principal.
        .layer(axum::middleware::from_fn(authenticate))
        // Not throttled: added after the layer, so outside it.
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics_layer.metrics();
                async move { (StatusCode::OK, format!("{metrics:#?}\n")).into_response() }
            }),
        );

    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("listening on http://{listen}; rules in {database}");
    // The connection info lets `Identity::Peer` see the socket peer; harmless otherwise.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
