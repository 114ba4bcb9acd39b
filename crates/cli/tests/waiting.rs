//! A waiting request against the built `tollgate` binary, as an attacker would use one: it must
//! not lock the other callers of its limit out (docs/security.md, *A waiting request*), and a
//! scoped token bounds what one of its requests may ask and how many of them may wait.

mod common;

use std::time::Duration;

use common::*;

/// How many of `tries` one-unit acquires of `limit` are granted, each asked at once.
async fn granted_of(client: &tollgate_cli::client::Client, limit: &str, tries: usize) -> usize {
    let mut granted = 0;
    for _ in 0..tries {
        let answer = post(
            client,
            "/v1/acquire",
            &format!(r#"{{"limits":["{limit}"]}}"#),
        )
        .await;
        match answer.status.as_u16() {
            200 => granted += 1,
            429 => {}
            other => panic!("acquire answered {other}: {}", answer.text()),
        }
    }
    granted
}

/// Wait until `n` requests wait on `limit`, as the server's stats say.
async fn until_waiting(server: &Server, limit: &str, n: u64) {
    let admin = server.admin();
    until(&format!("{n} waiting on {limit}"), async || {
        let answer = call(&admin, hyper::Method::GET, "/v1/stats", "").await;
        answer.json.as_ref().is_some_and(|json| {
            json["limits"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|entry| entry["name"] == limit && entry["waiting"].as_u64() == Some(n))
        })
    })
    .await;
}

/// One unit of an hourly limit of 10 kept through `attacked`, then all 10 asked there with a
/// minute's wait: the waiter can never be granted in time, so the callers of `others` still
/// get the nine free units. `why`: the assertion's message.
async fn an_hourly_waiter_holds_nobody_back(attacked: &Server, others: &Server, why: &str) {
    for server in [attacked, others] {
        put_limit(
            server,
            "hourly",
            r#"{"kind":"rate","limit":10,"period_ms":3600000}"#,
        )
        .await;
    }
    assert_eq!(granted_of(&attacked.admin(), "hourly", 1).await, 1);
    let waiter = {
        let client = attacked.admin();
        tokio::spawn(async move {
            post(
                &client,
                "/v1/acquire",
                r#"{"limits":["hourly"],"cost":10,"wait_ms":60000}"#,
            )
            .await
        })
    };
    until_waiting(attacked, "hourly", 1).await;
    assert_eq!(granted_of(&others.admin(), "hourly", 9).await, 9, "{why}");
    waiter.abort();
}

/// On one server, a waiter that cannot be granted in time locks its limit's other callers out
/// of nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_be_granted_in_time_locks_nobody_out() {
    let server = Server::start();
    an_hourly_waiter_holds_nobody_back(
        &server,
        &server,
        "the other callers were locked out by a waiter that cannot be granted",
    )
    .await;
}

/// A lease of five kept and renewed, and a waiter for all five asked again and again: the
/// waiter holds the others back for one lease TTL at most, and asking again buys no new hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_holds_a_concurrency_limit_for_one_lease_ttl_at_most() {
    let server = Server::start();
    put_limit(
        &server,
        "pool",
        r#"{"kind":"concurrency","limit":5,"lease_ttl_ms":2000}"#,
    )
    .await;
    let attacker = server.admin();
    let lease = granted(&attacker, r#"{"limits":["pool"]}"#).await;
    let lease = permit_of(&lease);
    let renewer = {
        let client = server.admin();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let answer = post(&client, &format!("/v1/permits/{lease}/renew"), "{}").await;
                assert_eq!(answer.status, 200, "renew: {}", answer.text());
            }
        })
    };
    let ask_all = |client: tollgate_cli::client::Client| {
        tokio::spawn(async move {
            post(
                &client,
                "/v1/acquire",
                r#"{"limits":["pool"],"cost":5,"wait_ms":60000}"#,
            )
            .await
        })
    };
    let first = ask_all(server.admin());
    until_waiting(&server, "pool", 1).await;
    // Past one TTL (and generous room for a slow machine), the others are served.
    let others = server.admin();
    until(
        "a caller of the pool granted past the waiter's hold",
        async || {
            let answer = post(&others, "/v1/acquire", r#"{"limits":["pool"]}"#).await;
            if answer.status == 200 {
                let permit = permit_of(answer.json.as_ref().expect("json"));
                post(
                    &others,
                    &format!("/v1/permits/{permit}/commit"),
                    r#"{"used":0}"#,
                )
                .await;
                true
            } else {
                false
            }
        },
    )
    .await;
    first.abort();
    // Asked again at once, the same cost holds nobody back.
    let second = ask_all(server.admin());
    until_waiting(&server, "pool", 1).await;
    assert_eq!(
        granted_of(&others, "pool", 4).await,
        4,
        "asking again bought the waiter a new hold"
    );
    second.abort();
    renewer.abort();
}

