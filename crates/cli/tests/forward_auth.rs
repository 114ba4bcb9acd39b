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
/// (a query, leading zeros, doubled slashes, dot segments, percent-encoding, nginx's
/// `X-Original-*` headers) is the same path: the limit of 6 lets 6 through, whatever the mix.
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
    answers.push(
        forward_raw(
            url,
            &[
                "X-Original-Method: HEAD",
                "X-Original-URI: /items/+42",
                "X-User: carol",
            ],
        )
        .await,
    );
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

/// A missing or malformed original method or URI, or a user that is no key, is a 400 naming
/// the header, and counts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_headers_are_refused_naming_the_header_and_count_nothing() {
    let server = server_with(&[]);
    put_limit(&server, "items", &items(1)).await;
    let url = &server.url;
    let long_uri = format!("X-Forwarded-Uri: /items/{}", "a".repeat(9 * 1024));
    let long_user = format!("X-User: {}", "u".repeat(300));
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
        (
            vec![
                "X-Forwarded-Method: GET",
                "X-Forwarded-Uri: /items/1",
                &long_user,
            ],
            "x-user",
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
    ] {
        let output = refused_start(&args);
        let text = String::from_utf8_lossy(&output.stderr);
        assert!(text.contains(setting), "{args:?}: {text}");
    }
}
