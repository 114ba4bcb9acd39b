//! The store under a hostile caller, over the real binary: a store that answered with a failure
//! (a full key cap, Redis out of memory) is never taken for an unreachable one, so failing open
//! never grants past a limit; a Redis that may evict Tollgate's keys is refused at start and
//! reported by `/readyz`; and a counter Redis evicted is never read as a fresh one. Every Redis
//! here is a private `redis-server` on a port of its own, with its own memory settings, so the
//! shared one is never reconfigured.

mod common;
#[path = "../../redis/tests/nodes/mod.rs"]
mod nodes;

use common::{Options, Server, assert_error, post, put_limit};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hyper::Method;
use nodes::Single;

/// A private Redis started with `extra` settings, or `None` (said loudly) without one.
fn private_redis(test: &str, extra: &[&str]) -> Option<Single> {
    let binary = nodes::redis_server(test)?;
    Some(Single::start(&binary, extra))
}

/// A server on `redis`, failing open, with `args` added.
fn server_on(redis: &Single, args: &[&str]) -> Server {
    server_with(redis, args, &[])
}

fn server_with(redis: &Single, args: &[&str], env: &[(&'static str, &'static str)]) -> Server {
    let url = redis.node.url();
    let mut all = vec!["--store", url.as_str(), "--store-fail-open", "true"];
    all.extend_from_slice(args);
    let mut options = Options {
        args: all,
        ..Options::default()
    };
    options.env.extend_from_slice(env);
    Server::start_with(options)
}

fn exists(redis: &Single, key: &str) -> bool {
    redis.node.query(&["EXISTS", key]).expect("exists").trim() == "1"
}

/// The keys of the private Redis matching `pattern`.
fn keys(redis: &Single, pattern: &str) -> Vec<String> {
    let text = redis
        .node
        .query(&["--scan", "--pattern", pattern])
        .expect("scan");
    text.lines().map(str::to_owned).collect()
}

/// Envoy on the memory store, failing open: once the key cap is full, a fresh descriptor value
/// over its one-a-minute limit is refused (`OVER_LIMIT`), never granted over and over as if the
/// store were down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_key_cap_is_never_failed_open_through_envoy() {
    let directory = tempfile::tempdir().expect("tempdir");
    let server = Server::start_envoy(
        directory,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        &["--store-fail-open", "true", "--keys-tracked-max", "100"],
    );
    let url = server.grpc.clone().expect("the gRPC address");
    let mut client = RateLimitServiceClient::connect(url).await.expect("connect");
    let mut ask = async |user: &str| {
        let request = RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: user.into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await.expect("answered");
        Code::try_from(answer.into_inner().overall_code).expect("a code")
    };
    for user in 0..110 {
        ask(&format!("flood-{user}")).await;
    }
    let mut granted = 0;
    for _ in 0..5 {
        if ask("fresh").await == Code::Ok {
            granted += 1;
        }
    }
    assert!(
        granted <= 1,
        "a 1-a-minute limit granted {granted} of 5 once the key cap was full; log:\n{}",
        server.log()
    );
}

