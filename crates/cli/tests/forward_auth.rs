//! `GET /v1/forward-auth` end to end: the built `tollgate` binary as a real server process,
//! asked as a reverse proxy asks it (the original method and URI in headers, the proxy's token
//! in `X-Tollgate-Token`), over real HTTP on loopback. Each test counts the answers itself and
//! judges by its own count; the proxies themselves are run by `scripts/proxy-test`.

mod common;

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const DATA_TOKEN: &str = "data-token-for-forward-auth";

/// A limit of `limit` GET requests an hour per user on `/items/#`, in any hour (sliding): no
/// window ends while a test runs.
fn items(limit: u64) -> String {
    format!(
        r#"{{"kind":"rate","limit":{limit},"period_ms":3600000,"per":"user",
            "match":{{"method":"GET","path":"/items/#"}}}}"#
    )
}

/// Ask `/v1/forward-auth` of the server at `url` about `method uri`, with `headers` (each a
/// `Name: value` line without its CRLF) besides the two naming the original request.
async fn forward(url: &str, method: &str, uri: &str, headers: &[&str]) -> RawAnswer {
    let mut head = format!(
        "GET /v1/forward-auth HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-Method: {method}\r\n\
         X-Forwarded-Uri: {uri}\r\n"
    );
    for line in headers {
        head.push_str(line);
        head.push_str("\r\n");
    }
    raw(url, &head, "").await
}

/// `/v1/forward-auth` with exactly `headers`, for requests that lack or spoil the usual ones.
async fn forward_raw(url: &str, headers: &[&str]) -> RawAnswer {
    let mut head = "GET /v1/forward-auth HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_owned();
    for line in headers {
        head.push_str(line);
        head.push_str("\r\n");
    }
    raw(url, &head, "").await
}

/// A server whose forward-auth reads the user from `X-User`, with `args` besides.
fn server_with(args: &[&'static str]) -> Server {
    let mut all = vec!["--forward-auth-user-header", "X-User"];
    all.extend_from_slice(args);
    Server::start_with(Options {
        args: all,
        ..Options::default()
    })
}

#[track_caller]
fn assert_allowed(answer: &RawAnswer) {
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["allowed"], true, "{}", answer.body);
}

/// A 429 a proxy can pass on: `Retry-After` in whole seconds within the window, and the error
/// code.
#[track_caller]
fn assert_denied(answer: &RawAnswer) {
    assert_eq!(answer.status, 429, "{}", answer.body);
    let retry: u64 = answer
        .header("retry-after")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("a 429 without Retry-After: {:?}", answer.headers));
    assert!((1..=3600).contains(&retry), "Retry-After: {retry}");
    assert_eq!(answer.json()["error"]["code"], "rate_limited");
    assert_eq!(answer.json()["allowed"], false);
}

/// How many of `answers` were allowed, failing on anything but 200 and 429.
#[track_caller]
fn allowed(answers: &[RawAnswer]) -> usize {
    answers
        .iter()
        .filter(|answer| {
            assert!(
                answer.status == 200 || answer.status == 429,
                "{} {}",
                answer.status,
                answer.body
            );
            answer.status == 200
        })
        .count()
}

