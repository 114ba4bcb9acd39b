//! Hostile callers of the HTTP listener, against the built `tollgate` binary: a web page on
//! another site, a DNS name rebound to loopback, a server exposed without a data token, empty
//! tokens; sockets that send half a request and hold, to the HTTP listener or to the gRPC one,
//! and floods of waiting acquires.

mod common;

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A limit that grants one unit an hour: whatever a refused request did would show.
const ONE_AN_HOUR: &str = r#"{"kind":"rate","limit":1,"period_ms":3600000}"#;

fn host_of(server: &Server) -> String {
    server.url.trim_start_matches("http://").to_owned()
}

/// A data-plane POST to `path` naming `host`, with `extra` header lines.
async fn post_as(server: &Server, path: &str, host: &str, extra: &str, body: &str) -> RawAnswer {
    raw(
        &server.url,
        &format!("POST {path} HTTP/1.1\r\nHost: {host}\r\n{extra}"),
        body,
    )
    .await
}

#[track_caller]
fn assert_refused(answer: &RawAnswer, status: u16, field: &str) {
    assert_eq!(answer.status, status, "{}", answer.body);
    let json = answer.json();
    assert_eq!(json["error"]["code"], "bad_request", "{}", answer.body);
    assert_eq!(json["error"]["field"], field, "{}", answer.body);
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(field), "{}", answer.body);
}

/// A page on another site can send a "simple" request (a form's, or `fetch` with `no-cors`):
/// text/plain, its own Origin, no preflight. None of it may take, charge or pause a unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_site_can_neither_acquire_nor_pause() {
    let server = Server::start();
    put_limit(&server, "vendor-x", ONE_AN_HOUR).await;
    let host = host_of(&server);
    let acquire = r#"{"limits":["vendor-x"]}"#;
    let pause = r#"{"limit":"vendor-x","retry_after_ms":86400000}"#;
    // A charge is never denied: from another site it could close a limit for a window.
    let charge = r#"{"limits":["vendor-x"],"cost":2}"#;
    for (path, body) in [
        ("/v1/acquire", acquire),
        ("/v1/pause", pause),
        ("/v1/charge", charge),
    ] {
        for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
            // As a browser sends a simple request: with its Origin...
            let answer = post_as(
                &server,
                path,
                &host,
                &format!("Origin: http://evil.example\r\nContent-Type: {content_type}\r\n"),
                body,
            )
            .await;
            assert!(
                answer.status == 403 || answer.status == 415,
                "{path} {content_type}: {} {}",
                answer.status,
                answer.body
            );
            // ... and without it (a browser may omit it, a tool never sends it).
            let answer = post_as(
                &server,
                path,
                &host,
                &format!("Content-Type: {content_type}\r\n"),
                body,
            )
            .await;
            assert_refused(&answer, 415, "Content-Type");
        }
        // No Content-Type at all is no better.
        assert_refused(
            &post_as(&server, path, &host, "", body).await,
            415,
            "Content-Type",
        );
        // JSON from another site's page is refused for its Origin.
        let answer = post_as(
            &server,
            path,
            &host,
            "Origin: http://evil.example\r\nContent-Type: application/json\r\n",
            body,
        )
        .await;
        assert_refused(&answer, 403, "Origin");
        // So is a preflight: none is answered unless origins are configured.
        let preflight = raw(
            &server.url,
            &format!(
                "OPTIONS {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: http://evil.example\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: content-type\r\n"
            ),
            "",
        )
        .await;
        assert_eq!(preflight.status, 403, "{}", preflight.body);
        assert!(preflight.header("access-control-allow-origin").is_none());
    }
    // Parameters are allowed, and the unit is still there: nothing above took or paused it.
    let answer = post_as(
        &server,
        "/v1/acquire",
        &host,
        "Content-Type: Application/JSON; charset=utf-8\r\n",
        acquire,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}

