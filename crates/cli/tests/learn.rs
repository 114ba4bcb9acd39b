//! `POST /v1/learn` and `sent_after_ms` over the real binary: a vendor's advertised quota
//! lowers what the server grants to every caller, `remaining` 0 pauses the limit, a commit's
//! reported delay widens the margin, and teaching is a power held to its bounds: only a token
//! that may pause may teach, never below the floor, never above the configured limit, and
//! bad lessons are refused naming the field. Grants are counted here, by acquiring.

mod common;

use common::*;

const DATA_TOKEN: &str = "data-token-for-tests";

fn server() -> Server {
    Server::start_with(Options {
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_DATA_TOKEN", DATA_TOKEN),
        ],
        ..Options::default()
    })
}

/// Acquires granted at once, until the first refusal.
async fn burst(client: &tollgate_cli::client::Client, limit: &str) -> u64 {
    let mut granted = 0;
    loop {
        let answer = post(
            client,
            "/v1/acquire",
            &format!(r#"{{"limits":["{limit}"]}}"#),
        )
        .await;
        match answer.status.as_u16() {
            200 => granted += 1,
            429 => return granted,
            other => panic!("acquire answered {other}: {}", answer.text()),
        }
        assert!(granted <= 1_000, "no end to the grants");
    }
}

async fn stats(server: &Server) -> serde_json::Value {
    let answer = call(
        &server.with_token(DATA_TOKEN),
        hyper::Method::GET,
        "/v1/stats",
        "",
    )
    .await;
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.text());
    serde_json::from_slice(&answer.body).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advertised_quota_lowers_what_every_caller_is_granted() {
    let server = server();
    // A long period: the test's own slowness cannot free units between its steps.
    put_limit(
        &server,
        "vendor",
        r#"{"kind":"rate","limit":20,"period_ms":600000}"#,
    )
    .await;
    let data = server.with_token(DATA_TOKEN);
    let answer = post(
        &data,
        "/v1/learn",
        r#"{"limit":"vendor","source":"x-ratelimit-limit from vendor.test","quotas":[{"quota":8}]}"#,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let json = answer.json.clone().expect("json");
    assert_eq!(json["configured"], 20);
    assert_eq!(json["effective"], 8);
    assert_eq!(json["learned"]["kind"], "advertised");
    assert_eq!(
        json["learned"]["source"],
        "x-ratelimit-limit from vendor.test"
    );
    assert!(
        json["learned"]["expires_in_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 500_000)
    );
    assert_eq!(json["paused_ms"], 0);
    assert_eq!(
        burst(&data, "vendor").await,
        8,
        "the vendor's quota, for every caller"
    );

    let stats = stats(&server).await;
    let limit = stats["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .find(|limit| limit["name"] == "vendor")
        .expect("vendor");
    assert_eq!(limit["learned"]["effective"], 8);
    assert_eq!(
        limit["learned"]["learned"]["source"],
        "x-ratelimit-limit from vendor.test"
    );

    // The vendor advertises more than configured: the configured limit is back, never more.
    let answer = post(
        &data,
        "/v1/learn",
        r#"{"limit":"vendor","source":"x-ratelimit-limit","quotas":[{"quota":100}]}"#,
    )
    .await;
    assert_eq!(answer.json.expect("json")["effective"], 20);
    assert_eq!(
        burst(&data, "vendor").await,
        12,
        "20 in all, 8 of them already taken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remaining_zero_pauses_the_limit_until_the_reset() {
    let server = server();
    put_limit(
        &server,
        "vendor",
        r#"{"kind":"rate","limit":20,"period_ms":1000}"#,
    )
    .await;
    let data = server.with_token(DATA_TOKEN);
    let answer = post(
        &data,
        "/v1/learn",
        r#"{"limit":"vendor","source":"ratelimit","remaining":0,"reset_ms":60000}"#,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let paused_ms = answer.json.expect("json")["paused_ms"]
        .as_u64()
        .expect("paused_ms");
    assert!((59_000..=60_000).contains(&paused_ms), "{paused_ms}");
    let refused = post(&data, "/v1/acquire", r#"{"limits":["vendor"]}"#).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.json.expect("json")["reason"], "paused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_delay_widens_the_margin() {
    let server = server();
    put_limit(
        &server,
        "vendor",
        r#"{"kind":"rate","limit":10,"period_ms":1000}"#,
    )
    .await;
    let data = server.with_token(DATA_TOKEN);
    let grant = granted(&data, r#"{"limits":["vendor"]}"#).await;
    let commit = post(
        &data,
        &format!("/v1/permits/{}/commit", permit_of(&grant)),
        r#"{"used":1,"sent_after_ms":12}"#,
    )
    .await;
    assert_eq!(commit.status, 200, "{}", commit.text());
    let stats = stats(&server).await;
    let learned = &stats["limits"][0]["learned"];
    assert_eq!(learned["delay_ms"], 12);
    assert_eq!(learned["margin_ms"], 25);
    let grant = granted(&data, r#"{"limits":["vendor"]}"#).await;
    let too_long = post(
        &data,
        &format!("/v1/permits/{}/commit", permit_of(&grant)),
        r#"{"used":1,"sent_after_ms":3600001}"#,
    )
    .await;
    assert_error(&too_long, 400, "bad_request", Some("sent_after_ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teaching_is_a_power_held_to_its_bounds() {
    let server = server();
    put_limit(
        &server,
        "vendor",
        r#"{"kind":"rate","limit":50,"period_ms":600000}"#,
    )
    .await;
    put_limit(
        &server,
        "per-user",
        r#"{"kind":"rate","limit":50,"period_ms":1000,"per":"user"}"#,
    )
    .await;
    put_limit(
        &server,
        "conn",
        r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":1000}"#,
    )
    .await;
    // A token that may acquire but not pause may not teach.
    let made = post(
        &server.admin(),
        "/v1/tokens",
        r#"{"name":"worker","limits":["vendor"],"may_pause":false}"#,
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.text());
    let secret = made.json.expect("json")["secret"]
        .as_str()
        .expect("secret")
        .to_owned();
    let worker = server.with_token(&secret);
    let lesson = r#"{"limit":"vendor","source":"forged","quotas":[{"quota":1}]}"#;
    let refused = post(&worker, "/v1/learn", lesson).await;
    assert_error(&refused, 403, "forbidden", None);
    assert_eq!(
        burst(&worker, "vendor").await,
        50,
        "the refused lesson changed nothing"
    );

    // One that may: a hostile quota of 1 stops at the floor, a tenth of 50.
    let data = server.with_token(DATA_TOKEN);
    let floor = post(
        &data,
        "/v1/learn",
        r#"{"limit":"conn","source":"x","quotas":[{"quota":1}]}"#,
    )
    .await;
    assert_error(&floor, 400, "bad_request", Some("limit"));
    let answer = post(&data, "/v1/learn", lesson).await;
    assert_eq!(answer.json.expect("json")["effective"], 5);

    for (body, field) in [
        (r#"{"limit":"vendor","source":"","quotas":[]}"#, "source"),
        (r#"{"limit":"vendor","source":"a\u0001b"}"#, "source"),
        (
            r#"{"limit":"vendor","source":"x","quotas":[{"quota":0}]}"#,
            "quotas",
        ),
        (
            r#"{"limit":"vendor","source":"x","quotas":[{"quota":1,"window_ms":0}]}"#,
            "quotas[0].window_ms",
        ),
        (
            r#"{"limit":"vendor","source":"x","quotas":[{"quota":1},{"quota":1},{"quota":1},{"quota":1},{"quota":1},{"quota":1},{"quota":1},{"quota":1},{"quota":1}]}"#,
            "quotas",
        ),
        (
            r#"{"limit":"per-user","source":"x","rate_limited":true}"#,
            "limit",
        ),
        (r#"{"limit":"vendor","source":"x","quota":3}"#, "quota"),
    ] {
        let answer = post(&data, "/v1/learn", body).await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
    let unknown = post(
        &data,
        "/v1/learn",
        r#"{"limit":"nope","source":"x","rate_limited":true}"#,
    )
    .await;
    assert_eq!(unknown.status, 404, "{}", unknown.text());
}

/// Two replicas on one Redis namespace: what one is taught, and a margin a delay widens on
/// one, the other puts in force, counted by acquiring through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_what_one_replica_learns_the_other_puts_in_force() {
    let Ok(redis) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(
            "on_redis_what_one_replica_learns_the_other_puts_in_force: TOLLGATE_TEST_REDIS is \
             unset, so it did not run against Redis",
        );
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    let namespace = format!("learn-{}-{nanos}", std::process::id());
    let start = || {
        Server::start_with(Options {
            env: vec![
                ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
                ("TOLLGATE_DATA_TOKEN", DATA_TOKEN),
                ("TOLLGATE_PERMIT_SECRET", "00112233445566778899aabbccddeeff"),
            ],
            args: vec!["--store", &redis, "--redis-namespace", &namespace],
            ..Options::default()
        })
    };
    let (first, second) = (start(), start());
    for server in [&first, &second] {
        put_limit(
            server,
            "vendor",
            r#"{"kind":"rate","limit":20,"period_ms":600000}"#,
        )
        .await;
    }
    let taught = post(
        &first.with_token(DATA_TOKEN),
        "/v1/learn",
        r#"{"limit":"vendor","source":"x-ratelimit-limit from vendor.test","quotas":[{"quota":8}]}"#,
    )
    .await;
    assert_eq!(taught.status, 200, "{}", taught.text());
    until("the second replica puts the lesson in force", async || {
        stats(&second).await["limits"][0]["learned"]["effective"] == 8
    })
    .await;
    assert_eq!(burst(&second.with_token(DATA_TOKEN), "vendor").await, 8);

    let data = first.with_token(DATA_TOKEN);
    put_limit(
        &first,
        "fast",
        r#"{"kind":"rate","limit":10,"period_ms":1000}"#,
    )
    .await;
    put_limit(
        &second,
        "fast",
        r#"{"kind":"rate","limit":10,"period_ms":1000}"#,
    )
    .await;
    let grant = granted(&data, r#"{"limits":["fast"]}"#).await;
    let commit = post(
        &data,
        &format!("/v1/permits/{}/commit", permit_of(&grant)),
        r#"{"used":1,"sent_after_ms":40}"#,
    )
    .await;
    assert_eq!(commit.status, 200, "{}", commit.text());
    until("the second replica widens its margin", async || {
        let stats = stats(&second).await;
        let fast = stats["limits"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|limit| limit["name"] == "fast")
            .cloned()
            .unwrap_or_default();
        fast["learned"]["margin_ms"] == 50
    })
    .await;
}