/// Allowed while the user's limit has room, then 429 with `Retry-After`; the IETF RateLimit
/// headers say the policy and what is left on every answer; another user has their own
/// budget, and a request no rule matches is allowed with no RateLimit headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_past_their_limit_is_refused_with_retry_after_and_ratelimit_headers() {
    let server = server_with(&[]);
    put_limit(&server, "items", &items(3)).await;
    let url = &server.url;
    for left in [2, 1, 0] {
        let answer = forward(url, "GET", "/items/7", &["X-User: alice"]).await;
        assert_allowed(&answer);
        assert_eq!(
            answer.header("ratelimit-policy"),
            Some(r#""items";q=3;w=3600"#)
        );
        let counter = answer.header("ratelimit").expect("RateLimit");
        assert!(
            counter.starts_with(&format!(r#""items";r={left};t="#)),
            "{counter}"
        );
        assert_eq!(answer.json()["matched"], serde_json::json!(["items"]));
    }
    let denied = forward(url, "GET", "/items/7", &["X-User: alice"]).await;
    assert_denied(&denied);
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some(r#""items";q=3;w=3600"#)
    );
    assert!(
        denied
            .header("ratelimit")
            .is_some_and(|value| value.starts_with(r#""items";r=0;t="#)),
        "{:?}",
        denied.headers
    );
    // Bob's budget is his own.
    assert_allowed(&forward(url, "GET", "/items/7", &["X-User: bob"]).await);
    // Nothing matches: allowed, and no policy to tell.
    let free = forward(url, "POST", "/items/7", &["X-User: alice"]).await;
    assert_allowed(&free);
    assert_eq!(free.header("ratelimit-policy"), None);
    assert_eq!(free.header("ratelimit"), None);
    assert_denied(&forward(url, "GET", "/items/8", &["X-User: alice"]).await);
}

/// HEAD meets the GET rule and spends from the same counter, and every spelling of one path
/// (a query, leading zeros and a sign, doubled slashes, dot segments, percent-encoding) is the
/// same path: the limit of 6 lets 6 through, whatever the mix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_and_every_spelling_of_a_path_count_as_one() {
    let server = server_with(&[]);
    put_limit(&server, "items", &items(6)).await;
    let url = &server.url;
    let mut answers = Vec::new();
    for (method, uri) in [
        ("HEAD", "/items/42"),
        ("GET", "/items/42?page=2"),
        ("head", "/items/042"),
        ("GET", "//items///42/"),
        ("GET", "/other/../items/./42"),
        ("GET", "/items/%34%32"),
    ] {
        answers.push(forward(url, method, uri, &["X-User: carol"]).await);
    }
    answers.push(forward(url, "HEAD", "/items/+42", &["X-User: carol"]).await);
    answers.push(forward(url, "GET", "/items/42", &["X-User: carol"]).await);
    assert_eq!(allowed(&answers), 6, "six of eight");
    for answer in &answers[..6] {
        assert_allowed(answer);
        assert_eq!(answer.json()["path"], "/items/#");
    }
    for answer in &answers[6..] {
        assert_denied(answer);
    }
}

/// Without the user header a request is its client's: the socket peer, since no proxy is
/// trusted by default, so an `X-Forwarded-For` the client wrote names nobody. With the header,
/// the user's own budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_user_header_the_peer_address_is_the_key_and_forwarded_for_is_ignored() {
    let server = server_with(&[]);
    put_limit(&server, "items", &items(2)).await;
    let url = &server.url;
    let mut answers = Vec::new();
    for spoofed in [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "203.0.113.9",
    ] {
        let header = format!("X-Forwarded-For: {spoofed}");
        answers.push(forward(url, "GET", "/items/1", &[&header]).await);
    }
    assert_eq!(allowed(&answers), 2, "every answer was for 127.0.0.1");
    // An empty user header is no user.
    assert_denied(&forward(url, "GET", "/items/1", &["X-User:  "]).await);
    assert_allowed(&forward(url, "GET", "/items/1", &["X-User: dave"]).await);
    let stats = common::call(
        &server.admin(),
        hyper::Method::GET,
        "/v1/stats?limit=items&key=127.0.0.1",
        "",
    )
    .await;
    assert_eq!(stats.status, 200, "{}", stats.text());
    assert_eq!(
        stats.json.expect("json")["limits"][0]["usage"]["used"],
        2,
        "the address's counter"
    );
}

/// Behind a trusted proxy the client is the nearest untrusted address of `X-Forwarded-For`,
/// read from the right, so what a client writes on the left is never believed, and a
/// `Forwarded` header (which the proxies pass on from the client) is not read at all. An IPv6
/// client is its /64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_trusted_proxies_the_client_is_read_from_x_forwarded_for_from_the_right() {
    let server = server_with(&["--forward-auth-trusted-proxies", "127.0.0.1,10.0.0.0/8"]);
    put_limit(&server, "items", &items(2)).await;
    let url = &server.url;
    let mut first = Vec::new();
    for chain in [
        "X-Forwarded-For: 198.51.100.7",
        // The client claimed another address; the proxy appended what it saw.
        "X-Forwarded-For: 198.51.100.8, 198.51.100.7",
        // Through a second, trusted hop.
        "X-Forwarded-For: 6.6.6.6, 198.51.100.7, 10.1.2.3",
    ] {
        first.push(forward(url, "GET", "/items/1", &[chain]).await);
    }
    assert_eq!(allowed(&first), 2, "all three were 198.51.100.7");
    assert_denied(&first[2]);
    // A `Forwarded` header the client sent, passed on by the proxy, names nobody.
    assert_denied(
        &forward(
            url,
            "GET",
            "/items/1",
            &["Forwarded: for=192.0.2.1", "X-Forwarded-For: 198.51.100.7"],
        )
        .await,
    );
    assert_allowed(&forward(url, "GET", "/items/1", &["X-Forwarded-For: 198.51.100.8"]).await);
    // Without any forwarded address the proxy itself is the client.
    assert_allowed(&forward(url, "GET", "/items/1", &[]).await);

    let mut v6 = Vec::new();
    for address in [
        "2001:db8:7:7::1",
        "2001:db8:7:7:ffff::2",
        "2001:db8:7:7:1:2:3:4",
    ] {
        let header = format!("X-Forwarded-For: {address}");
        v6.push(forward(url, "GET", "/items/1", &[&header]).await);
    }
    assert_eq!(allowed(&v6), 2, "one /64, one client");
    assert_allowed(
        &forward(
            url,
            "GET",
            "/items/1",
            &["X-Forwarded-For: 2001:db8:7:8::1"],
        )
        .await,
    );
}

/// The prefix that names an IPv6 client is a setting, as the tower layer's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ipv6_prefix_of_a_client_is_configured() {
    let server = server_with(&[
        "--forward-auth-trusted-proxies",
        "127.0.0.1",
        "--forward-auth-ipv6-prefix-len",
        "48",
    ]);
    put_limit(&server, "items", &items(1)).await;
    let url = &server.url;
    assert_allowed(
        &forward(
            url,
            "GET",
            "/items/1",
            &["X-Forwarded-For: 2001:db8:5:1::1"],
        )
        .await,
    );
    assert_denied(
        &forward(
            url,
            "GET",
            "/items/1",
            &["X-Forwarded-For: 2001:db8:5:2::1"],
        )
        .await,
    );
    assert_allowed(&forward(url, "GET", "/items/1", &["X-Forwarded-For: 2001:db8:6::1"]).await);
}