/// A DNS name rebound to 127.0.0.1 reaches a loopback server with that name as its Host: it
/// must not read `/v1/stats` (whose hot keys are user ids) nor anything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_host_name_is_refused_on_loopback() {
    let server = Server::start_with(Options {
        args: vec!["--allowed-hosts", "tollgate.internal"],
        ..Options::default()
    });
    let port = server.url.rsplit(':').next().expect("a port").to_owned();
    let get = |host: String| {
        let url = server.url.clone();
        async move {
            raw(
                &url,
                &format!("GET /v1/stats HTTP/1.1\r\nHost: {host}\r\n"),
                "",
            )
            .await
        }
    };
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("127.0.0.1.evil.example:{port}"),
        format!("localhost.evil.example:{port}"),
    ] {
        assert_refused(&get(host).await, 403, "Host");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "LOCALHOST".to_owned(),
        format!("[::1]:{port}"),
        format!("tollgate.internal:{port}"),
    ] {
        let answer = get(host.clone()).await;
        assert_eq!(answer.status, 200, "{host}: {}", answer.body);
    }
    // Liveness reads nothing and changes nothing: a probe may name the server as it likes.
    let health = raw(
        &server.url,
        &format!("GET /healthz HTTP/1.1\r\nHost: evil.example:{port}\r\n"),
        "",
    )
    .await;
    assert_eq!(health.status, 200, "{}", health.body);
}

/// The dashboard calls the API from the server's own origin; a configured origin gets CORS
/// answers, preflight included; any other origin is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_and_configured_origins_are_served_and_only_they_get_cors() {
    let server = Server::start_with(Options {
        args: vec!["--allowed-origins", "https://app.example"],
        ..Options::default()
    });
    put_limit(&server, "vendor-x", ONE_AN_HOUR).await;
    let host = host_of(&server);
    let json = "Content-Type: application/json\r\n";
    let own = post_as(
        &server,
        "/v1/check",
        &host,
        &format!("Origin: http://{host}\r\n{json}"),
        r#"{"method":"GET","path":"/"}"#,
    )
    .await;
    assert_eq!(own.status, 200, "{}", own.body);
    assert!(own.header("access-control-allow-origin").is_none());
    let preflight = raw(
        &server.url,
        &format!(
            "OPTIONS /v1/acquire HTTP/1.1\r\nHost: {host}\r\nOrigin: https://app.example\r\n\
             Access-Control-Request-Method: POST\r\n\
             Access-Control-Request-Headers: authorization, content-type\r\n"
        ),
        "",
    )
    .await;
    assert_eq!(preflight.status, 204, "{}", preflight.body);
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let allowed = preflight
        .header("access-control-allow-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(allowed.contains("content-type") && allowed.contains("authorization"));
    let answer = post_as(
        &server,
        "/v1/acquire",
        &host,
        &format!("Origin: https://app.example\r\n{json}"),
        r#"{"limits":["vendor-x"]}"#,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    for origin in ["https://app.example:8443", "http://app.example", "null"] {
        let answer = post_as(
            &server,
            "/v1/acquire",
            &host,
            &format!("Origin: {origin}\r\n{json}"),
            r#"{"limits":["vendor-x"]}"#,
        )
        .await;
        assert_refused(&answer, 403, "Origin");
    }
}

