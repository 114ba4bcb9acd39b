//! The endpoint throttle table (docs/inbound.md, *The rules*) as Tollgate rules in the rules
//! crate's SQLite source: rows written by an administrator with plain SQL (normalized URI, max
//! calls, period in seconds) become `fixed` limits counted per user with a `match`, and an edit
//! applies within the reload interval.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use http::{Request, Response, StatusCode};
use sqlx::SqlitePool;
use sqlx::sqlite::SqlitePoolOptions;
use tollgate::Limiter;
use tollgate_rules::{DEFAULT_TABLE, Rules, SqlSource};
use tollgate_tower::{
    Identity, OnStoreError, ThrottleConfig, ThrottleLayer, TrustedProxies, Unidentified,
};
use tower::{Layer, Service, ServiceExt};

/// A throttle-table row as an administrator would insert it into Tollgate's rules table.
fn seed_row(name: &str, normalized_uri: &str, max_calls: u32, period_seconds: u32) -> String {
    format!(
        "INSERT INTO {DEFAULT_TABLE} (name, kind, limit_units, period_ms, algorithm, per, \
         match_method, match_path) VALUES ('{name}', 'rate', {max_calls}, {}, 'fixed', 'user', \
         '*', '{normalized_uri}')",
        u64::from(period_seconds) * 1000
    )
}

/// The rules table in a fresh SQLite file (its directory, removed when dropped), and an
/// administrator's connection to it.
async fn rules_database() -> (tempfile::TempDir, SqlSource, SqlitePool) {
    let directory = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", directory.path().join("rules.db").display());
    let source = SqlSource::connect(&url, DEFAULT_TABLE)
        .await
        .expect("rules database");
    let admin = SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("administrator's connection");
    (directory, source, admin)
}

/// A handler answering "ok" behind a layer over `rules`, and the layer.
fn throttled(
    rules: &Rules,
    identity: Identity,
    headers_on_allowed: bool,
) -> (
    ThrottleLayer,
    impl Service<Request<String>, Response = Response<axum::body::Body>, Error = Infallible>,
) {
    let layer = ThrottleLayer::from_sql(
        rules.clone(),
        ThrottleConfig {
            identity,
            unidentified: Unidentified::Reject,
            headers_on_allowed,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let handler = tower::service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    });
    let service = layer.layer(handler);
    (layer, service)
}

async fn status_of<S>(service: &mut S, user: &str, path: &str) -> StatusCode
where
    S: Service<Request<String>, Response = Response<axum::body::Body>>,
    S::Error: std::fmt::Debug,
{
    let request = Request::get(path)
        .header("x-user", user)
        .body(String::new())
        .expect("valid request");
    status_for(service, request).await
}