/// A scoped token's `cost_max` refuses a larger request, and its `wait_max_ms` cuts a longer
/// wait; both are listed with the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_bounds_the_cost_and_the_wait_of_its_requests() {
    let server = Server::start();
    put_limit(
        &server,
        "search",
        r#"{"kind":"rate","limit":100,"period_ms":60000}"#,
    )
    .await;
    let made = post(
        &server.admin(),
        "/v1/tokens",
        r#"{"name":"search-bot","limits":["search"],"cost_max":5,"wait_max_ms":200}"#,
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.text());
    let json = made.json.expect("json");
    assert_eq!(json["cost_max"], 5);
    assert_eq!(json["wait_max_ms"], 200);
    let scoped = server.with_token(json["secret"].as_str().expect("secret"));
    // A bound that bounds nothing, or past what the document allows, is refused naming it.
    for (body, field) in [
        (
            r#"{"name":"zero","limits":["search"],"cost_max":0}"#,
            "cost_max",
        ),
        (
            r#"{"name":"zero","limits":["search"],"wait_max_ms":0}"#,
            "wait_max_ms",
        ),
        (
            r#"{"name":"huge","limits":["search"],"cost_max":1000000001}"#,
            "cost_max",
        ),
    ] {
        let refused = post(&server.admin(), "/v1/tokens", body).await;
        assert_error(&refused, 400, "bad_request", Some(field));
    }
    // Every way to ask for units is held to it: one cost, a cost per limit, a charge.
    for (path, body) in [
        ("/v1/acquire", r#"{"limits":["search"],"cost":6}"#),
        (
            "/v1/acquire",
            r#"{"limits":["search"],"costs":{"search":6}}"#,
        ),
        ("/v1/charge", r#"{"limits":["search"],"cost":6}"#),
        (
            "/v1/charge",
            r#"{"limits":["search"],"costs":{"search":6}}"#,
        ),
    ] {
        let over = post(&scoped, path, body).await;
        assert_eq!(over.status.as_u16(), 403, "{path} {body}: {}", over.text());
        assert!(over.text().contains("cost_max"), "{}", over.text());
    }
    assert_eq!(
        post(&scoped, "/v1/acquire", r#"{"limits":["search"],"cost":5}"#)
            .await
            .status,
        200
    );
    // 95 of 100 left: a request for 96 waits at most 200 ms, not the minute it asks.
    let started = std::time::Instant::now();
    let capped = post(
        &server.admin(),
        "/v1/acquire",
        r#"{"limits":["search"],"cost":95}"#,
    )
    .await;
    assert_eq!(capped.status, 200, "{}", capped.text());
    let waited = post(
        &scoped,
        "/v1/acquire",
        r#"{"limits":["search"],"cost":1,"wait_ms":60000}"#,
    )
    .await;
    assert_eq!(waited.status.as_u16(), 429, "{}", waited.text());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the wait was not cut to the token's wait_max_ms"
    );
    let listed = call(&server.admin(), hyper::Method::GET, "/v1/tokens", "").await;
    let listed = listed.json.expect("json");
    assert_eq!(listed["tokens"][0]["cost_max"], 5);
    assert_eq!(listed["tokens"][0]["wait_max_ms"], 200);
}

/// One token's waiting requests are bounded (`waiters_per_token_max`): past it, its requests are
/// answered at once, naming the bound, and callers of other limits still wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_cannot_fill_the_waiting_lines() {
    let server = Server::start_with(Options {
        args: vec!["--waiters-per-token-max", "2"],
        ..Options::default()
    });
    for name in ["mine", "theirs"] {
        put_limit(
            &server,
            name,
            r#"{"kind":"rate","limit":1,"period_ms":3600000}"#,
        )
        .await;
        assert_eq!(granted_of(&server.admin(), name, 1).await, 1);
    }
    let made = post(
        &server.admin(),
        "/v1/tokens",
        r#"{"name":"flooder","limits":["mine"]}"#,
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.text());
    let secret = made.json.expect("json")["secret"]
        .as_str()
        .expect("secret")
        .to_owned();
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let scoped = server.with_token(&secret);
        waiting.push(tokio::spawn(async move {
            post(
                &scoped,
                "/v1/acquire",
                r#"{"limits":["mine"],"wait_ms":60000}"#,
            )
            .await
        }));
    }
    until_waiting(&server, "mine", 2).await;
    let third = post(
        &server.with_token(&secret),
        "/v1/acquire",
        r#"{"limits":["mine"],"wait_ms":60000}"#,
    )
    .await;
    assert_eq!(third.status.as_u16(), 429, "{}", third.text());
    assert!(
        third.text().contains("waiters_per_token_max"),
        "{}",
        third.text()
    );
    // Another caller, on another limit, still waits.
    let other = {
        let client = server.admin();
        tokio::spawn(async move {
            post(
                &client,
                "/v1/acquire",
                r#"{"limits":["theirs"],"wait_ms":60000}"#,
            )
            .await
        })
    };
    until_waiting(&server, "theirs", 1).await;
    other.abort();
    for task in waiting {
        task.abort();
    }
}