/// Run `tollgate serve` with `args` and `env`, expecting it to refuse to start: its output, or
/// a failure if it is still running after a generous while (it would serve).
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> Output {
    let directory = tempfile::tempdir().expect("tempdir");
    let mut command = command(directory.path());
    command
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn tollgate serve");
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!(
                "serve {args:?} {env:?} started instead of refusing: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("output");
    assert!(!output.status.success(), "{args:?} {env:?}");
    output
}

#[track_caller]
fn says(output: &Output, words: &[&str]) {
    let text = String::from_utf8_lossy(&output.stderr);
    for word in words {
        assert!(text.contains(word), "{word:?} not in: {text}");
    }
}

/// Open on a network, the data plane lets anyone drain or pause a limit; an empty token would
/// mean "open" to some readers and "closed" to others. Both stop the start, naming the setting.
#[test]
fn a_server_beyond_loopback_needs_a_data_token_and_no_token_may_be_empty() {
    let admin = ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN);
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let output = refused_start(&["--listen", listen], &[admin]);
        says(&output, &["data_token", "TOLLGATE_DATA_TOKEN", "loopback"]);
    }
    let output = refused_start(
        &["--listen", "127.0.0.1:0"],
        &[admin, ("TOLLGATE_DATA_TOKEN", "")],
    );
    says(&output, &["TOLLGATE_DATA_TOKEN", "empty"]);
    let output = refused_start(
        &["--listen", "127.0.0.1:0"],
        &[("TOLLGATE_ADMIN_TOKEN", " ")],
    );
    says(&output, &["TOLLGATE_ADMIN_TOKEN", "empty"]);
    let directory = tempfile::tempdir().expect("tempdir");
    let config = directory.path().join("tollgate.toml");
    for key in ["data_token", "admin_token"] {
        std::fs::write(&config, format!("{key} = \"\"\n")).expect("write");
        let path = config.to_str().expect("utf-8");
        // The environment would win over the file.
        let output = refused_start(&["--listen", "127.0.0.1:0", "--config", path], &[]);
        says(&output, &[key, "empty"]);
    }
    // With a data token it starts, and a gRPC listener beyond loopback is warned about.
    let envoy = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        envoy.path().join("envoy.yaml"),
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .expect("write");
    let mut server = Server::start_with(Options {
        listen: "0.0.0.0:0",
        args: vec!["--grpc-listen", "0.0.0.0:0", "--envoy-config", "envoy.yaml"],
        env: vec![admin, ("TOLLGATE_DATA_TOKEN", "data-token-for-tests")],
        directory: Some(envoy),
        ..Options::default()
    });
    assert!(
        server.log().contains("gRPC listener") && server.log().contains("no credentials"),
        "{}",
        server.log()
    );
    assert!(server.terminate().success());
}

/// Sockets that send half a request and hold, more of them than the server has file
/// descriptors: the server must still answer `/healthz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_while_more_half_sent_requests_hold_than_the_server_has_descriptors() {
    use tokio::io::AsyncWriteExt;
    let mut server = Server::start_with(Options {
        files_max: Some(256),
        ..Options::default()
    });
    let address = host_of(&server);
    let mut held = Vec::new();
    for _ in 0..300 {
        // The kernel completes a connection the server has not accepted yet, and a refused
        // one is as good as a held one here: what counts is what the server does.
        if let Ok(Ok(mut stream)) = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(&address),
        )
        .await
        {
            let _ = stream
                .write_all(b"POST /v1/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
                .await;
            held.push(stream);
        }
    }
    assert!(held.len() > 256, "only {} sockets opened", held.len());
    let health = raw(
        &server.url,
        &format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\n"),
        "",
    )
    .await;
    assert_eq!(health.status, 200, "{}", health.body);
    drop(held);
    assert!(server.terminate().success(), "{}", server.log());
}

/// `ShouldRateLimit`'s overall code `OK`.
const GRPC_OK: i32 = 1;

/// A `ShouldRateLimit` call to the gRPC service at `url`, on a connection of its own; its
/// overall code, or why it failed.
async fn should_rate_limit(url: &str) -> Result<i32, String> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let call = async {
        let mut client = RateLimitServiceClient::connect(url.to_owned())
            .await
            .map_err(|error| format!("connect: {error}"))?;
        let request = RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: "ann".into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let answer = client
            .should_rate_limit(request)
            .await
            .map_err(|status| format!("call: {status}"))?;
        Ok(answer.into_inner().overall_code)
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .map_err(|_| "no answer within 10 s".to_owned())?
}

