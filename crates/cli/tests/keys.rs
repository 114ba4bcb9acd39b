//! Hostile callers of one limit, against the real `tollgate serve` on the memory store (and on
//! Redis, where `TOLLGATE_TEST_REDIS` names one): a flood of keys on one limit takes no room
//! from any other (each limit counted per key has its own budget, an unkeyed limit is never
//! refused for a cap; on Redis, what Redis holds for the flooded limit stays within its
//! budget), and a pause has an owner and an end (an administrator lifts it, deleting or
//! changing the limit clears it, `pause_ms_max` cuts it, and a key's pause counts against its
//! limit's budget).

mod common;

use common::*;
use hyper::Method;
use tollgate_cli::client::Answer;

const PER_USER: &str = r#"{"kind":"rate","limit":5,"period_ms":60000,"per":"user"}"#;
const UNKEYED: &str = r#"{"kind":"rate","limit":5,"period_ms":60000}"#;

async fn acquire(server: &Server, limit: &str, key: Option<&str>) -> Answer {
    let body = match key {
        Some(key) => format!(r#"{{"limits":["{limit}"],"key":"{key}"}}"#),
        None => format!(r#"{{"limits":["{limit}"]}}"#),
    };
    post(&server.anonymous(), "/v1/acquire", &body).await
}

async fn pause(server: &Server, limit: &str, key: Option<&str>, ms: u64) -> Answer {
    let body = match key {
        Some(key) => format!(r#"{{"limit":"{limit}","key":"{key}","retry_after_ms":{ms}}}"#),
        None => format!(r#"{{"limit":"{limit}","retry_after_ms":{ms}}}"#),
    };
    post(&server.anonymous(), "/v1/pause", &body).await
}

/// One request for each of `count` new keys of `limit`; how many were refused 503.
async fn flood(server: &Server, limit: &str, count: usize) -> usize {
    let mut refused = 0;
    for index in 0..count {
        let answer = acquire(server, limit, Some(&format!("flood-{index}"))).await;
        match answer.status.as_u16() {
            200 => {}
            503 => refused += 1,
            other => panic!("flooding {limit}: {other} {}", answer.text()),
        }
    }
    refused
}

#[track_caller]
fn assert_granted(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 200, "{what}: {}", answer.text());
}

#[track_caller]
fn assert_paused(answer: &Answer, what: &str) {
    assert_error(answer, 429, "rate_limited", None);
    let reason = answer.json.as_ref().map(|json| json["reason"].clone());
    assert_eq!(reason, Some("paused".into()), "{what}: {}", answer.text());
}

async fn resume(client: &tollgate_cli::client::Client, path: &str) -> Answer {
    call(client, Method::DELETE, path, "").await
}

/// The test Redis and a namespace of the test's own, or `None` (said loudly) without one.
fn test_redis(test: &str) -> Option<(String, String)> {
    let Ok(url) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(&format!(
            "{test}: TOLLGATE_TEST_REDIS is unset, so it did not run against Redis"
        ));
        return None;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    Some((url, format!("keys-{}-{nanos}", std::process::id())))
}

/// The `c:` keys (counter states) Redis holds for `limit`'s keys in `namespace`, walked with
/// `SCAN`: what the server's answers do not say.
async fn redis_states_of(url: &str, namespace: &str, limit: &str) -> usize {
    let client = redis::Client::open(url).expect("url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let pattern = format!("tg:{{*}}:{namespace}:c:{}:{limit}:*", limit.len());
    let (mut cursor, mut found) = (0u64, 0);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut connection)
            .await
            .expect("scan");
        found += keys.len();
        if next == 0 {
            return found;
        }
        cursor = next;
    }
}

/// A budget of a tenth of the store's cap per limit: 10 keys each.
fn keyed_server(store: &[&str]) -> Server {
    let mut args = vec!["--keys-tracked-max", "100"];
    args.extend_from_slice(store);
    Server::start_with(Options {
        args,
        ..Options::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_limit_takes_no_room_from_another() {
    flooded_limit_takes_no_room_from_another(&keyed_server(&[])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_flooded_limit_takes_no_room_from_another_and_redis_holds_its_budget() {
    let test = "on_redis_a_flooded_limit_takes_no_room_from_another_and_redis_holds_its_budget";
    let Some((url, namespace)) = test_redis(test) else {
        return;
    };
    let server = keyed_server(&["--store", &url, "--redis-namespace", &namespace]);
    flooded_limit_takes_no_room_from_another(&server).await;
    assert_eq!(redis_states_of(&url, &namespace, "a").await, 10);
    // A key's pause makes a counter: refused for the full limit, as a request's key is.
    let refused = pause(&server, "a", Some("paused"), 60_000).await;
    assert_error(&refused, 503, "too_many_keys", None);
    assert_eq!(
        pause(&server, "b", Some("paused"), 60_000).await.status,
        200
    );
}

async fn flooded_limit_takes_no_room_from_another(server: &Server) {
    put_limit(server, "a", PER_USER).await;
    put_limit(server, "b", PER_USER).await;
    put_limit(server, "c", UNKEYED).await;
    assert_granted(&acquire(server, "b", Some("known")).await, "b's first user");
    let refused = flood(server, "a", 150).await;
    assert_granted(&acquire(server, "b", Some("new")).await, "a new user of b");
    assert_granted(&acquire(server, "c", None).await, "c's first use");
    assert_eq!(refused, 140, "a keeps 10 keys and refuses the rest");
    let refused = acquire(server, "a", Some("one-more")).await;
    assert_error(&refused, 503, "too_many_keys", None);
    let message = refused.error_message().unwrap_or_default();
    assert!(
        message.contains("\"a\"") && message.contains("10 keys"),
        "names the limit and its budget: {message}"
    );
    // A known key of the flooded limit still counts as before.
    assert_granted(&acquire(server, "a", Some("flood-0")).await, "a known key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_store_cap_stops_a_limit_with_a_large_budget_and_never_an_unkeyed_one() {
    let server = Server::start_with(Options {
        args: vec!["--keys-tracked-max", "40"],
        ..Options::default()
    });
    put_limit(
        &server,
        "big",
        r#"{"kind":"rate","limit":5,"period_ms":60000,"per":"user","keys_max":1000}"#,
    )
    .await;
    put_limit(&server, "b", PER_USER).await;
    put_limit(&server, "c", UNKEYED).await;
    let stored = call(&server.admin(), Method::GET, "/v1/limits/big", "").await;
    assert_eq!(stored.json.expect("json")["keys_max"], 1000);
    assert_eq!(flood(&server, "big", 50).await, 10, "the store's cap of 40");
    let refused = acquire(&server, "b", Some("new")).await;
    assert_error(&refused, 503, "too_many_keys", None);
    assert!(
        refused
            .error_message()
            .is_some_and(|message| message.contains("keys_tracked_max")),
        "{}",
        refused.text()
    );
    assert_granted(
        &acquire(&server, "c", None).await,
        "an unkeyed limit at the cap",
    );
    let refused = call(
        &server.admin(),
        Method::PUT,
        "/v1/limits/d",
        r#"{"kind":"rate","limit":5,"period_ms":60000,"keys_max":10}"#,
    )
    .await;
    assert_error(&refused, 400, "bad_request", Some("keys_max"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_pause_counts_against_its_limits_budget() {
    let server = Server::start_with(Options {
        args: vec!["--keys-tracked-max", "100"],
        ..Options::default()
    });
    put_limit(&server, "a", PER_USER).await;
    put_limit(&server, "b", PER_USER).await;
    let mut refused = 0;
    for index in 0..20 {
        let answer = pause(&server, "a", Some(&format!("p{index}")), 60_000).await;
        match answer.status.as_u16() {
            200 => {}
            503 => {
                assert_error(&answer, 503, "too_many_keys", None);
                refused += 1;
            }
            other => panic!("pause: {other} {}", answer.text()),
        }
    }
    assert_eq!(
        refused, 10,
        "a's budget of 10 keys holds its paused keys too"
    );
    assert_granted(&acquire(&server, "b", Some("new")).await, "a new user of b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrator_lifts_a_pause_and_a_pause_is_cut_to_pause_ms_max() {
    let server = Server::start();
    put_limit(&server, "solo", UNKEYED).await;
    put_limit(&server, "per", PER_USER).await;

    // A data caller asks for a day; the server's longest pause is an hour.
    let paused = pause(&server, "solo", None, 86_400_000).await;
    assert_eq!(paused.status, 200, "{}", paused.text());
    let paused_ms = paused.json.as_ref().expect("json")["paused_ms"]
        .as_u64()
        .expect("paused_ms");
    assert!(
        paused_ms > 0 && paused_ms <= 3_600_000,
        "cut to pause_ms_max: {paused_ms}"
    );
    assert_paused(&acquire(&server, "solo", None).await, "solo");

    // Lifting is the administrator's.
    for client in [server.anonymous(), server.with_token("wrong")] {
        let answer = resume(&client, "/v1/limits/solo/pause").await;
        assert_error(&answer, 401, "unauthorized", None);
    }
    let lifted = resume(&server.admin(), "/v1/limits/solo/pause").await;
    assert_eq!(lifted.status, 200, "{}", lifted.text());
    assert_eq!(
        lifted.json.expect("json"),
        serde_json::json!({"limit": "solo", "resumed": true})
    );
    assert_granted(&acquire(&server, "solo", None).await, "solo after resume");
    let again = resume(&server.admin(), "/v1/limits/solo/pause").await;
    assert_eq!(again.json.expect("json")["resumed"], false);

    // One key's pause, lifted by its key.
    assert_eq!(pause(&server, "per", Some("u1"), 600_000).await.status, 200);
    assert_paused(&acquire(&server, "per", Some("u1")).await, "u1");
    assert_granted(&acquire(&server, "per", Some("u2")).await, "u2");
    let lifted = resume(&server.admin(), "/v1/limits/per/pause?key=u1").await;
    assert_eq!(lifted.json.expect("json")["resumed"], true);
    assert_granted(
        &acquire(&server, "per", Some("u1")).await,
        "u1 after resume",
    );

    // Refusals name what is wrong.
    let unknown = resume(&server.admin(), "/v1/limits/nothing/pause").await;
    assert_error(&unknown, 404, "not_found", None);
    let keyed = resume(&server.admin(), "/v1/limits/solo/pause?key=u1").await;
    assert_error(&keyed, 400, "bad_request", Some("key"));
    let typo = resume(&server.admin(), "/v1/limits/per/pause?kee=u1").await;
    assert_error(&typo, 400, "bad_request", Some("kee"));

    // The command line.
    assert_eq!(pause(&server, "solo", None, 600_000).await.status, 200);
    let output = command(server.directory.path())
        .args(["limits", "resume", "solo"])
        .env("TOLLGATE_SERVER", &server.url)
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    assert_granted(&acquire(&server, "solo", None).await, "after limits resume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_or_changing_a_limit_clears_its_pauses() {
    let server = Server::start();
    let admin = server.admin();
    put_limit(&server, "solo", UNKEYED).await;
    put_limit(&server, "per", PER_USER).await;
    assert_eq!(pause(&server, "solo", None, 600_000).await.status, 200);
    assert_eq!(pause(&server, "per", None, 600_000).await.status, 200);
    assert_eq!(pause(&server, "per", Some("u1"), 600_000).await.status, 200);

    for name in ["solo", "per"] {
        let deleted = call(&admin, Method::DELETE, &format!("/v1/limits/{name}"), "").await;
        assert_eq!(deleted.status, 200, "{}", deleted.text());
    }
    put_limit(&server, "solo", UNKEYED).await;
    put_limit(&server, "per", PER_USER).await;
    assert_granted(&acquire(&server, "solo", None).await, "solo made again");
    assert_granted(
        &acquire(&server, "per", Some("u1")).await,
        "u1 of per made again",
    );

    // A change of kind: a new limit under the old name.
    assert_eq!(pause(&server, "solo", None, 600_000).await.status, 200);
    put_limit(
        &server,
        "solo",
        r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":60000}"#,
    )
    .await;
    assert_granted(&acquire(&server, "solo", None).await, "solo as a pool");
    // A change within the kind keeps the pause (a vendor's answer still stands).
    assert_eq!(pause(&server, "per", Some("u1"), 600_000).await.status, 200);
    put_limit(
        &server,
        "per",
        r#"{"kind":"rate","limit":9,"period_ms":60000,"per":"user"}"#,
    )
    .await;
    assert_paused(
        &acquire(&server, "per", Some("u1")).await,
        "u1 of per, reshaped",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_restores_each_limit_within_its_budget() {
    let mut server = Server::start_with(Options {
        args: vec!["--keys-tracked-max", "100"],
        ..Options::default()
    });
    let one_per_minute = r#"{"kind":"rate","limit":1,"period_ms":3600000,"per":"user"}"#;
    put_limit(&server, "a", one_per_minute).await;
    put_limit(&server, "b", one_per_minute).await;
    assert_eq!(flood(&server, "a", 10).await, 0);
    assert_granted(&acquire(&server, "b", Some("used")).await, "b's user");
    assert!(server.terminate().success(), "{}", server.log());

    // Restarted with a budget of 5: a's ten counters cannot all come back, so a is held;
    // b's one counter comes back as it was.
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("dir"));
    let restarted = Server::start_with(Options {
        args: vec!["--keys-tracked-max", "100", "--keys-per-limit-max", "5"],
        directory: Some(directory),
        ..Options::default()
    });
    for index in 0..10 {
        let answer = acquire(&restarted, "a", Some(&format!("flood-{index}"))).await;
        assert!(
            matches!(answer.status.as_u16(), 429 | 503),
            "a unit counted before the restart granted again: {}",
            answer.text()
        );
    }
    let log = restarted.log();
    assert!(
        log.contains("some saved counters could not be restored") && log.contains("\"a\""),
        "{log}"
    );
    let used = acquire(&restarted, "b", Some("used")).await;
    assert_error(&used, 429, "rate_limited", None);
    assert_eq!(used.json.expect("json")["reason"], "capacity");
    assert_granted(&acquire(&restarted, "b", Some("new")).await, "b's new user");
}

/// Envoy's service on the memory store: every limit of its configuration has its own budget,
/// so a caller sending new values of one descriptor fills only that limit's, and a new value of
/// another descriptor, or a descriptor with a fixed value first seen, is decided as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_flooded_descriptor_takes_no_room_from_another() {
    envoy_flooded_descriptor_takes_no_room_from_another(&[]).await;
}

/// The same on Redis: Envoy's limits have their budgets there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_through_envoy_a_flooded_descriptor_takes_no_room_from_another() {
    let test = "on_redis_through_envoy_a_flooded_descriptor_takes_no_room_from_another";
    let Some((url, namespace)) = test_redis(test) else {
        return;
    };
    envoy_flooded_descriptor_takes_no_room_from_another(&[
        "--store",
        &url,
        "--redis-namespace",
        &namespace,
    ])
    .await;
}

async fn envoy_flooded_descriptor_takes_no_room_from_another(store: &[&str]) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let directory = tempfile::tempdir().expect("tempdir");
    let server = Server::start_envoy(
        directory,
        "domain: api\ndescriptors:\n  \
       - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  \
       - key: account\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  \
       - key: route\n    value: search\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        &[&["--keys-tracked-max", "100"], store].concat(),
    );
    let url = server.grpc.clone().expect("the gRPC address");
    let mut client = RateLimitServiceClient::connect(url).await.expect("connect");
    let mut ask = async |key: &str, value: &str| {
        let request = RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: value.into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await.expect("answered");
        Code::try_from(answer.into_inner().overall_code).expect("a code")
    };
    assert_eq!(ask("account", "known").await, Code::Ok);
    let mut refused = 0;
    for index in 0..150 {
        if ask("user", &format!("flood-{index}")).await == Code::OverLimit {
            refused += 1;
        }
    }
    assert_eq!(ask("account", "new").await, Code::Ok, "a new account");
    assert_eq!(
        ask("route", "search").await,
        Code::Ok,
        "a fixed descriptor's first use"
    );
    assert_eq!(refused, 140, "the user limit keeps its budget of 10 keys");
    assert_eq!(ask("user", "flood-0").await, Code::Ok, "a known user");
}