/// A missing or malformed original method or URI is a 400 naming the header, and counts
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_headers_are_refused_naming_the_header_and_count_nothing() {
    let server = server_with(&[]);
    put_limit(&server, "items", &items(1)).await;
    let url = &server.url;
    let long_uri = format!("X-Forwarded-Uri: /items/{}", "a".repeat(9 * 1024));
    for (headers, field) in [
        (
            vec!["X-Forwarded-Uri: /items/1", "X-User: erin"],
            "X-Forwarded-Method",
        ),
        (
            vec!["X-Forwarded-Method: GET", "X-User: erin"],
            "X-Forwarded-Uri",
        ),
        (
            vec!["X-Forwarded-Method: G3T", "X-Forwarded-Uri: /items/1"],
            "X-Forwarded-Method",
        ),
        (
            vec!["X-Forwarded-Method: ", "X-Forwarded-Uri: /items/1"],
            "X-Forwarded-Method",
        ),
        (
            vec!["X-Forwarded-Method: GET", "X-Forwarded-Uri: items/1"],
            "X-Forwarded-Uri",
        ),
        (
            vec![
                "X-Forwarded-Method: GET",
                "X-Forwarded-Uri: http://x/items/1",
            ],
            "X-Forwarded-Uri",
        ),
        (
            vec!["X-Forwarded-Method: GET", "X-Forwarded-Uri: /items/%zz"],
            "X-Forwarded-Uri",
        ),
        (
            vec!["X-Forwarded-Method: GET", "X-Forwarded-Uri: /items/%ff"],
            "X-Forwarded-Uri",
        ),
        (
            vec!["X-Forwarded-Method: GET", &long_uri],
            "X-Forwarded-Uri",
        ),
    ] {
        let answer = forward_raw(url, &headers).await;
        assert_eq!(answer.status, 400, "{headers:?}: {}", answer.body);
        let json = answer.json();
        assert_eq!(json["error"]["code"], "bad_request", "{}", answer.body);
        assert_eq!(
            json["error"]["field"], field,
            "{headers:?}: {}",
            answer.body
        );
        assert!(
            json["error"]["message"]
                .as_str()
                .is_some_and(|message| message.starts_with(field)),
            "{}",
            answer.body
        );
    }
    // Nothing above was counted: erin and the address still have their one request.
    assert_allowed(&forward(url, "GET", "/items/1", &["X-User: erin"]).await);
    assert_allowed(&forward(url, "GET", "/items/1", &[]).await);
}

