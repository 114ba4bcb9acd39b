//! `GET /v1/stats` beyond the moment: the history the server keeps of each limit (so a dashboard
//! opened during an incident shows what came before), and the limits of an Envoy configuration,
//! in the stats and in `tollgate status`. Over the real binary; the counts a test expects are the
//! requests it made itself.

mod common;

use std::process::Output;

use common::*;
use hyper::Method;

fn run(server: &Server, args: &[&str]) -> Output {
    command(server.directory.path())
        .args(args)
        .env("TOLLGATE_SERVER", &server.url)
        .output()
        .expect("runs")
}

async fn stats(server: &Server, query: &str) -> serde_json::Value {
    let answer = call(
        &server.anonymous(),
        Method::GET,
        &format!("/v1/stats{query}"),
        "",
    )
    .await;
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.text());
    serde_json::from_slice(&answer.body).expect("json")
}

fn sum(series: &serde_json::Value, field: &str) -> u64 {
    series[field]
        .as_array()
        .map_or(0, |steps| steps.iter().filter_map(|n| n.as_u64()).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_keeps_each_limits_recent_past_and_serves_it() {
    let server = Server::start();
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":3,"period_ms":600000}"#,
    )
    .await;
    put_limit(
        &server,
        "api",
        r#"{"kind":"rate","limit":5,"period_ms":60000,"per":"user"}"#,
    )
    .await;
    // Once the sampler has seen the limit, what happens is counted in its steps.
    until("the first sample of vendor-x", async || {
        let answer = stats(&server, "?limit=vendor-x&history=60").await;
        !answer["limits"][0]["history"]["grants"]
            .as_array()
            .is_none_or(Vec::is_empty)
    })
    .await;
    let data = server.anonymous();
    for _ in 0..3 {
        granted(&data, r#"{"limits":["vendor-x"]}"#).await;
    }
    for _ in 0..2 {
        let denied = post(&data, "/v1/acquire", r#"{"limits":["vendor-x"]}"#).await;
        assert_eq!(denied.status.as_u16(), 429);
    }
    granted(&data, r#"{"limits":["api"],"key":"user-1"}"#).await;
    until("the grants and denials in the history", async || {
        let answer = stats(&server, "?history=60").await;
        let vendor = &answer["limits"]
            .as_array()
            .expect("limits")
            .iter()
            .find(|limit| limit["name"] == "vendor-x")
            .expect("vendor-x")["history"];
        sum(vendor, "grants") == 3 && sum(vendor, "denials") == 2
    })
    .await;
    let answer = stats(&server, "?history=60").await;
    let limits = answer["limits"].as_array().expect("limits");
    let history = |name: &str| {
        limits
            .iter()
            .find(|limit| limit["name"] == name)
            .expect("listed")["history"]
            .clone()
    };
    let vendor = history("vendor-x");
    assert_eq!(vendor["step_ms"], 1_000);
    assert_eq!(vendor["grants_total"], 3);
    assert_eq!(vendor["denials_total"], 2);
    let steps = vendor["grants"].as_array().expect("steps").len();
    assert!((1..=60).contains(&steps), "{vendor}");
    for field in ["used", "denials", "waiting"] {
        assert_eq!(
            vendor[field].as_array().map(Vec::len),
            Some(steps),
            "{field}"
        );
    }
    // The newest sample holds the 3 units the counter holds.
    assert_eq!(vendor["used"][steps - 1], 3, "{vendor}");
    // A limit counted per key has no one counter to read, but its grants are counted.
    let api = history("api");
    assert!(
        api["used"]
            .as_array()
            .expect("used")
            .iter()
            .all(|used| used.is_null())
    );
    until("the per-key grant in the history", async || {
        let answer = stats(&server, "?limit=api&history=60").await;
        sum(&answer["limits"][0]["history"], "grants") == 1
    })
    .await;
    // Past five minutes the steps are ten seconds.
    let hour = stats(&server, "?limit=vendor-x&history=3600").await;
    assert_eq!(hour["limits"][0]["history"]["step_ms"], 10_000);
    // Without the parameter no history is sent.
    assert!(
        stats(&server, "").await["limits"][0]
            .get("history")
            .is_none()
    );
    for bad in ["0", "3601", "an-hour", "-1"] {
        let answer = call(
            &server.anonymous(),
            Method::GET,
            &format!("/v1/stats?history={bad}"),
            "",
        )
        .await;
        assert_error(&answer, 400, "bad_request", Some("history"));
    }
}

const ENVOY_YAML: &str = "domain: edge\ndescriptors:\n  \
  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  \
  - key: internal\n    rate_limit: {name: internal, unlimited: true}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_limits_appear_in_stats_and_status_with_their_answers() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let directory = tempfile::tempdir().expect("tempdir");
    let server = Server::start_envoy(directory, ENVOY_YAML, &[]);
    let url = server.grpc.clone().expect("the gRPC address");
    let mut client = RateLimitServiceClient::connect(url).await.expect("connect");
    let mut codes = Vec::new();
    for _ in 0..7 {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: "alice".into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await.expect("answered");
        codes.push(Code::try_from(answer.into_inner().overall_code).expect("a code"));
    }
    assert_eq!(codes.iter().filter(|code| **code == Code::Ok).count(), 5);

    let answer = stats(&server, "").await;
    let envoy = &answer["envoy"];
    assert_eq!(envoy["config"], "api.yaml");
    assert_eq!(envoy["domains"], 1);
    assert_eq!(envoy["answered_ok"], 5);
    assert_eq!(envoy["answered_over_limit"], 2);
    let limits = envoy["limits"].as_array().expect("limits");
    let user = limits
        .iter()
        .find(|limit| limit["path"] == "edge.user")
        .unwrap_or_else(|| panic!("edge.user in {envoy}"));
    assert_eq!(user["requests_per_unit"], 5);
    assert_eq!(user["unit"], "minute");
    assert_eq!(
        (user["ok"].as_u64(), user["over_limit"].as_u64()),
        (Some(5), Some(2))
    );
    let internal = limits
        .iter()
        .find(|limit| limit["path"] == "edge.internal")
        .expect("the unlimited entry");
    assert_eq!(internal["unlimited"], true);
    assert_eq!(internal["name"], "internal");

    let status = run(&server, &["status", "-o", "table"]);
    assert!(status.status.success(), "{status:?}");
    let shown = String::from_utf8_lossy(&status.stdout).into_owned();
    let line = shown
        .lines()
        .find(|line| line.starts_with("edge.user"))
        .unwrap_or_else(|| panic!("edge.user in:\n{shown}"));
    for part in ["5 per minute", "enforced"] {
        assert!(line.contains(part), "{part}: {line}");
    }

    // A bad edit is refused, said in the stats and by status, and the entries stay in force.
    std::fs::write(
        server.directory.path().join("api.yaml"),
        ENVOY_YAML.replace("unit: minute", "unit: fortnight"),
    )
    .expect("edit");
    until("the refused edit in the stats", async || {
        stats(&server, "").await["envoy"]["last_reload_error"]
            .as_str()
            .is_some_and(|error| error.contains("fortnight"))
    })
    .await;
    let answer = stats(&server, "").await;
    assert_eq!(answer["envoy"]["limits"].as_array().map(Vec::len), Some(2));
    let shown =
        String::from_utf8_lossy(&run(&server, &["status", "-o", "table"]).stdout).into_owned();
    assert!(
        shown.contains("REFUSED") && shown.contains("fortnight"),
        "{shown}"
    );
}

/// A token scoped to some limits sees no Envoy entries: they are not limits it can name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_sees_no_envoy_entries() {
    let directory = tempfile::tempdir().expect("tempdir");
    let server = Server::start_envoy(directory, ENVOY_YAML, &[]);
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":3,"period_ms":1000}"#,
    )
    .await;
    let created = post(
        &server.admin(),
        "/v1/tokens",
        r#"{"name":"worker","limits":["vendor-x"]}"#,
    )
    .await;
    assert_eq!(created.status.as_u16(), 201, "{}", created.text());
    let token: serde_json::Value = serde_json::from_slice(&created.body).expect("json");
    let scoped = server.with_token(token["secret"].as_str().expect("the secret"));
    let answer = call(&scoped, Method::GET, "/v1/stats", "").await;
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.text());
    let stats: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
    assert!(stats.get("envoy").is_none(), "{stats}");
    assert!(self::stats(&server, "").await.get("envoy").is_some());
}
