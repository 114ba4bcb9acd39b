//! Envoy's rate limit service end to end: the configuration's refusals, envoyproxy/ratelimit's
//! matching and counting, Tollgate's all-or-nothing, on the memory store with a clock the tests
//! set (fixed windows aligned to the Unix epoch), over real gRPC with the generated client, and
//! on Redis shared by two services.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate::store::Store;
use tollgate::{ManualClock, MemoryStore, MemoryStoreConfig};
use tollgate_envoy::{Config, ConfigWatch, EnvoyService};

/// 2026-11-24T00:00:30Z, in microseconds: 30 s into a minute, a day, a week (from the epoch).
const START_US: u64 = 1_795_478_430_000_000;

const CONFIG: &str = r#"
domain: api
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: path
    value: /login
    rate_limit:
      name: login
      unit: second
      requests_per_unit: 2
  - key: path
    value: /static/*
    rate_limit:
      unlimited: true
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit:
          unit: hour
          requests_per_unit: 1
      - key: plan
        rate_limit:
          unit: hour
          requests_per_unit: 5
  - key: tenant
    value: big
    descriptors:
      - key: plan
        value: enterprise
        rate_limit:
          name: enterprise
          unit: day
          requests_per_unit: 100
          replaces:
            - name: login
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: assets
    rate_limit:
      unlimited: true
      replaces:
        - name: login
  - key: closed
    rate_limit:
      unit: minute
      requests_per_unit: 0
  - key: user
    value: team-*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
"#;

struct Harness {
    service: EnvoyService,
    clock: Arc<ManualClock>,
}

fn harness(yaml: &str) -> Harness {
    let clock = Arc::new(ManualClock::new(START_US));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 10_000,
            keys_per_limit_max: 10_000,
        },
        clock.clone(),
    ));
    let config = Config::parse([("api.yaml", yaml)]).expect("valid configuration");
    Harness {
        service: EnvoyService::new(store, ConfigWatch::fixed(config), false),
        clock,
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| descriptor(entries))
            .collect(),
        hits_addend: hits,
    }
}

impl Harness {
    async fn ask(&self, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
        self.ask_hits(descriptors, 0).await
    }

    async fn ask_hits(&self, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitResponse {
        self.service
            .decide(&request("api", descriptors, hits))
            .await
            .expect("answered")
    }
}

fn code(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).expect("a code")
}

fn status_code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).expect("a code")
}

#[tokio::test]
async fn a_key_only_entry_counts_each_value_in_windows_aligned_to_the_epoch() {
    let h = harness(CONFIG);
    for expected_remaining in [2, 1, 0] {
        let answer = h.ask(&[&[("remote_address", "10.0.0.1")]]).await;
        assert_eq!(code(&answer), Code::Ok);
        let status = &answer.statuses[0];
        assert_eq!(status.limit_remaining, expected_remaining);
        let limit = status.current_limit.as_ref().expect("the limit");
        assert_eq!(limit.requests_per_unit, 3);
        // 30 s into the minute: the window ends in 30 s, as envoyproxy/ratelimit says.
        let reset = status.duration_until_reset.expect("a reset");
        assert_eq!((reset.seconds, reset.nanos), (30, 0));
    }
    let over = h.ask(&[&[("remote_address", "10.0.0.1")]]).await;
    assert_eq!(code(&over), Code::OverLimit);
    assert_eq!(status_code(&over.statuses[0]), Code::OverLimit);
    assert_eq!(over.statuses[0].limit_remaining, 0);
    // Another value has its own counter.
    let other = h.ask(&[&[("remote_address", "10.0.0.2")]]).await;
    assert_eq!(code(&other), Code::Ok);
    // The next minute starts at :00, whatever the first request's time was.
    h.clock.advance_us(29_999_999);
    assert_eq!(
        code(&h.ask(&[&[("remote_address", "10.0.0.1")]]).await),
        Code::OverLimit
    );
    h.clock.advance_us(1);
    let fresh = h.ask(&[&[("remote_address", "10.0.0.1")]]).await;
    assert_eq!(code(&fresh), Code::Ok);
    assert_eq!(fresh.statuses[0].limit_remaining, 2);
    let reset = fresh.statuses[0].duration_until_reset.expect("a reset");
    assert_eq!(reset.seconds, 60);
}

#[tokio::test]
async fn the_most_specific_entry_wins_and_never_falls_back_to_the_key_only_children() {
    let h = harness(CONFIG);
    // tenant=anyone -> plan=free: 1 an hour; plan=pro: the key-only entry, 5 an hour.
    let free = [("tenant", "acme"), ("plan", "free")];
    assert_eq!(code(&h.ask(&[&free]).await), Code::Ok);
    assert_eq!(code(&h.ask(&[&free]).await), Code::OverLimit);
    let pro = [("tenant", "acme"), ("plan", "pro")];
    let answer = h.ask(&[&pro]).await;
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    // tenant=big matched by value: its children only. plan=free is not among them, and the
    // key-only tenant entry's children are not consulted.
    let big_free = h.ask(&[&[("tenant", "big"), ("plan", "free")]]).await;
    assert_eq!(code(&big_free), Code::Ok);
    assert!(big_free.statuses[0].current_limit.is_none(), "{big_free:?}");
    let enterprise = h.ask(&[&[("tenant", "big"), ("plan", "enterprise")]]).await;
    assert_eq!(
        enterprise.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.name.as_str()),
        Some("enterprise")
    );
    // Shallower or deeper than the tree: no limit.
    let shallow = h.ask(&[&[("tenant", "acme")]]).await;
    assert!(shallow.statuses[0].current_limit.is_none());
    let deep = h
        .ask(&[&[("remote_address", "10.9.9.9"), ("extra", "x")]])
        .await;
    assert!(deep.statuses[0].current_limit.is_none());
    assert_eq!(code(&deep), Code::Ok);
}

#[tokio::test]
async fn wildcards_unlimited_unknown_domains_and_unmatched_descriptors_are_ok() {
    let h = harness(CONFIG);
    let statics = h.ask(&[&[("path", "/static/app.js")]]).await;
    assert_eq!(code(&statics), Code::Ok);
    assert!(statics.statuses[0].current_limit.is_none());
    assert_eq!(statics.statuses[0].limit_remaining, u32::MAX);
    let nothing = h.ask(&[&[("nobody", "x")]]).await;
    assert_eq!(code(&nothing), Code::Ok);
    assert!(nothing.statuses[0].current_limit.is_none());
    let unknown = h
        .service
        .decide(&request("elsewhere", &[&[("remote_address", "1")]], 1))
        .await
        .expect("answered");
    assert_eq!(code(&unknown), Code::Ok);
    // share_threshold: every value the wildcard matches shares one counter.
    assert_eq!(code(&h.ask(&[&[("user", "team-a")]]).await), Code::Ok);
    assert_eq!(code(&h.ask(&[&[("user", "team-b")]]).await), Code::Ok);
    assert_eq!(
        code(&h.ask(&[&[("user", "team-c")]]).await),
        Code::OverLimit
    );
}

#[tokio::test]
async fn a_request_is_all_or_nothing_and_one_status_per_descriptor_in_order() {
    let h = harness(CONFIG);
    let login = [("path", "/login")];
    let address = [("remote_address", "10.0.0.7")];
    // Two logins a second: the third request is over on login, and counts nothing on the
    // address, which keeps its units.
    assert_eq!(code(&h.ask(&[&address, &login]).await), Code::Ok);
    assert_eq!(code(&h.ask(&[&address, &login]).await), Code::Ok);
    let refused = h.ask(&[&address, &login, &[("nobody", "x")]]).await;
    assert_eq!(code(&refused), Code::OverLimit);
    assert_eq!(refused.statuses.len(), 3);
    assert_eq!(status_code(&refused.statuses[0]), Code::Ok);
    assert_eq!(
        refused.statuses[0].limit_remaining, 1,
        "the address was not counted"
    );
    assert_eq!(status_code(&refused.statuses[1]), Code::OverLimit);
    assert_eq!(
        refused.statuses[1]
            .current_limit
            .as_ref()
            .map(|l| l.name.as_str()),
        Some("login")
    );
    assert!(refused.statuses[2].current_limit.is_none());
    // hits_addend: 0 means 1; 2 takes two.
    let two = h.ask_hits(&[&address], 2).await;
    assert_eq!(code(&two), Code::OverLimit, "1 left, 2 asked");
    let one = h.ask_hits(&[&address], 0).await;
    assert_eq!(code(&one), Code::Ok);
    assert_eq!(one.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn replaces_shadow_mode_and_a_zero_limit() {
    let h = harness(CONFIG);
    let login = [("path", "/login")];
    let enterprise = [("tenant", "big"), ("plan", "enterprise")];
    // The enterprise limit replaces login: three logins in a second pass beside it.
    for _ in 0..3 {
        let answer = h.ask(&[&login, &enterprise]).await;
        assert_eq!(code(&answer), Code::Ok, "{answer:?}");
        assert!(answer.statuses[0].current_limit.is_none());
    }
    // An unlimited limit replaces what it names too.
    for _ in 0..3 {
        let answer = h.ask(&[&[("path", "/login")], &[("assets", "a")]]).await;
        assert_eq!(code(&answer), Code::Ok, "{answer:?}");
        assert!(answer.statuses[0].current_limit.is_none());
        assert_eq!(answer.statuses[1].limit_remaining, u32::MAX);
    }
    // Shadow mode: over its limit, it still answers OK and never refuses the request.
    let shadow = [("shadow", "s")];
    for _ in 0..3 {
        let answer = h.ask(&[&shadow]).await;
        assert_eq!(code(&answer), Code::Ok);
        assert_eq!(status_code(&answer.statuses[0]), Code::Ok);
    }
    // A limit of 0 refuses without counting anything else.
    let address = [("remote_address", "10.0.0.9")];
    let closed = h.ask(&[&address, &[("closed", "x")]]).await;
    assert_eq!(code(&closed), Code::OverLimit);
    assert_eq!(status_code(&closed.statuses[1]), Code::OverLimit);
    assert_eq!(closed.statuses[0].limit_remaining, 3, "nothing was counted");
}

#[tokio::test]
async fn bad_requests_are_refused_naming_the_field() {
    let h = harness(CONFIG);
    let empty_domain = h.service.decide(&request("", &[&[("a", "b")]], 1)).await;
    let status = empty_domain.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().starts_with("domain"), "{status:?}");
    let no_descriptors = h.service.decide(&request("api", &[], 1)).await;
    assert!(
        no_descriptors
            .expect_err("refused")
            .message()
            .starts_with("descriptors")
    );
    let long = "x".repeat(2_000);
    let too_long = h
        .service
        .decide(&request("api", &[&[("remote_address", &long)]], 1))
        .await;
    let status = too_long.expect_err("refused");
    assert!(status.message().starts_with("descriptors[0]"), "{status:?}");
    let many: Vec<String> = (0..9).map(|index| format!("10.1.1.{index}")).collect();
    let entries: Vec<[(&str, &str); 1]> = many
        .iter()
        .map(|value| [("remote_address", value.as_str())])
        .collect();
    let descriptors: Vec<&[(&str, &str)]> = entries.iter().map(|entry| &entry[..]).collect();
    let status = h
        .service
        .decide(&request("api", &descriptors, 1))
        .await
        .expect_err("refused");
    assert!(status.message().contains("at most 8"), "{status:?}");
}

/// What the store would refuse as invalid is decided here, never taken for an unavailable store
/// (which a server failing open answers `OK`, uncounted): more hits than a limit allows are over
/// it, a control character in a value is counted like any other, and a key longer than a store
/// keeps is refused naming its descriptor.
#[tokio::test]
async fn what_the_store_would_refuse_is_never_taken_for_an_unavailable_store() {
    for fail_open in [false, true] {
        let clock = Arc::new(ManualClock::new(START_US));
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 10_000,
                keys_per_limit_max: 10_000,
            },
            clock,
        ));
        let config = Config::parse([("api.yaml", CONFIG)]).expect("valid configuration");
        let watch = ConfigWatch::fixed(config);
        let service = EnvoyService::new(store, watch.clone(), fail_open);
        let ask = |value: &str, hits: u32| {
            let request = request("api", &[&[("remote_address", value)]], hits);
            let service = service.clone();
            async move { service.decide(&request).await }
        };
        // remote_address: 3 a minute.
        let beyond = ask("10.0.0.1", 4).await.expect("answered");
        assert_eq!(code(&beyond), Code::OverLimit, "fail_open {fail_open}");
        assert_eq!(status_code(&beyond.statuses[0]), Code::OverLimit);
        let within = ask("10.0.0.1", 3).await.expect("answered");
        assert_eq!(code(&within), Code::Ok, "nothing was counted before");
        for expected in [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit] {
            let tab = ask("a\tb", 1).await.expect("answered");
            assert_eq!(code(&tab), expected, "fail_open {fail_open}");
        }
        // The escape's own spelling is another value.
        assert_eq!(code(&ask("a\\u{9}b", 1).await.expect("answered")), Code::Ok);
        let status = ask(&"x".repeat(300), 1).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("descriptors[0]"), "{status:?}");
        let failures = watch
            .stats()
            .store_failures
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(failures, 0, "fail_open {fail_open}");
    }
}

/// Every kind of file envoyproxy/ratelimit refuses is refused, naming the file and the fault.
#[test]
fn configurations_envoyproxy_refuses_are_refused() {
    let cases: &[(&str, &str)] = &[
        ("domain: a\ndescriptors: [key: x\n", "did not find expected"),
        ("descriptors:\n  - key: a\n", "domain is empty"),
        ("domain: \"\"\n", "domain is empty"),
        ("domain: a\ndescriptors:\n  - value: v\n", "empty key"),
        (
            "domain: a\ndescriptors:\n  - key: k\n  - key: k\n",
            "configured twice",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "not a unit",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, unlimited: true}\n",
            "takes no unit",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n",
            "itself",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, replaces: [{}]}\n",
            "no name",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    ratelimit: {unit: day, requests_per_unit: 1}\n",
            "unknown field `ratelimit`",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requestsperunit: 1}\n",
            "unknown field `requestsperunit`",
        ),
        ("domain: a\ndescriptors:\n  - a\n  - b\n", "invalid type"),
        ("0.25: a\ndescriptors: []\n", "unknown field"),
        (
            "domain: a\ndescriptors:\n  - key: k\n    share_threshold: true\n",
            "wildcard",
        ),
        ("domain: a\ndomain: b\n", "duplicate field"),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
            "unit is required",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: -1}\n",
            "expected u32",
        ),
    ];
    for (yaml, says) in cases {
        let error = Config::parse([("limits.yaml", *yaml)]).expect_err("refused");
        assert_eq!(error.file, "limits.yaml");
        assert!(error.to_string().contains(says), "{yaml:?}: {error}");
    }
    let twice = Config::parse([("one.yaml", "domain: a\n"), ("two.yaml", "domain: a\n")]);
    let error = twice.expect_err("one domain in two files");
    assert_eq!(error.file, "two.yaml");
    assert!(error.reason.contains("twice"), "{error}");
}

#[test]
fn a_directory_reads_its_yaml_files_and_ignores_the_rest() {
    let directory = tempfile::tempdir().expect("tempdir");
    std::fs::write(directory.path().join("a.yaml"), "domain: a\n").expect("write");
    std::fs::write(directory.path().join("b.yml"), "domain: b\n").expect("write");
    std::fs::write(directory.path().join("notes.txt"), "not yaml: [").expect("write");
    let config = Config::load(directory.path()).expect("loads");
    let mut domains: Vec<&str> = config.domains().collect();
    domains.sort_unstable();
    assert_eq!(domains, ["a", "b"]);
}

/// An edit takes effect within the watch interval; an invalid edit is refused and counted,
/// and the configuration in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_file_takes_effect_and_a_bad_edit_is_refused() {
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("api.yaml");
    let limit = |n: u32| {
        format!(
            "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n"
        )
    };
    std::fs::write(&file, limit(1)).expect("write");
    let watch = ConfigWatch::load(&file).expect("loads");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let watcher = watch.spawn_watcher(stopped);
    let requests_per_unit = |watch: &ConfigWatch| {
        watch
            .current()
            .find("api", &[("k", "v")])
            .map(|found| found.limit.requests_per_unit)
    };
    assert_eq!(requests_per_unit(&watch), Some(1));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let save = |text: &str| {
        let temporary = directory.path().join("api.tmp");
        std::fs::write(&temporary, text).expect("write");
        std::fs::rename(&temporary, &file).expect("rename");
    };
    save(&limit(7));
    while requests_per_unit(&watch) != Some(7) {
        assert!(
            std::time::Instant::now() < deadline,
            "the edit did not take effect"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    save(
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    while watch
        .stats()
        .reloads_failed
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the bad edit was not seen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        requests_per_unit(&watch),
        Some(7),
        "the previous configuration stays"
    );
    let _ = stop.send(true);
    watcher.await.expect("the watcher stops");
}

/// The generated client over a real socket: ShouldRateLimit, and the health service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_client_is_answered_over_grpc() {
    let h = harness(CONFIG);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(tollgate_envoy::serve(
        listener,
        h.service.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let endpoint = format!("http://{address}");
    let mut client = RateLimitServiceClient::connect(endpoint.clone())
        .await
        .expect("connect");
    let answer = client
        .should_rate_limit(request("api", &[&[("remote_address", "192.0.2.1")]], 1))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(code(&answer), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 2);
    let refused = client
        .should_rate_limit(request("", &[&[("a", "b")]], 1))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    let channel = tonic::transport::Channel::from_shared(endpoint)
        .expect("a URI")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(
        serving.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let _ = stop.send(());
    server.await.expect("joined").expect("served");
}

/// Two services on one Redis namespace share every counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_on_one_redis_share_the_counters() {
    let Ok(url) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(
            "two_services_on_one_redis_share_the_counters: TOLLGATE_TEST_REDIS is unset",
        );
        return;
    };
    let namespace = format!("envoy-test-{}", std::process::id());
    let connect = || {
        tollgate_redis::RedisStore::connect(tollgate_redis::RedisStoreConfig {
            url: url.clone(),
            namespace: namespace.clone(),
            fail_open: false,
            allow_eviction: false,
            module: tollgate_redis::Module::Auto,
            timeout: Duration::from_secs(2),
            keys_per_limit_max: 100_000,
        })
    };
    let first = connect().await.expect("redis");
    first.begin_new_namespace().await.expect("a new namespace");
    let second = connect().await.expect("redis");
    let config = || Config::parse([("api.yaml", CONFIG)]).expect("valid");
    let services = [
        EnvoyService::new(Arc::new(first), ConfigWatch::fixed(config()), false),
        EnvoyService::new(Arc::new(second), ConfigWatch::fixed(config()), false),
    ];
    let asked = request("api", &[&[("tenant", "shared"), ("plan", "pro")]], 1);
    let mut granted = 0;
    for round in 0..8 {
        let answer = services[round % 2].decide(&asked).await.expect("answered");
        if code(&answer) == Code::Ok {
            granted += 1;
        }
    }
    assert_eq!(granted, 5, "5 an hour between both");
}