/// The proxy's token travels in `X-Tollgate-Token`: `Authorization` is the end user's and is
/// not read, so a user's own credentials neither pass nor fail the check. A scoped token is
/// held to its limits as on `/v1/check`. The user's `Origin` does not refuse the request here
/// (it does on `/v1/check`), but a rebound `Host` still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_authenticates_in_its_own_header_and_scoped_tokens_hold() {
    let server = Server::start_with(Options {
        args: vec!["--forward-auth-user-header", "X-User"],
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_DATA_TOKEN", DATA_TOKEN),
        ],
        ..Options::default()
    });
    put_limit(&server, "items", &items(100)).await;
    put_limit(
        &server,
        "billing",
        r#"{"kind":"rate","limit":100,"period_ms":60000,"per":"user",
            "match":{"method":"GET","path":"/billing/#"}}"#,
    )
    .await;
    let url = &server.url;
    let token = format!("X-Tollgate-Token: {DATA_TOKEN}");
    let as_bearer = format!("Authorization: Bearer {DATA_TOKEN}");
    for headers in [vec!["X-User: f"], vec![&as_bearer, "X-User: f"]] {
        let answer = forward(url, "GET", "/items/1", &headers).await;
        assert_eq!(answer.status, 401, "{headers:?}: {}", answer.body);
        assert!(
            answer.json()["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("X-Tollgate-Token")),
            "{}",
            answer.body
        );
    }
    let wrong = forward(
        url,
        "GET",
        "/items/1",
        &["X-Tollgate-Token: nope", "X-User: f"],
    )
    .await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_allowed(&forward(url, "GET", "/items/1", &[&token, "X-User: f"]).await);
    // The end user's own credentials and browser headers are theirs.
    assert_allowed(
        &forward(
            url,
            "GET",
            "/items/1",
            &[
                &token,
                "X-User: f",
                "Authorization: Bearer the-users-own-session",
                "Origin: https://app.example",
                "Content-Type: text/plain",
            ],
        )
        .await,
    );
    let check = raw(
        url,
        &format!(
            "POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\n{as_bearer}\r\n\
             Origin: https://app.example\r\nContent-Type: application/json\r\n"
        ),
        r#"{"method":"GET","path":"/items/1","user":"f"}"#,
    )
    .await;
    assert_eq!(check.status, 403, "{}", check.body);
    let rebound = raw(
        url,
        &format!(
            "GET /v1/forward-auth HTTP/1.1\r\nHost: evil.example\r\n{token}\r\n\
             X-Forwarded-Method: GET\r\nX-Forwarded-Uri: /items/1\r\n"
        ),
        "",
    )
    .await;
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert_eq!(rebound.json()["error"]["field"], "Host");

    let created = post(
        &server.admin(),
        "/v1/tokens",
        r#"{"name":"edge","limits":["items"]}"#,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text());
    let secret = created.json.expect("json")["secret"]
        .as_str()
        .expect("a secret")
        .to_owned();
    let scoped = format!("X-Tollgate-Token: {secret}");
    assert_allowed(&forward(url, "GET", "/items/1", &[&scoped, "X-User: f"]).await);
    let outside = forward(url, "GET", "/billing/1", &[&scoped, "X-User: f"]).await;
    assert_eq!(outside.status, 403, "{}", outside.body);
    assert!(outside.body.contains("billing"), "{}", outside.body);
    // The scoped token as the user's bearer token is not the proxy's token.
    let scoped_bearer = format!("Authorization: Bearer {secret}");
    let answer = forward(url, "GET", "/items/1", &[&scoped_bearer, "X-User: f"]).await;
    assert_eq!(answer.status, 401, "{}", answer.body);
}

/// Ask `/v1/check` about `GET path` for `user`, as an application behind no proxy does.
async fn check(url: &str, path: &str, user: &str) -> RawAnswer {
    let body = serde_json::json!({"method": "GET", "path": path, "user": user}).to_string();
    raw(
        url,
        "POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
        &body,
    )
    .await
}

/// WSGI and ASGI servers route on the decoded path, and nginx's `proxy_pass` with a URI sends
/// the decoded, normalised path on, so `/items%2F1` and `/x/..%2Fitems/1` reach the handler of
/// `/items/1`: both endpoints count them under its rule, and a rule that both readings of a
/// path match is counted once. With `path_encoded_slash = "segment"` only the path as written
/// is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_slash_is_counted_under_the_rules_of_the_path_it_decodes_to() {
    let server = server_with(&[]);
    put_limit(&server, "items", &items(2)).await;
    put_limit(
        &server,
        "everything",
        r#"{"kind":"rate","limit":100,"period_ms":3600000,"per":"user",
            "match":{"method":"GET","path":"*"}}"#,
    )
    .await;
    let url = &server.url;
    let first = forward(url, "GET", "/items%2F1", &["X-User: alice"]).await;
    assert_allowed(&first);
    assert_eq!(
        first.json()["matched"],
        serde_json::json!(["everything", "items"]),
        "{}",
        first.body
    );
    // The rule on every path, met by both readings, spent one unit.
    assert!(
        first
            .header("ratelimit")
            .is_some_and(|value| value.contains(r#""everything";r=99;"#)),
        "{:?}",
        first.headers
    );
    assert_allowed(&forward(url, "GET", "/items/1", &["X-User: alice"]).await);
    // `/v1/check`'s user is the application's own key.
    for _ in 0..2 {
        assert_eq!(check(url, "/items/1", "carol").await.status, 200);
    }
    for uri in [
        "/items%2F1",
        "/items%2f1",
        "/x/..%2Fitems/1",
        "/x/..%2fitems/%31",
        "/x/%2E%2E%2Fitems%2F7",
        "/items%2F1%2F",
    ] {
        let answer = forward(url, "GET", uri, &["X-User: alice"]).await;
        assert_denied(&answer);
        assert_eq!(
            check(url, uri, "carol").await.status,
            429,
            "/v1/check {uri}"
        );
    }
    // Not a slash once decoded: `%252F` is `%2F` to a router that decodes once.
    let escaped = forward(url, "GET", "/items%252F1", &["X-User: alice"]).await;
    assert_allowed(&escaped);
    assert_eq!(escaped.json()["matched"], serde_json::json!(["everything"]));

    let segment = server_with(&["--path-encoded-slash", "segment"]);
    put_limit(&segment, "items", &items(1)).await;
    let url = &segment.url;
    assert_allowed(&forward(url, "GET", "/items/1", &["X-User: alice"]).await);
    let kept = forward(url, "GET", "/items%2F1", &["X-User: alice"]).await;
    assert_allowed(&kept);
    assert_eq!(kept.json()["matched"], serde_json::json!([]));
}

/// A proxy passes the client's headers on to this endpoint, so only the headers the configured
/// proxy sets are read: with none configured, `X-Forwarded-Method` and `X-Forwarded-Uri`, and a
/// request that also carries `X-Original-*` is refused; with `nginx`, `X-Original-*`, and a
/// request that carries `X-Forwarded-*` (or two different values) is refused. Refusals are
/// 400s naming the header, count nothing against the user, and are counted in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_the_configured_proxy_does_not_set_is_refused_unread() {
    let server = server_with(&[]);
    put_limit(&server, "items", &items(2)).await;
    let url = &server.url;
    for _ in 0..2 {
        assert_allowed(&forward(url, "GET", "/items/1", &["X-User: mallory"]).await);
    }
    // nginx as its documentation sets it up: X-Original-URI from the proxy, and a client's own
    // X-Forwarded-Uri passed on beside it.
    let forged = forward_raw(
        url,
        &[
            "X-Original-Method: GET",
            "X-Original-URI: /items/1",
            "X-Forwarded-Method: GET",
            "X-Forwarded-Uri: /",
            "X-User: mallory",
        ],
    )
    .await;
    assert_eq!(forged.status, 400, "{}", forged.body);
    assert_eq!(forged.json()["error"]["field"], "X-Original-Method");
    assert_denied(&forward(url, "GET", "/items/1", &["X-User: mallory"]).await);

    let nginx = server_with(&["--forward-auth-proxy", "nginx"]);
    put_limit(&nginx, "items", &items(2)).await;
    let url = &nginx.url;
    let original =
        |user: &'static str| ["X-Original-Method: GET", "X-Original-URI: /items/1", user];
    for _ in 0..2 {
        assert_allowed(&forward_raw(url, &original("X-User: mallory")).await);
    }
    assert_denied(&forward_raw(url, &original("X-User: mallory")).await);
    let forged = [
        ("X-Forwarded-Uri: /", "X-Forwarded-Uri"),
        ("X-Forwarded-Method: POST", "X-Forwarded-Method"),
        ("X-Original-URI: /", "X-Original-URI"),
    ];
    for (extra, field) in forged {
        let mut headers = original("X-User: trent").to_vec();
        headers.push(extra);
        let answer = forward_raw(url, &headers).await;
        assert_eq!(answer.status, 400, "{extra}: {}", answer.body);
        assert_eq!(answer.json()["error"]["field"], field, "{}", answer.body);
        assert!(
            answer.json()["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("refused unread")),
            "{}",
            answer.body
        );
    }
    // Nothing was counted for trent: his two requests are still there.
    for _ in 0..2 {
        assert_allowed(&forward_raw(url, &original("X-User: trent")).await);
    }
    let metrics = raw(url, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n", "").await;
    assert!(
        metrics
            .body
            .contains("tollgate_forward_auth_refusals_total{reason=\"unexpected_header\"} 2")
            && metrics
                .body
                .contains("tollgate_forward_auth_refusals_total{reason=\"disagreeing_headers\"} 1"),
        "{}",
        metrics.body
    );

    // Headers named one by one.
    let named = server_with(&[
        "--forward-auth-method-header",
        "X-Request-Method",
        "--forward-auth-uri-header",
        "X-Request-Target",
    ]);
    put_limit(&named, "items", &items(1)).await;
    let url = &named.url;
    let own = [
        "X-Request-Method: GET",
        "X-Request-Target: /items/1",
        "X-User: u",
    ];
    assert_allowed(&forward_raw(url, &own).await);
    assert_denied(&forward_raw(url, &own).await);
    let mut with_original = own.to_vec();
    with_original.push("X-Original-URI: /");
    assert_eq!(forward_raw(url, &with_original).await.status, 400);
}

/// A client counted by address takes a key of its own in a limit's key budget. One IPv6 /48
/// holds 65,536 /64s, so past `forward_auth_network_keys_max` clients a network's further
/// clients share its one key: a flood from one /48 (or /24) spends that network's budget and
/// leaves the limit's key budget to everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_network_leaves_room_for_clients_elsewhere() {
    let server = server_with(&[
        "--forward-auth-trusted-proxies",
        "127.0.0.1",
        "--keys-per-limit-max",
        "40",
        "--forward-auth-network-keys-max",
        "8",
    ]);
    put_limit(&server, "items", &items(1000)).await;
    let url = &server.url;
    let mut statuses = std::collections::BTreeMap::new();
    for subnet in 0..100 {
        let header = format!("X-Forwarded-For: 2001:db8:1:{subnet:x}::1");
        let answer = forward(url, "GET", "/items/1", &[&header]).await;
        *statuses.entry(answer.status).or_insert(0) += 1;
    }
    assert_eq!(statuses.get(&200), Some(&100), "{statuses:?}");
    for address in ["198.51.100.7", "2001:db8:2:1::1", "203.0.113.200"] {
        let header = format!("X-Forwarded-For: {address}");
        let answer = forward(url, "GET", "/items/1", &[&header]).await;
        assert_allowed(&answer);
    }
    // An IPv4 /24 is a network too.
    let mut v4 = Vec::new();
    for host in 1..=40 {
        let header = format!("X-Forwarded-For: 192.0.2.{host}");
        v4.push(forward(url, "GET", "/items/1", &[&header]).await.status);
    }
    assert!(v4.iter().all(|&status| status == 200), "{v4:?}");
    assert_allowed(&forward(url, "GET", "/items/1", &["X-Forwarded-For: 198.51.100.8"]).await);
    let stats = common::call(
        &server.admin(),
        hyper::Method::GET,
        "/v1/stats?limit=items&key=2001:db8:1::/48",
        "",
    )
    .await;
    assert_eq!(stats.status, 200, "{}", stats.text());
    assert_eq!(
        stats.json.expect("json")["limits"][0]["usage"]["used"],
        92,
        "the /48's 92 clients past its 8"
    );
}

/// Users the proxy names and client addresses never share a key, and any user value is
/// accepted: one no rule needs is not read, and a long or non-ASCII one is keyed by its hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_addresses_have_their_own_keys_and_any_user_value_is_accepted() {
    let server = server_with(&[]);
    put_limit(&server, "items", &items(2)).await;
    let url = &server.url;
    for _ in 0..2 {
        assert_allowed(&forward(url, "GET", "/items/1", &[]).await);
    }
    assert_denied(&forward(url, "GET", "/items/1", &[]).await);
    // A user named like the address is someone else.
    for _ in 0..2 {
        assert_allowed(&forward(url, "GET", "/items/1", &["X-User: 127.0.0.1"]).await);
    }
    assert_denied(&forward(url, "GET", "/items/1", &["X-User: 127.0.0.1"]).await);
    assert_denied(&forward(url, "GET", "/items/1", &[]).await);

    let long = format!("X-User: {}", "u".repeat(300));
    let other_long = format!("X-User: {}v", "u".repeat(299));
    for user in ["X-User: zoë", "X-User: 山田", long.as_str()] {
        // Where no rule needs the user, it is not read.
        assert_allowed(&forward(url, "POST", "/items/1", &[user]).await);
        for _ in 0..2 {
            assert_allowed(&forward(url, "GET", "/items/1", &[user]).await);
        }
        assert_denied(&forward(url, "GET", "/items/1", &[user]).await);
    }
    assert_allowed(&forward(url, "GET", "/items/1", &[&other_long]).await);
    assert_allowed(&forward(url, "GET", "/items/1", &["X-User: zoe"]).await);
}

