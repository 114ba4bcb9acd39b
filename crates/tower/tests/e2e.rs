//! End-to-end tests of the layer in front of a real axum server on a loopback socket: limits
//! per user and per endpoint, the answer's fields, the chain's atomicity, leases given back
//! when a client disconnects mid-response, identity headers a client cannot forge,
//! keep-alive connections of one client sharing its counter, an IPv6 client counted by its
//! /64, HEAD held to the rules on GET, and paths read as the router behind reads them.
//!
//! Limits have periods of an hour, so counts never depend on timing; waits have generous
//! timeouts and only bound how long a correct result may take to appear.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::routing::get;
use bytes::Bytes;
use http_body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::{
    Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, MonotonicClock, PermitSecret,
};
use tollgate_rules::{RawRule, Rule, Validate};
use tollgate_tower::{
    Identity, OnStoreError, ThrottleConfig, ThrottleLayer, ThrottleRules, TrustedProxies,
    Unidentified,
};

/// The authenticated user, as an authentication layer would store it.
#[derive(Clone, Debug)]
struct User(String);

fn rule(name: &str, json: &str) -> Rule {
    let raw: RawRule = serde_json::from_str(json).expect("test rule parses");
    raw.validate(name).expect("test rule is valid")
}

/// The endpoint throttle chain (docs/inbound.md, *The rules*): per-user concurrency, per-user
/// frequency, then the endpoint rule.
fn throttle_table_rules() -> Vec<Rule> {
    vec![
        rule(
            "user-conc",
            r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":3600000,"per":"user",
                "match":{"method":"*","path":"*"}}"#,
        ),
        rule(
            "user-freq",
            r#"{"kind":"rate","limit":100,"period_ms":3600000,"algorithm":"fixed","per":"user",
                "match":{"method":"*","path":"*"}}"#,
        ),
        rule(
            "entity-bundle",
            r#"{"kind":"rate","limit":3,"period_ms":3600000,"algorithm":"fixed","per":"user",
                "match":{"method":"GET","path":"/repo/v1/entity/#/bundle"}}"#,
        ),
    ]
}

/// A body that sends a chunk every few milliseconds and never ends: a long download.
struct Endless {
    ticker: tokio::time::Interval,
}

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.ticker.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk\n"))))),
            Poll::Pending => Poll::Pending,
        }
    }
}

async fn authenticate(mut request: Request, next: Next) -> axum::response::Response {
    let user = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|user| User(user.to_owned()));
    if let Some(user) = user {
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

fn app(layer: ThrottleLayer) -> Router {
    routes()
        .layer(layer)
        // Outermost: authentication runs first and hands the throttle its principal.
        .layer(axum::middleware::from_fn(authenticate))
}

/// The service's handlers.
fn routes() -> Router {
    Router::new()
        .route("/repo/v1/entity/{id}/bundle", get(|| async { "bundle" }))
        .route("/repo/v1/entity/{id}", get(|| async { "entity" }))
        .route("/health", get(|| async { "ok" }))
        .route(
            "/download",
            get(|| async {
                Body::new(Endless {
                    ticker: tokio::time::interval(Duration::from_millis(5)),
                })
            }),
        )
}

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let address = listener.local_addr().expect("local address");
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    address
}

fn principal_layer(limiter: &Limiter, rules: Vec<Rule>) -> ThrottleLayer {
    ThrottleLayer::new(
        limiter.clone(),
        ThrottleRules::fixed(rules).expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::principal(|extensions| {
                extensions.get::<User>().map(|user| user.0.as_str())
            }),
            unidentified: Unidentified::Reject,
            headers_on_allowed: true,
            on_store_error: OnStoreError::FailClosed,
        },
    )
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The `r` parameter of `limit`'s member of the `RateLimit` field.
    fn remaining(&self, limit: &str) -> Option<u64> {
        let field = self.header("ratelimit")?;
        let member = field
            .split(", ")
            .find(|member| member.starts_with(&format!("\"{limit}\";")))?;
        member
            .split(';')
            .find_map(|param| param.strip_prefix("r="))
            .and_then(|r| r.parse().ok())
    }
}

/// One HTTP/1.1 GET on a fresh connection, read to the end.
async fn send(address: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    send_as(address, "GET", path, headers).await
}