/// Two replicas on one Redis: one unit of an hourly limit of 10 kept and all 10 asked with a
/// minute's wait through the first; the waiter can never be granted in time, so it holds no
/// place in the fleet's queue, and the second replica's callers still get the nine free units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_waiter_that_cannot_be_granted_in_time_holds_back_no_replica() {
    let Ok(redis) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(
            "on_redis_a_waiter_that_cannot_be_granted_in_time_holds_back_no_replica: \
             TOLLGATE_TEST_REDIS is unset, so it did not run against Redis",
        );
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    let namespace = format!("waiting-{}-{nanos}", std::process::id());
    let start = || {
        Server::start_with(Options {
            args: vec!["--store", &redis, "--redis-namespace", &namespace],
            ..Options::default()
        })
    };
    let (first, second) = (start(), start());
    an_hourly_waiter_holds_nobody_back(
        &first,
        &second,
        "another replica's callers were held back by a waiter that cannot be granted",
    )
    .await;
}

/// One closed-loop caller at `priority` on `limit`, each acquire waiting up to a minute, until
/// `stop`: the grants it got.
async fn closed_loop(
    client: tollgate_cli::client::Client,
    limit: &'static str,
    priority: &'static str,
    stop: std::time::Instant,
) -> u64 {
    let mut granted = 0;
    while std::time::Instant::now() < stop {
        let answer = post(
            &client,
            "/v1/acquire",
            &format!(r#"{{"limits":["{limit}"],"priority":"{priority}","wait_ms":60000}}"#),
        )
        .await;
        match answer.status.as_u16() {
            200 => granted += 1,
            429 => {}
            other => panic!("acquire answered {other}: {}", answer.text()),
        }
    }
    granted
}

/// `high` callers that ask again as soon as they are granted keep a saturated limit to
/// themselves under strict priority; with `--min-share-low-percent`, a waiting `low` caller gets its
/// share of every period all the same. The share's exact figures are the engine's tests'
/// (on a paused clock); here, on the wall clock, that `low` is served at all, and never past
/// the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_share_serves_a_waiting_low_level_that_strict_priority_starves() {
    let server = Server::start_with(Options {
        args: vec!["--min-share-low-percent", "25"],
        ..Options::default()
    });
    put_limit(
        &server,
        "shared",
        r#"{"kind":"rate","limit":8,"period_ms":1000}"#,
    )
    .await;
    let stop = std::time::Instant::now() + Duration::from_secs(4);
    // Three of them, so that one always waits while another is being answered.
    let highs: Vec<_> = (0..3)
        .map(|_| tokio::spawn(closed_loop(server.admin(), "shared", "high", stop)))
        .collect();
    let low = tokio::spawn(closed_loop(server.admin(), "shared", "low", stop));
    let mut high = 0;
    for caller in highs {
        high += caller.await.expect("high");
    }
    let low = low.await.expect("low");
    println!("high {high} low {low}");
    // At most 8 a second over about 4 s, and the first period's 8 at once: 5 periods at most,
    // with a second of slack for a slow machine's late answers.
    assert!(high + low <= 8 * 6, "high {high} low {low}");
    assert!(
        low >= 2,
        "the low level got {low} grants beside high's {high}"
    );
}

/// Shares over a whole period stop `serve` before it listens, naming both settings.
#[test]
fn serve_refuses_minimum_shares_over_the_whole_period() {
    let directory = tempfile::tempdir().expect("tempdir");
    let output = command(directory.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--min-share-normal-percent",
            "60",
            "--min-share-low-percent",
            "50",
        ])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("min_share_normal_percent") && said.contains("min_share_low_percent"),
        "{said}"
    );
}