fn refused_start(args: &[&str]) -> Output {
    let directory = tempfile::tempdir().expect("tempdir");
    let mut child = command(directory.path())
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate serve");
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("serve {args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    assert!(!output.status.success(), "serve {args:?} exited 0");
    output
}

/// A setting that cannot be what it says stops the start, naming it.
#[test]
fn bad_forward_auth_settings_stop_the_start_naming_them() {
    for (args, setting) in [
        (
            vec![
                "--forward-auth-trusted-proxies",
                "10.0.0.0/8,proxy.internal",
            ],
            "forward_auth_trusted_proxies",
        ),
        (
            vec!["--forward-auth-trusted-proxies", "10.0.0.0/40"],
            "forward_auth_trusted_proxies",
        ),
        (
            vec!["--forward-auth-ipv6-prefix-len", "16"],
            "forward_auth_ipv6_prefix_len",
        ),
        (
            vec!["--forward-auth-user-header", "X-Tollgate-Token"],
            "forward_auth_user_header",
        ),
        (
            vec!["--forward-auth-user-header", "X User"],
            "forward_auth_user_header",
        ),
        (vec!["--forward-auth-proxy", "apache"], "forward_auth_proxy"),
        (
            vec!["--forward-auth-uri-header", "X-Tollgate-Token"],
            "forward_auth_uri_header",
        ),
        (
            vec!["--forward-auth-method-header", "bad header"],
            "forward_auth_method_header",
        ),
        (
            vec!["--forward-auth-user-header", "X-Original-URI"],
            "forward_auth_user_header",
        ),
        (
            vec!["--forward-auth-network-keys-max", "0"],
            "forward_auth_network_keys_max",
        ),
        (vec!["--path-encoded-slash", "decode"], "path_encoded_slash"),
    ] {
        let output = refused_start(&args);
        let text = String::from_utf8_lossy(&output.stderr);
        assert!(text.contains(setting), "{args:?}: {text}");
    }
}