/// One HTTP/1.1 request with `method` on a fresh connection, read to the end.
async fn send_as(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let mut text = format!("{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    stream.write_all(text.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("answer within 10 s")
        .expect("read");
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn bearer(user: &str) -> String {
    format!("Bearer {user}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_apply_per_user_and_endpoint_with_the_draft_fields() {
    let limiter = Limiter::in_memory();
    let address = serve(app(principal_layer(&limiter, throttle_table_rules()))).await;
    let alice = bearer("alice");
    let auth = [("authorization", alice.as_str())];

    let first = send(address, "/repo/v1/entity/123/bundle", &auth).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(
            "\"user-conc\";q=2;qu=\"concurrent-requests\", \"user-freq\";q=100;w=3600, \
             \"entity-bundle\";q=3;w=3600"
        )
    );
    assert_eq!(first.remaining("user-conc"), Some(1));
    assert_eq!(first.remaining("user-freq"), Some(99));
    assert_eq!(first.remaining("entity-bundle"), Some(2));
    let ratelimit = first
        .header("ratelimit")
        .expect("RateLimit on allowed responses");
    assert!(
        ratelimit.starts_with("\"user-conc\";r=1, \"user-freq\";r=99;t="),
        "{ratelimit}"
    );

    // Ids and query strings normalize away: these are the same endpoint.
    for path in [
        "/repo/v1/entity/456/bundle?mask=1",
        "/repo/v1/entity/0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00/bundle",
    ] {
        let answer = send(address, path, &auth).await;
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
    }
    let refused = send(address, "/repo/v1/entity/789/bundle", &auth).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    let retry_after: u64 = refused
        .header("retry-after")
        .and_then(|value| value.parse().ok())
        .expect("Retry-After in whole seconds");
    assert!((1..=3600).contains(&retry_after), "{retry_after}");
    assert_eq!(refused.remaining("entity-bundle"), Some(0));
    assert!(refused.header("ratelimit-policy").is_some());
    assert!(
        refused.body.contains("\"rate_limited\""),
        "{}",
        refused.body
    );

    // Another endpoint, and another user, are not affected.
    let entity = send(address, "/repo/v1/entity/789", &auth).await;
    assert_eq!(entity.status, 200, "{entity:?}");
    assert_eq!(entity.remaining("entity-bundle"), None);
    let bob = bearer("bob");
    let bobs = send(
        address,
        "/repo/v1/entity/789/bundle",
        &[("authorization", bob.as_str())],
    )
    .await;
    assert_eq!(bobs.status, 200, "{bobs:?}");
    assert_eq!(bobs.remaining("entity-bundle"), Some(2));

    // Without a user, a per-user endpoint is refused rather than counted under nobody.
    let anonymous = send(address, "/repo/v1/entity/1/bundle", &[]).await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_endpoint_rule_refuses_spends_nothing_else() {
    let limiter = Limiter::in_memory();
    let address = serve(app(principal_layer(&limiter, throttle_table_rules()))).await;
    let carol = bearer("carol");
    let auth = [("authorization", carol.as_str())];
    for _ in 0..3 {
        assert_eq!(
            send(address, "/repo/v1/entity/1/bundle", &auth)
                .await
                .status,
            200
        );
    }
    for _ in 0..5 {
        assert_eq!(
            send(address, "/repo/v1/entity/1/bundle", &auth)
                .await
                .status,
            429
        );
    }
    // 3 granted bundles and this request: 4 units of the user's frequency, not 9.
    let other = send(address, "/repo/v1/entity/1", &auth).await;
    assert_eq!(other.status, 200);
    assert_eq!(other.remaining("user-freq"), Some(96), "{other:?}");
    // And every refused request gave back its concurrency lease at once.
    assert_eq!(other.remaining("user-conc"), Some(1), "{other:?}");
}

/// Without the concurrency link nothing is held per request, and the layer decides without a
/// permit (`Limiter::check`): the same limits, fields and atomicity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_rates_alone_is_enforced_the_same() {
    let limiter = Limiter::in_memory();
    let rates: Vec<Rule> = throttle_table_rules().into_iter().skip(1).collect();
    let address = serve(app(principal_layer(&limiter, rates))).await;
    let dave = bearer("dave");
    let auth = [("authorization", dave.as_str())];
    for expected in [2, 1, 0] {
        let answer = send(address, "/repo/v1/entity/1/bundle", &auth).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(
            answer.remaining("entity-bundle"),
            Some(expected),
            "{answer:?}"
        );
        assert_eq!(
            answer.header("ratelimit-policy"),
            Some("\"user-freq\";q=100;w=3600, \"entity-bundle\";q=3;w=3600")
        );
        let ratelimit = answer.header("ratelimit").expect("RateLimit on allowed");
        assert!(
            ratelimit.starts_with(&format!("\"user-freq\";r={};t=", 99 - (2 - expected))),
            "{ratelimit}"
        );
    }
    let refused = send(address, "/repo/v1/entity/1/bundle", &auth).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.remaining("entity-bundle"), Some(0));
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
    // The refused request took nothing from the user's frequency.
    let other = send(address, "/repo/v1/entity/1", &auth).await;
    assert_eq!(other.status, 200);
    assert_eq!(other.remaining("user-freq"), Some(96), "{other:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_response_gives_its_lease_back() {
    let limiter = Limiter::in_memory();
    let address = serve(app(principal_layer(&limiter, throttle_table_rules()))).await;
    let dave = bearer("dave");
    // Dave's leases of the concurrency limit in use now, read without taking one.
    let held = |limiter: &Limiter| {
        let limiter = limiter.clone();
        async move {
            let usage = limiter.usage("user-conc", Some("dave")).await;
            usage.expect("usage").used
        }
    };
    // Two downloads in flight hold both of dave's leases.
    let mut downloads = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        let text = format!("GET /download HTTP/1.1\r\nhost: test\r\nauthorization: {dave}\r\n\r\n");
        stream.write_all(text.as_bytes()).await.expect("write");
        let mut first = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut first))
            .await
            .expect("the download starts within 10 s")
            .expect("read");
        assert!(String::from_utf8_lossy(&first[..read]).starts_with("HTTP/1.1 200"));
        downloads.push(stream);
    }
    assert_eq!(
        held(&limiter).await,
        2,
        "both leases are held during the downloads"
    );
    let third = send(address, "/health", &[("authorization", dave.as_str())]).await;
    assert_eq!(third.status, 429, "{third:?}");

    drop(downloads);
    // Both: each connection's lease comes back on its own, when its task sees it gone.
    let released = tokio::time::timeout(Duration::from_secs(10), async {
        while held(&limiter).await > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        released.is_ok(),
        "leases come back once the clients are gone"
    );
    let after = send(address, "/health", &[("authorization", dave.as_str())]).await;
    assert_eq!(after.status, 200, "{after:?}");
    assert_eq!(after.remaining("user-conc"), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_headers_sent_by_clients_are_ignored() {
    // The principal comes from authentication; a forged user header changes nothing.
    let limiter = Limiter::in_memory();
    let address = serve(app(principal_layer(&limiter, throttle_table_rules()))).await;
    let erin = bearer("erin");
    for forged in ["mallory-1", "mallory-2", "mallory-3", "mallory-4"] {
        let headers = [
            ("authorization", erin.as_str()),
            ("x-user", forged),
            ("x-forwarded-for", "1.2.3.4"),
        ];
        let answer = send(address, "/repo/v1/entity/5/bundle", &headers).await;
        let expected = if forged == "mallory-4" { 429 } else { 200 };
        assert_eq!(answer.status, expected, "{forged}: {answer:?}");
    }

    // By socket peer. With no trusted proxy: X-Forwarded-For and Forwarded are not believed.
    let limiter = Limiter::in_memory();
    let layer = ThrottleLayer::new(
        limiter.clone(),
        ThrottleRules::fixed(throttle_table_rules()).expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::peer(TrustedProxies::none()),
            unidentified: Unidentified::Reject,
            headers_on_allowed: true,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let address = serve(app(layer)).await;
    for (index, forged) in ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
        .iter()
        .enumerate()
    {
        let forwarded = format!("for={forged}");
        let headers = [
            ("x-forwarded-for", *forged),
            ("forwarded", forwarded.as_str()),
        ];
        let answer = send(address, "/repo/v1/entity/5/bundle", &headers).await;
        let expected = if index == 3 { 429 } else { 200 };
        assert_eq!(answer.status, expected, "{forged}: {answer:?}");
    }
    let by_peer = tollgate::Request::new("entity-bundle").key("127.0.0.1");
    let outcome = limiter.try_acquire(&by_peer).await.expect("decides");
    assert!(
        !outcome.is_granted(),
        "all four were counted under the peer's address"
    );

    // Behind a trusted proxy (the loopback peer), the nearest untrusted hop is the client.
    let limiter = Limiter::in_memory();
    let layer = ThrottleLayer::new(
        limiter.clone(),
        ThrottleRules::fixed(throttle_table_rules()).expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::peer(TrustedProxies::parse(["127.0.0.0/8"]).expect("valid")),
            unidentified: Unidentified::Reject,
            headers_on_allowed: true,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let address = serve(app(layer)).await;
    for forged in ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"] {
        let chain = format!("{forged}, 198.51.100.7");
        let answer = send(
            address,
            "/repo/v1/entity/5/bundle",
            &[("x-forwarded-for", &chain)],
        )
        .await;
        let expected = if forged == "4.4.4.4" { 429 } else { 200 };
        assert_eq!(answer.status, expected, "{forged}: {answer:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_paths_pass_through_untouched() {
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000,
            keys_per_limit_max: 1_000,
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
    let endpoint_only: Vec<Rule> = throttle_table_rules()
        .into_iter()
        .filter(|rule| rule.name() == "entity-bundle")
        .collect();
    let layer = principal_layer(&limiter, endpoint_only);
    let address = serve(app(layer.clone())).await;
    for _ in 0..10 {
        let answer = send(address, "/health", &[]).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.header("ratelimit"), None);
        assert_eq!(answer.header("ratelimit-policy"), None);
        assert_eq!(answer.body, "ok");
    }
    let metrics = layer.metrics();
    assert_eq!(metrics.unmatched, 10);
    assert_eq!(metrics.rules.len(), 1);
    assert_eq!(metrics.rules[0].rule, "entity-bundle");
    assert_eq!(store.len(), 0, "no state for passing requests");
}

/// One keep-alive HTTP/1.1 connection: requests one after another on the same socket, so
/// the server gives them all one connection info.
struct KeepAlive {
    stream: tokio::io::BufReader<TcpStream>,
}

impl KeepAlive {
    async fn open(address: SocketAddr) -> KeepAlive {
        let stream = TcpStream::connect(address).await.expect("connect");
        KeepAlive {
            stream: tokio::io::BufReader::new(stream),
        }
    }

    /// `GET path`: the status and the `RateLimit` field, once the whole answer is read.
    async fn get(&mut self, path: &str) -> (u16, Option<String>) {
        use tokio::io::AsyncBufReadExt;
        let text = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
        self.stream
            .get_mut()
            .write_all(text.as_bytes())
            .await
            .expect("write");
        let read = async {
            let mut line = String::new();
            self.stream.read_line(&mut line).await.expect("status line");
            let status = line
                .split(' ')
                .nth(1)
                .and_then(|code| code.parse().ok())
                .expect("a status");
            let (mut length, mut ratelimit) = (0, None);
            loop {
                line.clear();
                self.stream.read_line(&mut line).await.expect("header");
                let Some((name, value)) = line.trim_end().split_once(": ") else {
                    break;
                };
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.parse().expect("a length");
                } else if name.eq_ignore_ascii_case("ratelimit") {
                    ratelimit = Some(value.to_owned());
                }
            }
            let mut body = vec![0; length];
            self.stream.read_exact(&mut body).await.expect("body");
            (status, ratelimit)
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("answer within 10 s")
    }
}

/// Keep-alive clients counted under their address, by a GCRA rule: several connections of
/// one client in parallel share the client's one counter. Exactly the limit is served,
/// whatever the interleaving; the fields count down on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_of_one_client_share_its_counter() {
    const LIMIT: usize = 20;
    for headers_on_allowed in [false, true] {
        let limiter = Limiter::in_memory();
        let rules = vec![rule(
            "client-rate",
            &format!(
                r#"{{"kind":"rate","limit":{LIMIT},"period_ms":3600000,"algorithm":"gcra",
                    "per":"user","match":{{"method":"GET","path":"/repo/v1/entity/#/bundle"}}}}"#
            ),
        )];
        let layer = ThrottleLayer::new(
            limiter.clone(),
            ThrottleRules::fixed(rules).expect("no request matches too many rules"),
            ThrottleConfig {
                identity: Identity::peer(TrustedProxies::none()),
                unidentified: Unidentified::Reject,
                headers_on_allowed,
                on_store_error: OnStoreError::FailClosed,
            },
        );
        let address = serve(app(layer.clone())).await;

        // One connection first: the fields count down as the store would.
        let mut first = KeepAlive::open(address).await;
        for expected in [LIMIT - 1, LIMIT - 2] {
            let (status, ratelimit) = first.get("/repo/v1/entity/5/bundle").await;
            assert_eq!(status, 200);
            if headers_on_allowed {
                let field = ratelimit.expect("fields on allowed answers");
                assert!(
                    field.contains(&format!(";r={expected};")),
                    "{field} after {expected}"
                );
            }
        }
        // Then four more connections in parallel, each asking more than the limit.
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                tokio::spawn(async move {
                    let mut connection = KeepAlive::open(address).await;
                    let mut served = 0;
                    for id in 0..LIMIT {
                        let (status, _) = connection
                            .get(&format!("/repo/v1/entity/{id}/bundle"))
                            .await;
                        assert!(status == 200 || status == 429, "status {status}");
                        served += usize::from(status == 200);
                    }
                    served
                })
            })
            .collect();
        let mut served = 2;
        for task in tasks {
            served += task.await.expect("client task");
        }
        // The period is an hour: one unit comes back every three minutes, so none does here.
        let case = format!("headers on allowed: {headers_on_allowed}");
        assert_eq!(served, LIMIT, "{case}");
        assert_eq!(first.get("/repo/v1/entity/5/bundle").await.0, 429);
        let by_store = tollgate::Request::new("client-rate").key("127.0.0.1");
        assert!(
            !limiter
                .check(&by_store)
                .await
                .expect("decides")
                .is_allowed(),
            "the connections counted on the client's counter in the store"
        );
        // Every answer counted on the rule: two, then four connections' twenty, then one.
        let metrics = layer.metrics();
        let rule = &metrics.rules[0];
        assert_eq!(
            (rule.allowed, rule.denied),
            (LIMIT as u64, 2 + 4 * LIMIT as u64 + 1 - LIMIT as u64),
            "{case}"
        );
    }
}