async fn status_for<S>(service: &mut S, request: Request<String>) -> StatusCode
where
    S: Service<Request<String>, Response = Response<axum::body::Body>>,
    S::Error: std::fmt::Debug,
{
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("answered");
    response.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrators_sql_edit_applies_within_the_reload_interval() {
    let (_directory, source, admin) = rules_database().await;
    sqlx::query(&seed_row(
        "entity-bundle",
        "/repo/v1/entity/#/bundle",
        2,
        3600,
    ))
    .execute(&admin)
    .await
    .expect("insert");

    let rules = Rules::start(source, Limiter::in_memory())
        .await
        .expect("rules load");
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let interval = Duration::from_millis(100);
    let _reloader = rules.spawn_reloader(interval, stop);
    // Behind an authenticating proxy that sets the header.
    let identity = Identity::Header(http::HeaderName::from_static("x-user"));
    let (layer, mut service) = throttled(&rules, identity, true);

    let bundle = "/repo/v1/entity/42/bundle";
    assert_eq!(status_of(&mut service, "u1", bundle).await, StatusCode::OK);
    assert_eq!(status_of(&mut service, "u1", bundle).await, StatusCode::OK);
    assert_eq!(
        status_of(&mut service, "u1", bundle).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Not yet throttled: no row for it.
    for _ in 0..3 {
        assert_eq!(
            status_of(&mut service, "u1", "/repo/v1/entity/42/acl").await,
            StatusCode::OK
        );
    }

    // The administrator raises the bundle limit and throttles the ACL endpoint, in plain SQL.
    sqlx::query(&format!(
        "UPDATE {DEFAULT_TABLE} SET limit_units = 5 WHERE name = 'entity-bundle'"
    ))
    .execute(&admin)
    .await
    .expect("update");
    sqlx::query(&seed_row("entity-acl", "/repo/v1/entity/#/acl", 1, 3600))
        .execute(&admin)
        .await
        .expect("insert");

    // Generous bound: the reload interval is 100 ms; allow 50 times that.
    let applied = tokio::time::timeout(interval * 50, async {
        loop {
            if rules.snapshot().get("entity-acl").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(applied.is_ok(), "the edit applied within the bound");

    // Counters survive the reload: 2 of the now 5 bundle calls are spent.
    for _ in 0..3 {
        assert_eq!(status_of(&mut service, "u1", bundle).await, StatusCode::OK);
    }
    assert_eq!(
        status_of(&mut service, "u1", bundle).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status_of(&mut service, "u1", "/repo/v1/entity/7/acl").await,
        StatusCode::OK
    );
    assert_eq!(
        status_of(&mut service, "u1", "/repo/v1/entity/8/acl").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status_of(&mut service, "u2", "/repo/v1/entity/8/acl").await,
        StatusCode::OK
    );

    let metrics = layer.metrics();
    let acl = metrics
        .rules
        .iter()
        .find(|rule| rule.rule == "entity-acl")
        .expect("acl metrics");
    assert_eq!((acl.allowed, acl.denied), (2, 1));
}

/// Requests counted under their peer's address, by a GCRA rule: every connection of one
/// client counts on the client's one counter in the store, through an edit of the rule and
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_s_connections_count_on_one_counter_through_an_edit_of_its_rule() {
    let (_directory, source, admin) = rules_database().await;
    let insert = |name: &str, path: &str, limit: u32| {
        format!(
            "INSERT INTO {DEFAULT_TABLE} (name, kind, limit_units, period_ms, algorithm, per, \
             match_method, match_path) VALUES ('{name}', 'rate', {limit}, 3600000, 'gcra', \
             'user', '*', '{path}')"
        )
    };
    for (name, path, limit) in [("client-a", "/a", 2), ("client-b", "/b", 1)] {
        sqlx::query(&insert(name, path, limit))
            .execute(&admin)
            .await
            .expect("insert");
    }
    let limiter = Limiter::in_memory();
    let rules = Rules::start(source, limiter.clone())
        .await
        .expect("rules load");
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let interval = Duration::from_millis(100);
    let _reloader = rules.spawn_reloader(interval, stop);
    let (_layer, mut service) = throttled(&rules, Identity::peer(TrustedProxies::none()), false);
    // Two connections of one client, as a server gives them: the socket address of its
    // connection in every request.
    let first: SocketAddr = "192.0.2.7:40000".parse().expect("address");
    let second = SocketAddr::new(first.ip(), 40001);
    let mut status = async |peer: &SocketAddr, path: &str| {
        let mut request = Request::get(path)
            .body(String::new())
            .expect("valid request");
        request.extensions_mut().insert(ConnectInfo(*peer));
        status_for(&mut service, request).await
    };

    // Both rules on one connection (its first handle, then another), then the other's turn.
    assert_eq!(status(&first, "/a").await, StatusCode::OK);
    assert_eq!(status(&first, "/b").await, StatusCode::OK);
    assert_eq!(status(&first, "/b").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(&second, "/a").await, StatusCode::OK);
    assert_eq!(status(&first, "/a").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(&second, "/b").await, StatusCode::TOO_MANY_REQUESTS);
    let by_store = tollgate::Request::new("client-a").key("192.0.2.7");
    assert!(
        !limiter
            .check(&by_store)
            .await
            .expect("decides")
            .is_allowed(),
        "the store counted both connections' grants on the client's one counter"
    );

    // The administrator gives /a five an hour: the new rule counts from the two units
    // already spent.
    sqlx::query(&format!(
        "UPDATE {DEFAULT_TABLE} SET limit_units = 5, burst = 5 WHERE name = 'client-a'"
    ))
    .execute(&admin)
    .await
    .expect("update");
    let applied = tokio::time::timeout(interval * 50, async {
        loop {
            let raised = rules
                .snapshot()
                .get("client-a")
                .is_some_and(|rule| rule.limit().policy().capacity() == 5);
            if raised {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(applied.is_ok(), "the edit applied within the bound");
    let mut allowed = 0;
    for peer in [&first, &second, &first, &second, &first, &second] {
        if status(peer, "/a").await == StatusCode::OK {
            allowed += 1;
        }
    }
    assert_eq!(
        allowed, 3,
        "five an hour, two of them spent before the edit"
    );
    assert_eq!(status(&second, "/b").await, StatusCode::TOO_MANY_REQUESTS);
}
