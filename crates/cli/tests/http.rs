//! HTTP API v1 end to end: the built `tollgate` binary as a real server process, every
//! endpoint and every error code it can produce, over real HTTP on loopback.

mod common;

use std::time::Instant;

use common::*;
use hyper::Method;

const RATE: &str = r#"{"kind":"rate","limit":2,"period_ms":60000}"#;
const POOL: &str = r#"{"kind":"concurrency","limit":1,"lease_ttl_ms":60000}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_need_the_admin_token() {
    let server = Server::start();
    for client in [server.anonymous(), server.with_token("wrong")] {
        for (method, path) in [
            (Method::GET, "/v1/limits"),
            (Method::GET, "/v1/limits/a"),
            (Method::PUT, "/v1/limits/a"),
            (Method::DELETE, "/v1/limits/a"),
        ] {
            let answer = call(&client, method, path, RATE).await;
            assert_error(&answer, 401, "unauthorized", None);
            assert_eq!(answer.headers["www-authenticate"], "Bearer");
        }
    }
    // With no token configured (and a database with no file to keep one beside), the admin
    // API is closed to everyone, and the log says so.
    let closed = Server::start_with(Options {
        env: vec![],
        args: vec!["--rules", "sqlite::memory:"],
        ..Options::default()
    });
    let answer = call(&closed.admin(), Method::GET, "/v1/limits", "").await;
    assert_error(&answer, 401, "unauthorized", None);
    assert!(
        closed.log().contains("no admin token is configured"),
        "{}",
        closed.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_stored_listed_shown_and_deleted() {
    let server = Server::start();
    let admin = server.admin();
    let stored = put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":10,"period_ms":1000,"algorithm":"sliding","reserve":{"high":2}}"#,
    )
    .await;
    assert_eq!(
        stored,
        serde_json::json!({"name":"vendor-x","kind":"rate","limit":10,"period_ms":1000,
            "algorithm":"sliding","reserve":{"high":2}})
    );
    let pool = put_limit(
        &server,
        "pool",
        r#"{"kind":"concurrency","limit":5,"lease_ttl_ms":30000,"per":"account",
            "match":{"method":"*","path":"*"}}"#,
    )
    .await;
    assert_eq!(pool["per"], "account");
    let shown = call(&admin, Method::GET, "/v1/limits/vendor-x", "").await;
    assert_eq!(shown.status, 200);
    assert_eq!(shown.json.as_ref(), Some(&stored));
    let list = call(&admin, Method::GET, "/v1/limits", "").await;
    assert_eq!(list.status, 200);
    let list = list.json.expect("json");
    let names: Vec<&str> = list["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .filter_map(|limit| limit["name"].as_str())
        .collect();
    assert_eq!(names, ["pool", "vendor-x"]);
    assert_eq!(list["rejected"], serde_json::json!([]));
    // Replacing keeps one limit; deleting removes it; a second delete finds nothing.
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":3,"period_ms":1000}"#,
    )
    .await;
    let shown = call(&admin, Method::GET, "/v1/limits/vendor-x", "").await;
    assert_eq!(shown.json.expect("json")["limit"], 3);
    let deleted = call(&admin, Method::DELETE, "/v1/limits/vendor-x", "").await;
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_error(
        &call(&admin, Method::DELETE, "/v1/limits/vendor-x", "").await,
        404,
        "not_found",
        None,
    );
    assert_error(
        &call(&admin, Method::GET, "/v1/limits/vendor-x", "").await,
        404,
        "not_found",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_limits_are_refused_naming_the_field() {
    let server = Server::start_with(Options {
        args: vec!["--body-bytes-max", "1024"],
        ..Options::default()
    });
    let admin = server.admin();
    let cases: [(&str, &str, &str); 17] = [
        (
            "a",
            r#"{"kind":"rate","limit":0,"period_ms":1000}"#,
            "limit",
        ),
        (
            "a",
            r#"{"kind":"rate","limit":-5,"period_ms":1000}"#,
            "limit",
        ),
        (
            "a",
            r#"{"kind":"rate","limit":5,"period_ms":0}"#,
            "period_ms",
        ),
        (
            "a",
            r#"{"kind":"rate","limit":5,"period_ms":-1000}"#,
            "period_ms",
        ),
        ("a", r#"{"kind":"rate","limit":5}"#, "period_ms"),
        (
            "a",
            r#"{"kind":"rate","limit":"ten","period_ms":1000}"#,
            "limit",
        ),
        (
            "a",
            r#"{"kind":"rate","limit":1.5,"period_ms":1000}"#,
            "limit",
        ),
        (
            "a",
            r#"{"kind":"rate","limit":5,"period_ms":1000,"colour":"red"}"#,
            "colour",
        ),
        (
            "a",
            r#"{"kind":"rate","limit":5,"period_ms":1000,"reserve":{"low":1}}"#,
            "reserve.low",
        ),
        (
            "a",
            r#"{"kind":"rate","limit":5,"period_ms":1000,"reserve":{"high":5}}"#,
            "reserve",
        ),
        (
            "a",
            r#"{"kind":"concurrency","limit":5,"lease_ttl_ms":-1}"#,
            "lease_ttl_ms",
        ),
        ("a", r#"{"kind":"bucket","limit":5}"#, "kind"),
        ("a", r#"{"kind":"rate","limit":5,"period_ms":1000"#, "body"),
        ("a", r#"[1,2]"#, "body"),
        ("Bad_Name", RATE, "name"),
        (
            "a",
            r#"{"kind":"rate","limit":5,"period_ms":1000,"match":{"method":"GET","path":"x"}}"#,
            "match.path",
        ),
        (
            "a",
            &format!(
                r#"{{"kind":"rate","limit":5,"period_ms":1000,"per":"{}"}}"#,
                "x".repeat(2000)
            ),
            "body",
        ),
    ];
    for (name, body, field) in cases {
        let answer = call(&admin, Method::PUT, &format!("/v1/limits/{name}"), body).await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
    let long_name = "a".repeat(129);
    let answer = call(
        &admin,
        Method::PUT,
        &format!("/v1/limits/{long_name}"),
        RATE,
    )
    .await;
    assert_error(&answer, 400, "bad_request", Some("name"));
    // Nothing refused was stored.
    let list = call(&admin, Method::GET, "/v1/limits", "")
        .await
        .json
        .expect("json");
    assert_eq!(list["limits"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_data_plane_requests_are_refused_naming_the_field() {
    let server = Server::start();
    put_limit(&server, "vendor-x", RATE).await;
    put_limit(
        &server,
        "per-user",
        r#"{"kind":"rate","limit":2,"period_ms":1000,"per":"user"}"#,
    )
    .await;
    let client = server.anonymous();
    let long_key = "k".repeat(300);
    let cases = [
        (r#"{"limits":["vendor-x"],"cost":0}"#.to_owned(), "cost"),
        (r#"{"limits":["vendor-x"],"cost":-1}"#.to_owned(), "cost"),
        (r#"{"limits":["vendor-x"],"cost":"1"}"#.to_owned(), "cost"),
        (
            r#"{"limits":["vendor-x"],"wait_ms":-1}"#.to_owned(),
            "wait_ms",
        ),
        // Past 2^53: no client's numbers hold it exactly, and no wait is that long.
        (
            r#"{"limits":["vendor-x"],"wait_ms":9223372036854775808}"#.to_owned(),
            "wait_ms",
        ),
        (
            r#"{"limits":["vendor-x"],"priority":"urgent"}"#.to_owned(),
            "priority",
        ),
        (
            r#"{"limits":["vendor-x"],"refundable":"no"}"#.to_owned(),
            "refundable",
        ),
        (
            r#"{"limits":["vendor-x"],"colour":"red"}"#.to_owned(),
            "colour",
        ),
        (r#"{"limits":"vendor-x"}"#.to_owned(), "limits"),
        (r#"{"limits":[]}"#.to_owned(), "limits"),
        (r#"{}"#.to_owned(), "limits"),
        (r#"{"limits":["Vendor X"]}"#.to_owned(), "limits[0]"),
        (r#"{"limits":["vendor-x","vendor-x"]}"#.to_owned(), "limits"),
        (r#"{"limits":["per-user"]}"#.to_owned(), "key"),
        (
            format!(r#"{{"limits":["per-user"],"key":"{long_key}"}}"#),
            "key",
        ),
        (r#"{"limits":["vendor-x"],"cost":5}"#.to_owned(), "cost"),
        ("not json".to_owned(), "body"),
    ];
    for (body, field) in cases {
        let answer = post(&client, "/v1/acquire", &body).await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
    let oversized = format!(
        r#"{{"limits":["vendor-x"],"key":"{}"}}"#,
        "k".repeat(70_000)
    );
    assert_error(
        &post(&client, "/v1/acquire", &oversized).await,
        400,
        "bad_request",
        Some("body"),
    );
    for (body, field) in [
        (r#"{"limit":"vendor-x"}"#, "retry_after_ms"),
        (
            r#"{"limit":"vendor-x","retry_after_ms":0}"#,
            "retry_after_ms",
        ),
        (
            r#"{"limit":"vendor-x","retry_after_ms":-5}"#,
            "retry_after_ms",
        ),
        (
            r#"{"limit":"vendor-x","retry_after_ms":100,"why":1}"#,
            "why",
        ),
        (
            r#"{"limit":"vendor-x","key":"u1","retry_after_ms":100}"#,
            "key",
        ),
        (r#"{"limit":"NOPE","retry_after_ms":100}"#, "limit"),
    ] {
        assert_error(
            &post(&client, "/v1/pause", body).await,
            400,
            "bad_request",
            Some(field),
        );
    }
    for (body, field) in [
        ("{}", "used"),
        (r#"{"used":-1}"#, "used"),
        (r#"{"used":1,"extra":true}"#, "extra"),
    ] {
        let answer = post(&client, "/v1/permits/00/commit", body).await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
    for permit in ["not-hex", "%ff00"] {
        assert_error(
            &post(
                &client,
                &format!("/v1/permits/{permit}/commit"),
                r#"{"used":1}"#,
            )
            .await,
            400,
            "bad_request",
            Some("permit"),
        );
    }
    assert_error(
        &post(&client, "/v1/permits/00/renew", r#"{"x":1}"#).await,
        400,
        "bad_request",
        Some("x"),
    );
    // No state was disturbed: both units of vendor-x are still there.
    granted(&client, r#"{"limits":["vendor-x"],"cost":2}"#).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_grants_denies_with_retry_after_and_commit_refunds_once() {
    let server = Server::start();
    put_limit(&server, "vendor-x", RATE).await;
    let client = server.anonymous();
    let first = granted(&client, r#"{"limits":["vendor-x"],"cost":2}"#).await;
    assert_eq!(first["limits"][0]["name"], "vendor-x");
    assert_eq!(first["limits"][0]["remaining"], 0);
    assert!(
        first["limits"][0]["reset_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0 && ms <= 60_000)
    );
    let denied = post(&client, "/v1/acquire", r#"{"limits":["vendor-x"]}"#).await;
    assert_error(&denied, 429, "rate_limited", None);
    let body = denied.json.as_ref().expect("json");
    let retry_after_ms = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(
        retry_after_ms > 0 && retry_after_ms <= 60_000,
        "{retry_after_ms}"
    );
    assert_eq!(body["reason"], "capacity");
    let header: u64 = denied.headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("whole seconds");
    assert_eq!(header, retry_after_ms.div_ceil(1000), "seconds, rounded up");
    // Commit one of two units: one comes back, once. The id's first character is sent
    // percent-encoded, as a client's URL library may: it is the same permit.
    let permit = permit_of(&first);
    let encoded = format!("%{:02X}{}", permit.as_bytes()[0], &permit[1..]);
    let committed = post(
        &client,
        &format!("/v1/permits/{encoded}/commit"),
        r#"{"used":1}"#,
    )
    .await;
    assert_eq!(committed.status, 200, "{}", committed.text());
    assert_eq!(
        committed.json.expect("json"),
        serde_json::json!({"refunded":1,"released":0})
    );
    let again = post(
        &client,
        &format!("/v1/permits/{permit}/commit"),
        r#"{"used":1}"#,
    )
    .await;
    assert_error(&again, 409, "conflict", None);
    granted(&client, r#"{"limits":["vendor-x"]}"#).await;
    assert_error(
        &post(&client, "/v1/acquire", r#"{"limits":["vendor-x"]}"#).await,
        429,
        "rate_limited",
        None,
    );
    // Used above cost is refused; a forged id is unknown; renewing a rate permit is a conflict.
    let other = server.anonymous();
    put_limit(
        &server,
        "big",
        r#"{"kind":"rate","limit":100,"period_ms":60000}"#,
    )
    .await;
    let grant = granted(&other, r#"{"limits":["big"],"cost":3}"#).await;
    let permit = permit_of(&grant);
    assert_error(
        &post(
            &other,
            &format!("/v1/permits/{permit}/commit"),
            r#"{"used":4}"#,
        )
        .await,
        400,
        "bad_request",
        Some("used"),
    );
    assert_error(
        &post(&other, &format!("/v1/permits/{permit}/renew"), "").await,
        409,
        "conflict",
        None,
    );
    let mut forged = permit.clone().into_bytes();
    let last = forged.len() - 1;
    forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
    let forged = String::from_utf8(forged).expect("ascii");
    assert_error(
        &post(
            &other,
            &format!("/v1/permits/{forged}/commit"),
            r#"{"used":0}"#,
        )
        .await,
        404,
        "not_found",
        None,
    );
    // An unknown limit is not found, not a bad request.
    assert_error(
        &post(&client, "/v1/acquire", r#"{"limits":["nope"]}"#).await,
        404,
        "not_found",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_is_not_refundable_counts_the_same_and_refunds_nothing() {
    let server = Server::start();
    put_limit(&server, "vendor-x", RATE).await;
    put_limit(&server, "pool", POOL).await;
    let client = server.anonymous();
    let grant = granted(
        &client,
        r#"{"limits":["vendor-x"],"cost":2,"refundable":false}"#,
    )
    .await;
    assert_eq!(grant["limits"][0]["remaining"], 0);
    // No reservation was recorded: its commit is a conflict that gives nothing back, and the
    // units stay counted for the whole period.
    let committed = post(
        &client,
        &format!("/v1/permits/{}/commit", permit_of(&grant)),
        r#"{"used":0}"#,
    )
    .await;
    assert_error(&committed, 409, "conflict", None);
    assert_error(
        &post(&client, "/v1/acquire", r#"{"limits":["vendor-x"]}"#).await,
        429,
        "rate_limited",
        None,
    );
    // A lease is a lease as always: held until its commit releases it.
    let lease = granted(&client, r#"{"limits":["pool"],"refundable":false}"#).await;
    assert_error(
        &post(&client, "/v1/acquire", r#"{"limits":["pool"]}"#).await,
        429,
        "rate_limited",
        None,
    );
    let released = post(
        &client,
        &format!("/v1/permits/{}/commit", permit_of(&lease)),
        r#"{"used":1}"#,
    )
    .await;
    assert_eq!(released.status, 200, "{}", released.text());
    assert_eq!(released.json.as_ref().expect("json")["released"], 1);
    granted(&client, r#"{"limits":["pool"]}"#).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_are_granted_all_or_nothing() {
    let server = Server::start();
    put_limit(
        &server,
        "a",
        r#"{"kind":"rate","limit":5,"period_ms":60000}"#,
    )
    .await;
    put_limit(
        &server,
        "b",
        r#"{"kind":"rate","limit":1,"period_ms":60000}"#,
    )
    .await;
    let client = server.anonymous();
    granted(&client, r#"{"limits":["b"]}"#).await;
    let denied = post(&client, "/v1/acquire", r#"{"limits":["a","b"],"cost":1}"#).await;
    assert_error(&denied, 429, "rate_limited", None);
    // `a` lost nothing.
    granted(&client, r#"{"limits":["a"],"cost":5}"#).await;
}

/// A language model's request: one request, its input and its output tokens, each its own
/// cost, all or none; committed by limit; what ran past the grant charged as a debt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_per_limit_commit_by_limit_and_charges_past_the_limit() {
    let server = Server::start();
    for (name, limit) in [("rpm", 10), ("input", 1_000), ("output", 500)] {
        put_limit(
            &server,
            name,
            &format!(r#"{{"kind":"rate","limit":{limit},"period_ms":60000}}"#),
        )
        .await;
    }
    let client = server.anonymous();
    let usage = |name: &'static str| {
        let admin = server.admin();
        async move {
            let stats = call(&admin, Method::GET, "/v1/stats", "")
                .await
                .json
                .expect("json");
            stats["limits"]
                .as_array()
                .expect("limits")
                .iter()
                .find(|limit| limit["name"] == name)
                .and_then(|limit| limit["usage"]["used"].as_u64())
                .expect("the limit's usage")
        }
    };
    let all = r#"["rpm","input","output"]"#;
    let grant = granted(
        &client,
        &format!(r#"{{"limits":{all},"costs":{{"input":600,"output":400.0}}}}"#),
    )
    .await;
    let remaining: Vec<u64> = grant["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .map(|limit| limit["remaining"].as_u64().expect("remaining"))
        .collect();
    assert_eq!(remaining, [9, 400, 100]);
    // Room for the request and its input, not its output: nothing taken.
    let denied = post(
        &client,
        "/v1/acquire",
        &format!(r#"{{"limits":{all},"costs":{{"input":100,"output":101}}}}"#),
    )
    .await;
    assert_error(&denied, 429, "rate_limited", None);
    assert_eq!(
        (
            usage("rpm").await,
            usage("input").await,
            usage("output").await
        ),
        (1, 600, 400)
    );
    for (body, field) in [
        (r#"{"limits":["rpm"],"costs":{"input":5}}"#, "costs.input"),
        (
            r#"{"limits":["rpm","input"],"costs":{"input":0}}"#,
            "costs.input",
        ),
        (
            r#"{"limits":["rpm","input"],"costs":{"input":1.5}}"#,
            "costs.input",
        ),
        (r#"{"limits":["rpm","input"],"costs":[1,2]}"#, "costs"),
        (
            r#"{"limits":["rpm","input"],"costs":{"input":2000000000}}"#,
            "costs.input",
        ),
    ] {
        let answer = post(&client, "/v1/acquire", body).await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
    let commit = format!("/v1/permits/{}/commit", permit_of(&grant));
    for (body, message) in [
        (r#"{"used":{"rpm":1,"input":100}}"#, "output\\\" is missing"),
        (
            r#"{"used":{"rpm":1,"input":100,"output":50,"other":1}}"#,
            "other\\\" is not in this permit",
        ),
        (r#"{"used":{"rpm":1,"input":100,"output":-1}}"#, ""),
        (r#"{"used":"all"}"#, ""),
    ] {
        let answer = post(&client, &commit, body).await;
        assert_eq!(answer.status.as_u16(), 400, "{body}: {}", answer.text());
        assert!(answer.text().contains(message), "{body}: {}", answer.text());
    }
    // The refused commits settled nothing.
    assert_eq!(
        (
            usage("rpm").await,
            usage("input").await,
            usage("output").await
        ),
        (1, 600, 400)
    );
    let committed = post(
        &client,
        &commit,
        r#"{"used":{"rpm":1,"input":250,"output":380}}"#,
    )
    .await;
    assert_eq!(committed.status.as_u16(), 200, "{}", committed.text());
    assert_eq!(committed.json.as_ref().expect("json")["refunded"], 370);
    assert_eq!(
        (
            usage("rpm").await,
            usage("input").await,
            usage("output").await
        ),
        (1, 250, 380)
    );
    // The answer ran 300 tokens past its grant: a debt counted past the limit.
    let charged = post(&client, "/v1/charge", r#"{"limits":["output"],"cost":300}"#).await;
    assert_eq!(charged.status.as_u16(), 200, "{}", charged.text());
    let view = &charged.json.as_ref().expect("json")["limits"][0];
    assert_eq!(
        (view["name"].as_str(), view["charged"].as_u64()),
        (Some("output"), Some(300))
    );
    assert_eq!(view["used"], 680);
    assert_eq!(usage("output").await, 680);
    let denied = post(
        &client,
        "/v1/acquire",
        r#"{"limits":["output"],"priority":"high"}"#,
    )
    .await;
    assert_error(&denied, 429, "rate_limited", None);
    // At most one capacity past the limit.
    let charged = post(
        &client,
        "/v1/charge",
        r#"{"limits":["output","input"],"costs":{"output":5000}}"#,
    )
    .await;
    assert_eq!(charged.status.as_u16(), 200, "{}", charged.text());
    let views = charged.json.as_ref().expect("json")["limits"].clone();
    assert_eq!(views[0]["charged"], 320);
    assert_eq!(views[1]["charged"], 1);
    for (body, status, code, field) in [
        (
            r#"{"limits":["output"],"cost":0}"#,
            400,
            "bad_request",
            Some("cost"),
        ),
        (
            r#"{"limits":["output"],"costs":{"rpm":1}}"#,
            400,
            "bad_request",
            Some("costs.rpm"),
        ),
        (r#"{"limits":[]}"#, 400, "bad_request", Some("limits")),
        (r#"{"limits":["nowhere"]}"#, 404, "not_found", None),
        (
            r#"{"limits":["output"],"used":1}"#,
            400,
            "bad_request",
            Some("used"),
        ),
    ] {
        let answer = post(&client, "/v1/charge", body).await;
        assert_error(&answer, status, code, field);
    }
    put_limit(
        &server,
        "pool",
        r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":30000}"#,
    )
    .await;
    let answer = post(&client, "/v1/charge", r#"{"limits":["pool"]}"#).await;
    assert_error(&answer, 400, "bad_request", Some("limits"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_carry_fences_renew_and_release() {
    let server = Server::start();
    put_limit(&server, "pool", POOL).await;
    let client = server.anonymous();
    let lease = granted(&client, r#"{"limits":["pool"]}"#).await;
    let fence = lease["limits"][0]["fence"].as_u64().expect("fence");
    assert!(
        lease["limits"][0]["expires_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0 && ms <= 60_000)
    );
    let permit = permit_of(&lease);
    let renewed = post(&client, &format!("/v1/permits/{permit}/renew"), "").await;
    assert_eq!(renewed.status, 200, "{}", renewed.text());
    assert!(
        renewed.json.expect("json")["expires_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0)
    );
    assert_error(
        &post(&client, "/v1/acquire", r#"{"limits":["pool"]}"#).await,
        429,
        "rate_limited",
        None,
    );
    let released = post(
        &client,
        &format!("/v1/permits/{permit}/commit"),
        r#"{"used":0}"#,
    )
    .await;
    assert_eq!(released.json.expect("json")["released"], 1);
    assert_error(
        &post(&client, &format!("/v1/permits/{permit}/renew"), "{}").await,
        409,
        "conflict",
        None,
    );
    let next = granted(&client, r#"{"limits":["pool"]}"#).await;
    assert!(
        next["limits"][0]["fence"].as_u64().expect("fence") > fence,
        "fences only grow"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_is_granted_when_room_appears() {
    let server = Server::start();
    put_limit(&server, "pool", POOL).await;
    let client = server.anonymous();
    let holder = permit_of(&granted(&client, r#"{"limits":["pool"]}"#).await);
    let waiter = {
        let client = server.anonymous();
        tokio::spawn(async move {
            post(
                &client,
                "/v1/acquire",
                r#"{"limits":["pool"],"wait_ms":25000}"#,
            )
            .await
        })
    };
    // Release once the waiter is queued (visible in the metrics).
    let metrics = server.anonymous();
    until("the waiter is queued", async || {
        call(&metrics, Method::GET, "/metrics", "")
            .await
            .text()
            .contains("tollgate_waiters{limit=\"pool\"} 1")
    })
    .await;
    post(
        &client,
        &format!("/v1/permits/{holder}/commit"),
        r#"{"used":0}"#,
    )
    .await;
    let answer = waiter.await.expect("joined");
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_are_capped_by_configuration() {
    let server = Server::start_with(Options {
        args: vec!["--wait-ms-max", "300"],
        ..Options::default()
    });
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":1,"period_ms":3600000}"#,
    )
    .await;
    let client = server.anonymous();
    granted(&client, r#"{"limits":["vendor-x"]}"#).await;
    let started = Instant::now();
    let answer = post(
        &client,
        "/v1/acquire",
        r#"{"limits":["vendor-x"],"wait_ms":3600000}"#,
    )
    .await;
    assert_error(&answer, 429, "rate_limited", None);
    // Asked for an hour, capped at 300 ms. The client itself gives up at DEADLINE, so the
    // bound must be well under it to tell a cap from a client timeout: a third of it is still
    // over thirty times the cap.
    assert!(started.elapsed() < DEADLINE / 3, "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_grants_and_only_extends() {
    let server = Server::start();
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":100,"period_ms":1000}"#,
    )
    .await;
    let client = server.anonymous();
    let paused = post(
        &client,
        "/v1/pause",
        r#"{"limit":"vendor-x","retry_after_ms":60000}"#,
    )
    .await;
    assert_eq!(paused.status, 200, "{}", paused.text());
    let body = paused.json.expect("json");
    assert_eq!(body["limit"], "vendor-x");
    let first_ms = body["paused_ms"].as_u64().expect("paused_ms");
    assert!(first_ms > 50_000 && first_ms <= 60_000, "{first_ms}");
    // A shorter pause does not shorten it.
    let shorter = post(
        &client,
        "/v1/pause",
        r#"{"limit":"vendor-x","retry_after_ms":10}"#,
    )
    .await;
    assert!(
        shorter.json.expect("json")["paused_ms"]
            .as_u64()
            .expect("ms")
            > 10_000
    );
    let denied = post(
        &client,
        "/v1/acquire",
        r#"{"limits":["vendor-x"],"priority":"high"}"#,
    )
    .await;
    assert_error(&denied, 429, "rate_limited", None);
    assert_eq!(denied.json.expect("json")["reason"], "paused");
    assert_error(
        &post(
            &client,
            "/v1/pause",
            r#"{"limit":"nope","retry_after_ms":100}"#,
        )
        .await,
        404,
        "not_found",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_applies_matching_rules_per_user() {
    let server = Server::start();
    put_limit(
        &server,
        "entity-bundle",
        r#"{"kind":"rate","limit":1,"period_ms":60000,"algorithm":"fixed","per":"user",
            "match":{"method":"GET","path":"/repo/v1/entity/#/bundle"}}"#,
    )
    .await;
    put_limit(
        &server,
        "user-concurrency",
        r#"{"kind":"concurrency","limit":5,"lease_ttl_ms":60000,"per":"user",
            "match":{"method":"*","path":"*"}}"#,
    )
    .await;
    let client = server.anonymous();
    let body = r#"{"user":"u1","method":"GET","path":"/repo/v1/entity/123/bundle?x=1"}"#;
    let allowed = post(&client, "/v1/check", body).await;
    assert_eq!(allowed.status, 200, "{}", allowed.text());
    let allowed = allowed.json.expect("json");
    assert_eq!(allowed["allowed"], true);
    assert_eq!(allowed["path"], "/repo/v1/entity/#/bundle");
    assert_eq!(
        allowed["matched"],
        serde_json::json!(["entity-bundle", "user-concurrency"])
    );
    let permit = allowed["permit"]
        .as_str()
        .expect("a lease applied")
        .to_owned();
    let denied = post(
        &client,
        "/v1/check",
        r#"{"user":"u1","method":"GET","path":"/repo/v1/entity/456/bundle"}"#,
    )
    .await;
    assert_error(&denied, 429, "rate_limited", None);
    assert_eq!(denied.json.as_ref().expect("json")["allowed"], false);
    assert!(denied.headers.contains_key("retry-after"));
    // Another user, and another path, are not affected.
    let other = post(
        &client,
        "/v1/check",
        r#"{"user":"u2","method":"GET","path":"/repo/v1/entity/1/bundle"}"#,
    )
    .await;
    assert_eq!(other.status, 200, "{}", other.text());
    let unmatched = post(
        &client,
        "/v1/check",
        r#"{"user":"u1","method":"POST","path":"/elsewhere"}"#,
    )
    .await;
    assert_eq!(
        unmatched.json.expect("json")["matched"],
        serde_json::json!(["user-concurrency"])
    );
    let done = post(
        &client,
        &format!("/v1/permits/{permit}/commit"),
        r#"{"used":1}"#,
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.text());
    assert_error(
        &post(&client, "/v1/check", r#"{"method":"GET","path":"/x"}"#).await,
        400,
        "bad_request",
        Some("user"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_of_rates_alone_answers_without_a_permit() {
    let server = Server::start();
    put_limit(
        &server,
        "entity-bundle",
        r#"{"kind":"rate","limit":2,"period_ms":60000,"algorithm":"fixed","per":"user",
            "match":{"method":"GET","path":"/repo/v1/entity/#/bundle"}}"#,
    )
    .await;
    let client = server.anonymous();
    let body = r#"{"user":"u1","method":"GET","path":"/repo/v1/entity/7/bundle"}"#;
    for remaining in [1, 0] {
        let answer = post(&client, "/v1/check", body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let answer = answer.json.expect("json");
        assert_eq!(answer["allowed"], true);
        assert_eq!(answer["matched"], serde_json::json!(["entity-bundle"]));
        assert!(answer.get("permit").is_none_or(|p| p.is_null()), "{answer}");
        assert_eq!(answer["limits"][0]["name"], "entity-bundle");
        assert_eq!(answer["limits"][0]["remaining"], remaining);
        let reset_ms = answer["limits"][0]["reset_ms"].as_u64().expect("reset_ms");
        assert!((1..=60_000).contains(&reset_ms), "{reset_ms}");
    }
    let denied = post(&client, "/v1/check", body).await;
    assert_error(&denied, 429, "rate_limited", None);
    assert_eq!(denied.json.as_ref().expect("json")["allowed"], false);
    let long_user = "u".repeat(300);
    let bad =
        format!(r#"{{"user":"{long_user}","method":"GET","path":"/repo/v1/entity/7/bundle"}}"#);
    assert_error(
        &post(&client, "/v1/check", &bad).await,
        400,
        "bad_request",
        Some("user"),
    );
}

/// `/v1/check` matches the path the application routes: percent-decoded, dot segments
/// resolved, numbers in any format, `%2F` also as a slash; a path that cannot be decoded is
/// refused naming `path`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_matches_every_spelling_of_a_path() {
    let server = Server::start();
    put_limit(
        &server,
        "entity-bundle",
        r#"{"kind":"rate","limit":100,"period_ms":60000,"algorithm":"fixed","per":"user",
            "match":{"method":"GET","path":"/repo/v1/entity/#/bundle"}}"#,
    )
    .await;
    let client = server.anonymous();
    for path in [
        "/repo/v1/entity/%31%32/bundle",
        "/repo/v1/entity/+12/bundle",
        "/repo/v1/entity/012/bundle",
        "/repo/v1/entity/./12/bundle?x=%ZZ",
        "/repo/v1/%65ntity/%2b12/bundle",
    ] {
        check_matches(&client, path, "/repo/v1/entity/#/bundle", "entity-bundle").await;
    }
    let encoded_slash = post(
        &client,
        "/v1/check",
        r#"{"user":"u1","method":"GET","path":"/repo/v1/entity%2F12/bundle"}"#,
    )
    .await;
    assert_eq!(encoded_slash.status, 200, "{}", encoded_slash.text());
    let encoded_slash = encoded_slash.json.expect("json");
    // Read as written, `%2F` stays inside its segment; read decoded, as a WSGI or ASGI server
    // routes it, it is the rule's path: the request is counted under it.
    assert_eq!(encoded_slash["path"], "/repo/v1/entity%2F12/bundle");
    assert_eq!(
        encoded_slash["matched"],
        serde_json::json!(["entity-bundle"])
    );
    for path in ["/repo/v1/entity/%ZZ/bundle", "/repo/v1/entity/%FF/bundle"] {
        let body = format!(r#"{{"user":"u1","method":"GET","path":"{path}"}}"#);
        assert_error(
            &post(&client, "/v1/check", &body).await,
            400,
            "bad_request",
            Some("path"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_keys_is_a_clear_error() {
    let server = Server::start_with(Options {
        args: vec!["--keys-tracked-max", "2", "--keys-per-limit-max", "2"],
        ..Options::default()
    });
    put_limit(
        &server,
        "per-user",
        r#"{"kind":"rate","limit":5,"period_ms":60000,"per":"user"}"#,
    )
    .await;
    let client = server.anonymous();
    granted(&client, r#"{"limits":["per-user"],"key":"u1"}"#).await;
    granted(&client, r#"{"limits":["per-user"],"key":"u2"}"#).await;
    let answer = post(
        &client,
        "/v1/acquire",
        r#"{"limits":["per-user"],"key":"u3"}"#,
    )
    .await;
    assert_error(&answer, 503, "too_many_keys", None);
    // A charge on a new key is held to the same budget.
    let answer = post(
        &client,
        "/v1/charge",
        r#"{"limits":["per-user"],"key":"u3","cost":5}"#,
    )
    .await;
    assert_error(&answer, 503, "too_many_keys", None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_plane_token_is_enforced_when_configured() {
    let server = Server::start_with(Options {
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_DATA_TOKEN", "data"),
        ],
        ..Options::default()
    });
    put_limit(&server, "vendor-x", RATE).await;
    for path in [
        "/v1/acquire",
        "/v1/pause",
        "/v1/check",
        "/v1/permits/00/commit",
        "/v1/permits/00/renew",
        "/v1/charge",
    ] {
        assert_error(
            &post(&server.anonymous(), path, "{}").await,
            401,
            "unauthorized",
            None,
        );
        assert_error(
            &post(&server.with_token("nope"), path, "{}").await,
            401,
            "unauthorized",
            None,
        );
    }
    granted(&server.with_token("data"), r#"{"limits":["vendor-x"]}"#).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_endpoints_answer() {
    let server = Server::start();
    put_limit(&server, "vendor-x", RATE).await;
    let client = server.anonymous();
    granted(&client, r#"{"limits":["vendor-x"]}"#).await;
    let health = call(&client, Method::GET, "/healthz", "").await;
    assert_eq!(health.status, 200);
    let ready = call(&client, Method::GET, "/readyz", "").await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(ready.json.expect("json")["rules"], "ok");
    let metrics = call(&client, Method::GET, "/metrics", "").await;
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    for family in [
        "tollgate_grants_total{limit=\"vendor-x\"} 1",
        "tollgate_store_round_trip_seconds_bucket",
        "tollgate_rules_reloads_total{outcome=\"ok\"}",
        "tollgate_rules_rows_rejected 0",
        "tollgate_rules_limits 1",
        "tollgate_keys_tracked 1",
    ] {
        assert!(text.contains(family), "{family} missing from:\n{text}");
    }
    let openapi = call(&client, Method::GET, "/openapi.json", "").await;
    assert_eq!(openapi.status, 200);
    let document = openapi.json.expect("json");
    for path in [
        "/v1/limits",
        "/v1/limits/{name}",
        "/v1/acquire",
        "/v1/permits/{permit}/commit",
        "/v1/permits/{permit}/renew",
        "/v1/pause",
        "/v1/check",
    ] {
        assert!(
            document["paths"].get(path).is_some(),
            "{path} missing from the OpenAPI document"
        );
    }
    assert!(document["components"]["schemas"].get("RawRule").is_some());
    assert_error(
        &call(&client, Method::GET, "/v2/nothing", "").await,
        404,
        "not_found",
        None,
    );
    for path in ["/v1/acquire", "/v1/permits/00/commit"] {
        assert_error(
            &call(&client, Method::GET, path, "").await,
            405,
            "bad_request",
            None,
        );
    }
    // The body limit and the error counter wrap the whole router: a body over the limit is
    // refused naming the body, and every error answer above is counted by its code.
    let oversized = format!(
        r#"{{"limits":["vendor-x"],"key":"{}"}}"#,
        "k".repeat(70_000)
    );
    assert_error(
        &call(&client, Method::POST, "/v1/acquire", &oversized).await,
        400,
        "bad_request",
        Some("body"),
    );
    let text = call(&client, Method::GET, "/metrics", "").await.text();
    for counted in [
        "tollgate_http_errors_total{code=\"not_found\"} 1",
        "tollgate_http_errors_total{code=\"bad_request\"} 3",
    ] {
        assert!(text.contains(counted), "{counted} missing from:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_waiters_clearly_and_finishes_in_flight_requests() {
    let mut server = Server::start();
    put_limit(&server, "pool", POOL).await;
    let client = server.anonymous();
    granted(&client, r#"{"limits":["pool"]}"#).await;
    let waiter = {
        let client = server.anonymous();
        tokio::spawn(async move {
            post(
                &client,
                "/v1/acquire",
                r#"{"limits":["pool"],"wait_ms":25000}"#,
            )
            .await
        })
    };
    until("the waiter is queued", async || {
        call(&client, Method::GET, "/metrics", "")
            .await
            .text()
            .contains("tollgate_waiters{limit=\"pool\"} 1")
    })
    .await;
    let status = tokio::task::spawn_blocking(move || {
        let status = server.terminate();
        (status, server)
    });
    let answer = waiter.await.expect("joined");
    assert_error(&answer, 503, "store_unavailable", None);
    assert!(
        answer
            .error_message()
            .is_some_and(|m| m.contains("shutting down"))
    );
    let (status, server) = status.await.expect("joined");
    assert!(status.success(), "exit {status:?}; log:\n{}", server.log());
    assert!(server.log().contains("stopped"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_edited_by_plain_sql_take_effect_and_bad_rows_keep_the_last_good_version() {
    let server = Server::start_with(Options {
        args: vec!["--reload-interval-ms", "100"],
        ..Options::default()
    });
    // `serve` with no --rules uses ./tollgate.db: edit it as an administrator would.
    let url = format!(
        "sqlite://{}",
        server.directory.path().join("tollgate.db").display()
    );
    let pool = sqlx::SqlitePool::connect(&url)
        .await
        .expect("the server created tollgate.db");
    let exec = async |sql: &str| {
        sqlx::query(sql)
            .execute(&pool)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    };
    exec("INSERT INTO tollgate_limits (name, kind, limit_units, period_ms) VALUES ('vendor-x', 'rate', 1, 60000)").await;
    let admin = server.admin();
    until("the row is in force", async || {
        call(&admin, Method::GET, "/v1/limits/vendor-x", "")
            .await
            .status
            == 200
    })
    .await;
    let client = server.anonymous();
    granted(&client, r#"{"limits":["vendor-x"]}"#).await;
    // The row turns invalid: the last valid version stays, its counter untouched.
    exec("UPDATE tollgate_limits SET period_ms = 0 WHERE name = 'vendor-x'").await;
    until("the rejection is reported", async || {
        let list = call(&admin, Method::GET, "/v1/limits", "")
            .await
            .json
            .expect("json");
        list["rejected"]
            .as_array()
            .is_some_and(|rows| !rows.is_empty())
    })
    .await;
    let list = call(&admin, Method::GET, "/v1/limits", "")
        .await
        .json
        .expect("json");
    assert_eq!(list["rejected"][0]["name"], "vendor-x");
    assert_eq!(list["rejected"][0]["column"], "period_ms");
    assert_eq!(list["rejected"][0]["previous_in_force"], true);
    assert_eq!(list["limits"][0]["period_ms"], 60000);
    assert_error(
        &post(&client, "/v1/acquire", r#"{"limits":["vendor-x"]}"#).await,
        429,
        "rate_limited",
        None,
    );
    let metrics = call(&client, Method::GET, "/metrics", "").await.text();
    assert!(
        metrics.contains("tollgate_rules_rows_rejected 1"),
        "{metrics}"
    );
    assert!(
        server.log().contains("rules row rejected"),
        "{}",
        server.log()
    );
    // Fixed by hand, with room for more: the counter still remembers the unit granted.
    exec("UPDATE tollgate_limits SET period_ms = 60000, limit_units = 2 WHERE name = 'vendor-x'")
        .await;
    until("the fix is in force", async || {
        let shown = call(&admin, Method::GET, "/v1/limits/vendor-x", "")
            .await
            .json
            .expect("json");
        shown["limit"] == 2
    })
    .await;
    granted(&client, r#"{"limits":["vendor-x"]}"#).await;
    assert_error(
        &post(&client, "/v1/acquire", r#"{"limits":["vendor-x"]}"#).await,
        429,
        "rate_limited",
        None,
    );
    // Admin writes land in the same table.
    put_limit(&server, "written", POOL).await;
    let rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM tollgate_limits WHERE name = 'written'")
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(rows, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_share_one_quota() {
    let Ok(redis) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(
            "two_replicas_on_one_redis_share_one_quota: TOLLGATE_TEST_REDIS unset",
        );
        return;
    };
    let (first, second) = replicas_on(&redis, "http-test");
    // Each replica has its own rules file here; both define the same limit.
    for server in [&first, &second] {
        put_limit(
            server,
            "shared",
            r#"{"kind":"rate","limit":3,"period_ms":10000}"#,
        )
        .await;
    }
    let (a, b) = (first.anonymous(), second.anonymous());
    // A new namespace is a store that lost its state: nothing is granted for one period (G6).
    // Wait it out in the queue, then spend the quota across both replicas within the period.
    let opening = post(
        &a,
        "/v1/acquire",
        r#"{"limits":["shared"],"wait_ms":25000}"#,
    )
    .await;
    assert_eq!(opening.status, 200, "{}", opening.text());
    let from_b = granted(&b, r#"{"limits":["shared"]}"#).await;
    granted(&a, r#"{"limits":["shared"]}"#).await;
    assert_error(
        &post(&b, "/v1/acquire", r#"{"limits":["shared"]}"#).await,
        429,
        "rate_limited",
        None,
    );
    assert_error(
        &post(&a, "/v1/acquire", r#"{"limits":["shared"]}"#).await,
        429,
        "rate_limited",
        None,
    );
    // A permit from one replica commits through the other (shared permit secret).
    let permit = permit_of(&from_b);
    let committed = post(&a, &format!("/v1/permits/{permit}/commit"), r#"{"used":0}"#).await;
    assert_eq!(committed.status, 200, "{}", committed.text());
    granted(&b, r#"{"limits":["shared"]}"#).await;
}

/// Two servers on one Redis namespace of their own (`prefix`, this process, the time),
/// sharing a permit secret: replicas of one deployment.
fn replicas_on(redis: &str, prefix: &str) -> (Server, Server) {
    let namespace = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos())
    );
    let start = || {
        Server::start_with(Options {
            args: vec!["--store", redis, "--redis-namespace", &namespace],
            env: vec![
                ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
                ("TOLLGATE_PERMIT_SECRET", "00112233445566778899aabbccddeeff"),
            ],
            ..Options::default()
        })
    };
    (start(), start())
}

/// On Redis, through two replicas: costs per limit all or none, and a charge made through one
/// replica is a debt the other's callers wait out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_through_one_replica_is_a_debt_on_the_other() {
    let Ok(redis) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(
            "a_charge_through_one_replica_is_a_debt_on_the_other: TOLLGATE_TEST_REDIS unset",
        );
        return;
    };
    let (first, second) = replicas_on(&redis, "http-charge");
    for server in [&first, &second] {
        put_limit(
            server,
            "calls",
            r#"{"kind":"rate","limit":5,"period_ms":10000}"#,
        )
        .await;
        put_limit(
            server,
            "tokens",
            r#"{"kind":"rate","limit":10,"period_ms":10000}"#,
        )
        .await;
    }
    let (a, b) = (first.anonymous(), second.anonymous());
    // A new namespace holds for one period (G6): wait it out in the queue.
    let opening = post(
        &a,
        "/v1/acquire",
        r#"{"limits":["calls","tokens"],"costs":{"tokens":4},"wait_ms":25000}"#,
    )
    .await;
    assert_eq!(opening.status, 200, "{}", opening.text());
    let charged = post(&b, "/v1/charge", r#"{"limits":["tokens"],"cost":30}"#).await;
    assert_eq!(charged.status, 200, "{}", charged.text());
    let view = &charged.json.as_ref().expect("json")["limits"][0];
    assert_eq!(
        view["charged"], 16,
        "one capacity past the limit at most: {view}"
    );
    assert_eq!(view["used"], 20, "{view}");
    for body in [
        r#"{"limits":["tokens"],"priority":"high"}"#,
        r#"{"limits":["calls","tokens"],"costs":{"tokens":1}}"#,
    ] {
        assert_error(
            &post(&a, "/v1/acquire", body).await,
            429,
            "rate_limited",
            None,
        );
    }
    // The denied request took nothing from `calls`: four are left.
    granted(&b, r#"{"limits":["calls"],"cost":4}"#).await;
    // The opening permit commits by limit through the other replica; the debt stays.
    let permit = permit_of(&opening.json.clone().expect("json"));
    let committed = post(
        &b,
        &format!("/v1/permits/{permit}/commit"),
        r#"{"used":{"calls":1,"tokens":2}}"#,
    )
    .await;
    assert_eq!(committed.status, 200, "{}", committed.text());
    assert_eq!(committed.json.as_ref().expect("json")["refunded"], 2);
    assert_error(
        &post(&a, "/v1/acquire", r#"{"limits":["tokens"]}"#).await,
        429,
        "rate_limited",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_is_refused_clearly_at_start() {
    let directory = tempfile::tempdir().expect("tempdir");
    // Port 1 on loopback: nothing listens there.
    let output = command(directory.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "redis://127.0.0.1:1/0",
        ])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("store redis://127.0.0.1:1/0"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_applies_every_matching_rule_and_refuses_a_rule_set_too_wide_for_one_request() {
    let server = Server::start();
    let admin = server.admin();
    let broad = r#"{"kind":"rate","limit":1000,"period_ms":3600000,"per":"user",
        "match":{"method":"*","path":"*"}}"#;
    // Seven broad per-user rules and a 1-per-hour endpoint rule: a GET on the endpoint matches
    // 8, the most one request may be decided on. The endpoint rule comes last by name.
    for n in 0..7 {
        put_limit(&server, &format!("broad-{n}"), broad).await;
    }
    put_limit(
        &server,
        "z-entity-bundle",
        r#"{"kind":"rate","limit":1,"period_ms":3600000,"algorithm":"fixed","per":"user",
            "match":{"method":"GET","path":"/repo/v1/entity/#/bundle"}}"#,
    )
    .await;
    // An eighth broad rule would let that GET match 9: refused, naming the request, and not
    // stored.
    let refused = call(&admin, Method::PUT, "/v1/limits/broad-7", broad).await;
    assert_error(&refused, 400, "bad_request", Some("match"));
    let message = refused.error_message().unwrap_or_default();
    assert!(
        message.contains("a GET request on /repo/v1/entity/#/bundle would match 9 rules")
            && message.contains("at most 8"),
        "{message}"
    );
    assert_error(
        &call(&admin, Method::GET, "/v1/limits/broad-7", "").await,
        404,
        "not_found",
        None,
    );
    // Replacing a rule in force does not count it twice.
    put_limit(&server, "broad-0", broad).await;
    let client = server.anonymous();
    let body = r#"{"user":"u1","method":"GET","path":"/repo/v1/entity/123/bundle"}"#;
    let first = post(&client, "/v1/check", body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let matched = first.json.expect("json")["matched"].clone();
    assert_eq!(matched.as_array().map(Vec::len), Some(8), "{matched}");
    assert_eq!(matched[7], "z-entity-bundle");
    let second = post(&client, "/v1/check", body).await;
    assert_error(&second, 429, "rate_limited", None);
    // Without the endpoint rule there is room for an eighth broad rule, and not a ninth.
    let deleted = call(&admin, Method::DELETE, "/v1/limits/z-entity-bundle", "").await;
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    put_limit(&server, "broad-7", broad).await;
    let refused = call(&admin, Method::PUT, "/v1/limits/broad-8", broad).await;
    assert_error(&refused, 400, "bad_request", Some("match"));
    assert!(
        refused
            .error_message()
            .is_some_and(|m| m.contains("any request would match 9 rules")),
        "{}",
        refused.text()
    );
    let list = call(&admin, Method::GET, "/v1/limits", "")
        .await
        .json
        .expect("json");
    assert_eq!(list["limits"].as_array().map(Vec::len), Some(8), "{list}");
}

/// The request a check describes, as the application would serve it: HEAD is served by the
/// GET handler, so a rule on GET applies to HEAD and HEAD spends its units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_applies_get_rules_to_head() {
    let server = Server::start();
    put_limit(
        &server,
        "entity-bundle",
        r#"{"kind":"rate","limit":2,"period_ms":60000,"algorithm":"fixed","per":"user",
            "match":{"method":"GET","path":"/repo/v1/entity/#/bundle"}}"#,
    )
    .await;
    let client = server.anonymous();
    let check = |method: &'static str| {
        let client = &client;
        async move {
            let body =
                format!(r#"{{"user":"u1","method":"{method}","path":"/repo/v1/entity/7/bundle"}}"#);
            post(client, "/v1/check", &body).await
        }
    };
    let head = check("HEAD").await;
    assert_eq!(head.status, 200, "{}", head.text());
    assert_eq!(
        head.json.expect("json")["matched"],
        serde_json::json!(["entity-bundle"])
    );
    assert_eq!(check("GET").await.status, 200);
    assert_error(&check("GET").await, 429, "rate_limited", None);
    assert_error(&check("HEAD").await, 429, "rate_limited", None);
    assert_error(&check("head").await, 429, "rate_limited", None);
    // A rule on GET is not a rule on other methods.
    let other = check("POST").await;
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(other.json.expect("json")["matched"], serde_json::json!([]));
}

/// A UUID is an id however the router's parser accepts it: braced, or as a URN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_braced_uuids_as_ids() {
    let server = Server::start();
    put_limit(
        &server,
        "file-read",
        r#"{"kind":"rate","limit":100,"period_ms":60000,"per":"user",
            "match":{"method":"GET","path":"/files/#"}}"#,
    )
    .await;
    let client = server.anonymous();
    for path in [
        "/files/0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00",
        "/files/{0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00}",
        "/files/%7B0B2F7A4E-91C4-4F57-9D6A-3E1C2B9A8F00%7D",
        "/files/{0b2f7a4e91c44f579d6a3e1c2b9a8f00}",
        "/files/urn:uuid:0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00",
    ] {
        check_matches(&client, path, "/files/#", "file-read").await;
    }
}

/// Behind a router that ignores case and drops `;` parameters, `path_case = "insensitive"` and
/// `path_params = "strip"` make `/v1/check` read paths as that router does: every spelling it
/// routes to the handler meets the handler's rule. Rule paths are read the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_paths_as_the_configured_router_does() {
    const RULE: &str = r#"{"kind":"rate","limit":100,"period_ms":60000,"per":"user",
        "match":{"method":"GET","path":"/Repo/Entity/#/Bundle"}}"#;
    let spellings = [
        "/Repo/Entity/12/Bundle",
        "/repo/entity/12/bundle",
        "/REPO/Entity/12;jsessionid=0A1B/Bundle",
        "/repo;v=2/entity/12/bundle;x",
        "/repo/x/..;/entity/12/bundle",
    ];
    let matched = async |server: &Server| {
        let client = server.anonymous();
        let mut matched = Vec::new();
        for path in spellings {
            let body = format!(r#"{{"user":"u1","method":"GET","path":"{path}"}}"#);
            let answer = post(&client, "/v1/check", &body).await;
            assert_eq!(answer.status, 200, "{path}: {}", answer.text());
            let answer = answer.json.expect("json");
            matched.push(answer["matched"] == serde_json::json!(["rule"]));
        }
        matched
    };
    let routed_as_axum = Server::start();
    put_limit(&routed_as_axum, "rule", RULE).await;
    assert_eq!(
        matched(&routed_as_axum).await,
        [true, false, false, false, false]
    );

    let routed_as_spring = Server::start_with(Options {
        args: vec!["--path-case", "insensitive"],
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_PATH_PARAMS", "strip"),
        ],
        ..Options::default()
    });
    put_limit(&routed_as_spring, "rule", RULE).await;
    assert_eq!(matched(&routed_as_spring).await, [true; 5]);
    let answer = post(
        &routed_as_spring.anonymous(),
        "/v1/check",
        r#"{"user":"u1","method":"HEAD","path":"/REPO/Entity/12;x/Bundle"}"#,
    )
    .await;
    let answer = answer.json.expect("json");
    assert_eq!(answer["path"], "/repo/entity/#/bundle");
    assert_eq!(answer["matched"], serde_json::json!(["rule"]));
}

/// `/v1/check` of `GET path` for one user is allowed, reads the path as `normal`, and matches
/// the rule `rule` alone.
async fn check_matches(
    client: &tollgate_cli::client::Client,
    path: &str,
    normal: &str,
    rule: &str,
) {
    let body = format!(r#"{{"user":"u1","method":"GET","path":"{path}"}}"#);
    let answer = post(client, "/v1/check", &body).await;
    assert_eq!(answer.status, 200, "{path}: {}", answer.text());
    let answer = answer.json.expect("json");
    assert_eq!(answer["path"], normal, "{path}");
    assert_eq!(answer["matched"], serde_json::json!([rule]), "{path}");
}

/// Someone who opens the server's address in a browser (or any unknown path) is told where the
/// dashboard and the API's description are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_leads_to_the_dashboard_and_the_description() {
    let server = Server::start();
    let answer = call(&server.anonymous(), Method::GET, "/", "").await;
    assert_error(&answer, 404, "not_found", None);
    let message = answer.error_message().unwrap_or_default();
    assert!(
        message.contains("/ui") && message.contains("/openapi.json"),
        "{message}"
    );
}