/// A rule applies to a request however its path is spelled: the layer matches the path the
/// router will route (percent-decoded, dot segments resolved, numbers in any format), and a
/// path that cannot be decoded is refused before the service sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_limited_path_is_limited() {
    let limiter = Limiter::in_memory();
    let layer = principal_layer(&limiter, throttle_table_rules());
    let address = serve(app(layer.clone())).await;
    let alice = bearer("alice");
    let auth = [("authorization", alice.as_str())];
    for _ in 0..3 {
        let answer = send(address, "/repo/v1/entity/123/bundle", &auth).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    for spelling in [
        "/repo/v1/entity/123/bundle",
        "/repo/v1/entity/%31%32%33/bundle",
        "/repo/v1/entity/+123/bundle",
        "/repo/v1/entity/%2B123/bundle",
        "/repo/v1/entity/0123/bundle",
        "/repo/v1/entity/./123/bundle",
        "/repo/v1/entity/%2e/123/bundle",
        "/repo/v1/%65ntity/123/bundle",
        "/repo/v1/entity/123/bundle/",
        "/repo//v1/entity/123/bundle",
        "/repo/v1/x/../entity/123/bundle?mask=1",
    ] {
        let answer = send(address, spelling, &auth).await;
        assert_eq!(answer.status, 429, "{spelling}: {answer:?}");
        assert_eq!(answer.remaining("entity-bundle"), Some(0), "{spelling}");
    }
    let undecodable = send(address, "/repo/v1/entity/%ZZ/bundle", &auth).await;
    assert_eq!(undecodable.status, 400, "{undecodable:?}");
    let body: serde_json::Value =
        serde_json::from_str(&undecodable.body).expect("a JSON error body");
    assert_eq!(body["error"]["code"], "bad_request", "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.starts_with("path: "), "{message}");
    assert_eq!(layer.metrics().bad_path, 1);
    // Refused before any rule or the service: nobody's counts moved.
    let entity = send(address, "/repo/v1/entity/1", &auth).await;
    assert_eq!(entity.status, 200, "{entity:?}");
    assert_eq!(entity.remaining("user-freq"), Some(96), "{entity:?}");
    // An encoded slash is not a separator: this is another path, which the rule does not name
    // and the router does not route (404, from the router: the layer let it through).
    let other = send(address, "/repo/v1/entity%2F123/bundle", &auth).await;
    assert_eq!(other.status, 404, "{other:?}");
    assert_eq!(other.remaining("entity-bundle"), None, "{other:?}");
}

/// axum serves HEAD with the GET handler (so do hyper's and most routers): a rule on GET
/// applies to HEAD too, and HEAD spends what GET spends. Once GET is refused, HEAD is refused
/// and the handler does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_rule_applies_to_head() {
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&ran);
    let routes = Router::new().route(
        "/repo/v1/entity/{id}/bundle",
        get(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { "bundle" }
        }),
    );
    let limiter = Limiter::in_memory();
    let app = routes
        .layer(principal_layer(&limiter, throttle_table_rules()))
        .layer(axum::middleware::from_fn(authenticate));
    let address = serve(app).await;
    let alice = bearer("alice");
    let auth = [("authorization", alice.as_str())];
    for _ in 0..3 {
        let answer = send(address, "/repo/v1/entity/5/bundle", &auth).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    assert_eq!(
        send(address, "/repo/v1/entity/5/bundle", &auth)
            .await
            .status,
        429
    );
    for _ in 0..12 {
        let answer = send_as(address, "HEAD", "/repo/v1/entity/6/bundle", &auth).await;
        assert_eq!(answer.status, 429, "HEAD after GET is refused: {answer:?}");
        assert_eq!(answer.remaining("entity-bundle"), Some(0), "{answer:?}");
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        3,
        "the handler ran for the GETs alone"
    );

    // HEAD spends the GET rule's units: three HEADs leave bob no GET.
    let bob = bearer("bob");
    let auth = [("authorization", bob.as_str())];
    for _ in 0..3 {
        let answer = send_as(address, "HEAD", "/repo/v1/entity/5/bundle", &auth).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    assert_eq!(
        send(address, "/repo/v1/entity/5/bundle", &auth)
            .await
            .status,
        429
    );
    assert_eq!(ran.load(Ordering::SeqCst), 6);
    // A rule on GET does not apply to other methods.
    let post = send_as(address, "POST", "/repo/v1/entity/5/bundle", &auth).await;
    assert_eq!(post.remaining("entity-bundle"), None, "{post:?}");
}

/// Counted by address, an IPv6 client is its /64: the network one subscriber is given, whose
/// 2^64 addresses it may use in turn. IPv4 clients, and IPv4 addresses seen through an IPv6
/// socket, are counted by their whole address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_client_is_counted_by_its_64() {
    let limiter = Limiter::in_memory();
    let layer = ThrottleLayer::new(
        limiter.clone(),
        ThrottleRules::fixed(throttle_table_rules()).expect("no request matches too many rules"),
        ThrottleConfig {
            // The loopback peer is the proxy; the client is the address it forwards.
            identity: Identity::peer(TrustedProxies::parse(["127.0.0.0/8"]).expect("valid")),
            unidentified: Unidentified::Reject,
            headers_on_allowed: true,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let address = serve(app(layer)).await;
    let from = async |client: &str| {
        send(
            address,
            "/repo/v1/entity/5/bundle",
            &[("x-forwarded-for", client)],
        )
        .await
        .status
    };
    // Twelve addresses of one /64, each new: the first three are served, the rest refused.
    for host in 1..=12 {
        let client = format!("2001:db8:7:7:{host:x}:{:x}::1", host * 977);
        let expected = if host <= 3 { 200 } else { 429 };
        assert_eq!(from(&client).await, expected, "{client}");
    }
    // The next /64 is another client.
    assert_eq!(from("2001:db8:7:8::1").await, 200);
    // IPv4: one address, one client, whichever way it is written.
    for (client, expected) in [
        ("198.51.100.7", 200),
        ("198.51.100.8", 200),
        ("::ffff:198.51.100.7", 200),
        ("198.51.100.7", 200),
        ("::ffff:198.51.100.7", 429),
    ] {
        assert_eq!(from(client).await, expected, "{client}");
    }
}

/// An application whose router ignores case and drops `;` parameters (as Spring's can) is
/// throttled by a layer told so (`ThrottleRules::fixed_with`): every spelling its router sends
/// to the handler meets the handler's rule, and once the rule refuses, the handler runs no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_reads_paths_as_its_router_does() {
    use tollgate_rules::{PathCase, PathMatching, PathParams};
    let reading = PathMatching {
        case: PathCase::Insensitive,
        params: PathParams::Strip,
    };
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&ran);
    // The application's own router: lower-cases the path and drops `;` parameters, then
    // serves /repo/v1/entity/{id}/bundle.
    let routes = Router::new().fallback(move |request: Request| {
        let counted = Arc::clone(&counted);
        async move {
            let routed: Vec<String> = request
                .uri()
                .path()
                .split('/')
                .map(|segment| segment.split(';').next().unwrap_or("").to_lowercase())
                .collect();
            match routed.as_slice() {
                [_, repo, v1, entity, id, bundle]
                    if [repo, v1, entity, bundle] == ["repo", "v1", "entity", "bundle"]
                        && id.parse::<u64>().is_ok() =>
                {
                    counted.fetch_add(1, Ordering::SeqCst);
                    (http::StatusCode::OK, "bundle")
                }
                _ => (http::StatusCode::NOT_FOUND, "no route"),
            }
        }
    });
    let limiter = Limiter::in_memory();
    let layer = ThrottleLayer::new(
        limiter,
        ThrottleRules::fixed_with(throttle_table_rules(), reading).expect("fits"),
        ThrottleConfig {
            identity: Identity::principal(|extensions| {
                extensions.get::<User>().map(|user| user.0.as_str())
            }),
            unidentified: Unidentified::Reject,
            headers_on_allowed: true,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let app = routes
        .layer(layer)
        .layer(axum::middleware::from_fn(authenticate));
    let address = serve(app).await;
    let alice = bearer("alice");
    let auth = [("authorization", alice.as_str())];
    let spellings = [
        "/repo/v1/entity/5/bundle",
        "/Repo/V1/Entity/5/Bundle",
        "/REPO/v1/entity/5;jsessionid=0A1B/bundle",
        "/repo/v1;v=2/entity/5/BUNDLE;x",
    ];
    for (index, spelling) in spellings.iter().enumerate() {
        let answer = send(address, spelling, &auth).await;
        let expected = if index < 3 { 200 } else { 429 };
        assert_eq!(answer.status, expected, "{spelling}: {answer:?}");
        assert!(
            answer.remaining("entity-bundle").is_some(),
            "{spelling}: {answer:?}"
        );
    }
    for spelling in spellings {
        let answer = send_as(address, "HEAD", spelling, &auth).await;
        assert_eq!(answer.status, 429, "{spelling}: {answer:?}");
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        3,
        "the handler ran for the three allowed"
    );
}

/// A `\`, raw or encoded as `%5C`, is a character of its segment, never a separator: hyper
/// passes it on, and `/entity\5/bundle` is not `/entity/5/bundle`, to axum's router (which
/// finds no route) as to the layer (whose endpoint rule does not apply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backslash_is_never_a_separator() {
    let limiter = Limiter::in_memory();
    let address = serve(app(principal_layer(&limiter, throttle_table_rules()))).await;
    let alice = bearer("alice");
    let auth = [("authorization", alice.as_str())];
    for spelling in ["/repo/v1/entity\\5/bundle", "/repo/v1/entity%5C5/bundle"] {
        let answer = send(address, spelling, &auth).await;
        assert_eq!(answer.status, 404, "{spelling}: {answer:?}");
        assert_eq!(
            answer.remaining("entity-bundle"),
            None,
            "{spelling}: {answer:?}"
        );
    }
}