/// Redis out of memory (noeviction, filled by other keys) answered with a failure: with
/// `store_fail_open` a used-up limit grants nothing more, a request Redis would have to write
/// for is refused with an error that says why, and nothing is granted uncounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_memory_redis_is_not_failed_open() {
    let test = "an_out_of_memory_redis_is_not_failed_open";
    let Some(redis) = private_redis(
        test,
        &["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"],
    ) else {
        return;
    };
    let server = server_on(&redis, &[]);
    for name in ["daily", "fresh"] {
        put_limit(
            &server,
            name,
            r#"{"kind":"rate","limit":5,"period_ms":86400000}"#,
        )
        .await;
    }
    let client = server.anonymous();
    let daily = r#"{"limits":["daily"]}"#;
    for _ in 0..5 {
        let answer = post(&client, "/v1/acquire", daily).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    // Other keys fill Redis to its maxmemory, until it answers even a small write with OOM (a
    // large value's own buffer counts until its command ends: smaller ones fill what is left).
    let mut connection = redis::Client::open(redis.node.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut filled = 0;
    for size in [64 * 1024, 1024, 16] {
        let value = vec![b'x'; size];
        loop {
            let set: redis::RedisResult<()> = redis::cmd("SET")
                .arg(format!("filler:{filled}"))
                .arg(&value)
                .query_async(&mut connection)
                .await;
            match set {
                Ok(()) => filled += 1,
                Err(error) if error.to_string().contains("OOM") => break,
                Err(error) => panic!("filling Redis: {error}"),
            }
            assert!(filled < 100_000, "2 MB of Redis never filled up");
        }
    }
    for _ in 0..7 {
        // Refused as used up (a denial Redis can answer without writing) or as out of memory.
        let answer = post(&client, "/v1/acquire", daily).await;
        assert_ne!(
            answer.status,
            200,
            "a used-up limit granted: {}",
            answer.text()
        );
        // A counter Redis would have to make: out of memory, said so.
        for body in [r#"{"limits":["fresh"]}"#, r#"{"limits":["daily","fresh"]}"#] {
            let answer = post(&client, "/v1/acquire", body).await;
            assert_error(&answer, 503, "store_unavailable", None);
            let message = answer.error_message().unwrap_or_default().to_owned();
            assert!(
                message.contains("out of memory"),
                "the answer says why: {message}"
            );
        }
    }
}

/// A Redis whose `maxmemory-policy` can evict Tollgate's keys is refused at start, naming the
/// policy and the fix, unless the operator allows eviction; a policy changed while serving
/// makes `/readyz` answer 503 with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_is_refused_unless_allowed() {
    let test = "a_redis_that_may_evict_is_refused_unless_allowed";
    let Some(redis) = private_redis(test, &["--maxmemory-policy", "volatile-lru"]) else {
        return;
    };
    let (status, log) = common::refused_start(&["--store", &redis.node.url()], &[]);
    assert!(!status.success(), "{log}");
    for says in [
        "volatile-lru",
        "CONFIG SET maxmemory-policy noeviction",
        "redis_allow_eviction",
    ] {
        assert!(log.contains(says), "the refusal says {says:?}: {log}");
    }
    // Allowed by the operator: it starts, and is ready.
    let allowed = server_on(&redis, &["--redis-allow-eviction", "true"]);
    let ready = post_get(&allowed, "/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    drop(allowed);

    // Started on noeviction, then the policy changes under it: not ready, naming the policy.
    redis
        .node
        .query(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .expect("config set");
    let server = server_on(&redis, &[]);
    let ready = post_get(&server, "/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    redis
        .node
        .query(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .expect("config set");
    let ready = post_get(&server, "/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert!(ready.text().contains("allkeys-lru"), "{}", ready.text());
}

async fn post_get(server: &Server, path: &str) -> tollgate_cli::client::Answer {
    common::call(&server.anonymous(), Method::GET, path, "").await
}

/// A used-up counter that Redis evicts (eviction allowed, `volatile-ttl`: the counter's key has
/// the shortest time to live, so it goes before the filler and the generation) is not read as
/// a fresh counter: the next request is refused, not granted a whole limit again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_counter_is_never_read_as_fresh() {
    let test = "an_evicted_counter_is_never_read_as_fresh";
    let Some(redis) = private_redis(
        test,
        &["--maxmemory", "4mb", "--maxmemory-policy", "volatile-ttl"],
    ) else {
        return;
    };
    // Allowed through the environment (the start test allows it by flag).
    let server = server_with(&redis, &[], &[("TOLLGATE_REDIS_ALLOW_EVICTION", "true")]);
    put_limit(
        &server,
        "per-user",
        r#"{"kind":"rate","limit":2,"period_ms":86400000,"per":"user"}"#,
    )
    .await;
    let client = server.anonymous();
    let body = r#"{"limits":["per-user"],"key":"u1"}"#;
    for _ in 0..2 {
        let answer = post(&client, "/v1/acquire", body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let answer = post(&client, "/v1/acquire", body).await;
    assert_eq!(answer.status, 429, "{}", answer.text());
    let counter = keys(&redis, "tg:*:c:*");
    assert_eq!(counter.len(), 1, "one counter: {counter:?}");
    let generation = keys(&redis, "tg:*:gen");
    assert_eq!(generation.len(), 1, "one generation: {generation:?}");

    // Keys living ten days fill Redis; volatile-ttl evicts the counter (a day) first.
    let mut connection = redis::Client::open(redis.node.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let value = vec![b'x'; 16 * 1024];
    let mut filled = 0;
    loop {
        let () = redis::cmd("SET")
            .arg(format!("filler:{filled}"))
            .arg(&value)
            .arg("EX")
            .arg(864_000)
            .query_async(&mut connection)
            .await
            .expect("set");
        filled += 1;
        if !exists(&redis, &counter[0]) {
            break;
        }
        assert!(filled < 20_000, "the counter was never evicted");
    }
    assert!(
        exists(&redis, &generation[0]),
        "the generation outlived the counter, so only the counter is lost"
    );
    for _ in 0..3 {
        let answer = post(&client, "/v1/acquire", body).await;
        assert_eq!(
            answer.status,
            429,
            "an evicted used-up counter granted again: {}",
            answer.text()
        );
    }
}

/// Redis paused (`CLIENT PAUSE`), with `store_fail_open`: the acquires that queue behind the
/// calls in flight on their slot go to Redis as one batch, and that batch's timeout (or their
/// wait for it) says Redis is slow, not unreachable: Redis may yet decide it, and callers can
/// slow it at will. None of them is granted; only the calls that went alone may fail open, as a
/// lone call's timeout does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_acquire_that_times_out_is_never_failed_open() {
    let test = "a_batched_acquire_that_times_out_is_never_failed_open";
    let Some(redis) = private_redis(test, &[]) else {
        return;
    };
    let server = server_on(&redis, &["--store-timeout-ms", "300"]);
    put_limit(
        &server,
        "hourly",
        r#"{"kind":"rate","limit":1,"period_ms":3600000}"#,
    )
    .await;
    let body = r#"{"limits":["hourly"]}"#;
    let answer = post(&server.anonymous(), "/v1/acquire", body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    redis
        .node
        .query(&["CLIENT", "PAUSE", "3000", "ALL"])
        .expect("client pause");
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let client = server.anonymous();
        calls.spawn(async move { post(&client, "/v1/acquire", body).await });
    }
    let mut granted = 0;
    let mut batched = 0;
    while let Some(answer) = calls.join_next().await {
        let answer = answer.expect("the call");
        if answer.status == 200 {
            granted += 1;
            continue;
        }
        assert_error(&answer, 503, "store_unavailable", None);
        if answer
            .error_message()
            .is_some_and(|message| message.contains("not failed open"))
        {
            batched += 1;
        }
    }
    // CALLS_PER_SLOT calls go alone to a slot before others wait for a batch.
    assert!(
        granted <= 2,
        "{granted} of 12 acquires on a used-up limit were granted while Redis was paused; log:\n{}",
        server.log()
    );
    assert_eq!(granted + batched, 12, "every refusal says why");
}