/// Sockets to the gRPC listener that connect and send nothing, more of them than the server has
/// file descriptors: the HTTP listener still answers `/healthz`, Envoy's next call is answered,
/// and the idle sockets are closed once `header_read_timeout_ms` passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_grpc_sockets_take_neither_the_http_listener_nor_envoys_next_call() {
    let directory = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        directory.path().join("envoy.yaml"),
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n",
    )
    .expect("write");
    let mut server = Server::start_with(Options {
        args: vec![
            "--grpc-listen",
            "127.0.0.1:0",
            "--envoy-config",
            "envoy.yaml",
            "--header-read-timeout-ms",
            "1000",
        ],
        directory: Some(directory),
        files_max: Some(256),
        ..Options::default()
    });
    let grpc = server.grpc.clone().expect("the gRPC address");
    let address = grpc.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..300 {
        // The kernel completes connections the server has not accepted yet: what counts is
        // what the server does with them.
        if let Ok(Ok(stream)) = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(&address),
        )
        .await
        {
            held.push(stream);
        }
    }
    assert!(held.len() > 256, "only {} sockets opened", held.len());
    let health = tokio::time::timeout(
        Duration::from_secs(5),
        raw(
            &server.url,
            &format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n", host_of(&server)),
            "",
        ),
    )
    .await
    .expect("/healthz answers while idle gRPC sockets hold");
    assert_eq!(health.status, 200, "{}", health.body);
    // While they hold, a new gRPC connection takes the place of the longest idle one.
    assert_eq!(
        should_rate_limit(&grpc).await,
        Ok(GRPC_OK),
        "{}",
        server.log()
    );
    // Every idle socket is closed by the server, none later than its head's timeout after the
    // server took it.
    let started = Instant::now();
    for stream in &mut held {
        closed_by_server(stream).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "closing the idle sockets took {:?}",
        started.elapsed()
    );
    drop(held);
    assert_eq!(
        should_rate_limit(&grpc).await,
        Ok(GRPC_OK),
        "{}",
        server.log()
    );
    assert!(server.terminate().success(), "{}", server.log());
}

/// Read from `stream` until the server closes it (or fail after `DEADLINE`).
async fn closed_by_server(stream: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buffer = [0u8; 4096];
    let closed = tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server kept the connection open");
}

/// A half-sent head, a half-sent body, and an idle keep-alive connection are each closed once
/// their timeout passes, while a request waiting for room is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_and_idle_connections_are_closed_after_their_timeouts() {
    use tokio::io::AsyncWriteExt;
    let server = Server::start_with(Options {
        args: vec![
            "--header-read-timeout-ms",
            "300",
            "--idle-timeout-ms",
            "300",
        ],
        ..Options::default()
    });
    put_limit(
        &server,
        "pool",
        r#"{"kind":"concurrency","limit":1,"lease_ttl_ms":60000}"#,
    )
    .await;
    let lease = granted(&server.anonymous(), r#"{"limits":["pool"]}"#).await;
    let address = host_of(&server);
    let connect = || tokio::net::TcpStream::connect(address.clone());
    // A waiter outlives every timeout, and is granted when the lease comes back.
    let waiter = {
        let client = server.anonymous();
        tokio::spawn(async move {
            post(
                &client,
                "/v1/acquire",
                r#"{"limits":["pool"],"wait_ms":20000}"#,
            )
            .await
        })
    };
    let mut head = connect().await.expect("connect");
    head.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write");
    let mut body = connect().await.expect("connect");
    body.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"method\":",
    )
    .await
    .expect("write");
    let mut idle = connect().await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    closed_by_server(&mut head).await;
    closed_by_server(&mut body).await;
    closed_by_server(&mut idle).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!waiter.is_finished(), "the waiter was cut off");
    let commit = post(
        &server.anonymous(),
        &format!("/v1/permits/{}/commit", permit_of(&lease)),
        r#"{"used":1}"#,
    )
    .await;
    assert_eq!(commit.status, 200, "{}", commit.text());
    let waited = waiter.await.expect("the waiter");
    assert_eq!(waited.status, 200, "{}", waited.text());
}

async fn waiting_on(server: &Server, limit: &str) -> u64 {
    let stats = call(
        &server.anonymous(),
        hyper::Method::GET,
        &format!("/v1/stats?limit={limit}"),
        "",
    )
    .await;
    stats.json.expect("json")["limits"][0]["waiting"]
        .as_u64()
        .unwrap_or(0)
}

/// A flood of waiting acquires on one limit fills that limit's line, not the server: the
/// overflow is answered at once with a 429 naming the cap, and another limit's waiter still
/// queues and is granted when room comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_waiting_line_on_one_limit_answers_at_once_and_others_still_queue() {
    const POOL: &str = r#"{"kind":"concurrency","limit":1,"lease_ttl_ms":60000}"#;
    let server = Server::start_with(Options {
        args: vec!["--waiters-per-limit-max", "2"],
        ..Options::default()
    });
    put_limit(&server, "flooded", POOL).await;
    put_limit(&server, "other", POOL).await;
    let flooded = granted(&server.anonymous(), r#"{"limits":["flooded"]}"#).await;
    let other = granted(&server.anonymous(), r#"{"limits":["other"]}"#).await;
    let wait = |limit: &str| {
        let client = server.anonymous();
        let body = format!(r#"{{"limits":["{limit}"],"wait_ms":25000}}"#);
        tokio::spawn(async move { post(&client, "/v1/acquire", &body).await })
    };
    let waiters = [wait("flooded"), wait("flooded")];
    until("two waiters on flooded", async || {
        waiting_on(&server, "flooded").await == 2
    })
    .await;
    let started = Instant::now();
    let overflow = post(
        &server.anonymous(),
        "/v1/acquire",
        r#"{"limits":["flooded"],"wait_ms":25000}"#,
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the overflow waited instead of being answered at once"
    );
    assert_error(&overflow, 429, "rate_limited", None);
    let message = overflow.error_message().unwrap_or_default();
    assert!(
        message.contains("waiters_per_limit_max") && message.contains("flooded"),
        "{message}"
    );
    assert!(overflow.headers.contains_key("retry-after"));
    let queued = wait("other");
    until("a waiter on other", async || {
        waiting_on(&server, "other").await == 1
    })
    .await;
    let commit = post(
        &server.anonymous(),
        &format!("/v1/permits/{}/commit", permit_of(&other)),
        r#"{"used":1}"#,
    )
    .await;
    assert_eq!(commit.status, 200, "{}", commit.text());
    let answer = queued.await.expect("the other waiter");
    assert_eq!(answer.status, 200, "{}", answer.text());
    for waiter in waiters {
        waiter.abort();
    }
    let _ = flooded;
}

/// `/metrics` names every limit and what it counts: with `metrics_token` set it answers only a
/// scraper showing that token (not the data or the admin token); without one it stays open,
/// as on the default loopback listener before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_only_the_metrics_token_once_one_is_set() {
    let mut options = Options::default();
    options
        .env
        .push(("TOLLGATE_METRICS_TOKEN", "metrics-token-for-tests"));
    options
        .env
        .push(("TOLLGATE_DATA_TOKEN", "data-token-for-tests"));
    let server = Server::start_with(options);
    put_limit(&server, "secret-vendor", ONE_AN_HOUR).await;
    // Counted, so its name is in the metrics.
    granted(
        &server.with_token("data-token-for-tests"),
        r#"{"limits":["secret-vendor"]}"#,
    )
    .await;
    for client in [
        server.anonymous(),
        server.admin(),
        server.with_token("data-token-for-tests"),
        server.with_token("metrics-token-for-test"),
    ] {
        let answer = call(&client, hyper::Method::GET, "/metrics", "").await;
        assert_error(&answer, 401, "unauthorized", None);
        assert!(
            !answer.text().contains("secret-vendor"),
            "{}",
            answer.text()
        );
        assert!(
            answer
                .error_message()
                .is_some_and(|message| message.contains("metrics_token")),
            "{}",
            answer.text()
        );
    }
    let scraper = server.with_token("metrics-token-for-tests");
    let answer = call(&scraper, hyper::Method::GET, "/metrics", "").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().contains("secret-vendor"), "{}", answer.text());
    let open = Server::start();
    put_limit(&open, "secret-vendor", ONE_AN_HOUR).await;
    granted(&open.anonymous(), r#"{"limits":["secret-vendor"]}"#).await;
    let answer = call(&open.anonymous(), hyper::Method::GET, "/metrics", "").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().contains("secret-vendor"), "{}", answer.text());
    // An empty token is refused at start, naming the setting.
    let output = refused_start(
        &["--listen", "127.0.0.1:0"],
        &[
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_METRICS_TOKEN", " "),
        ],
    );
    says(&output, &["TOLLGATE_METRICS_TOKEN", "empty"]);
}
