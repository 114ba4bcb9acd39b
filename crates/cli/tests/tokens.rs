//! Scoped data tokens end to end, on the built `tollgate` binary: made, listed and revoked
//! through the admin API and `tollgate tokens`, and held to their limits, highest priority and
//! right to pause on every data-plane endpoint.

mod common;

use std::time::Duration;

use common::*;
use hyper::Method;

const DATA_TOKEN: &str = "data-token-for-tests";
const RATE: &str = r#"{"kind":"rate","limit":100,"period_ms":60000}"#;

/// A server whose data plane needs a token, with `vendor-x`, `vendor-y` and `billing`.
async fn guarded_server(args: Vec<&str>) -> Server {
    let server = Server::start_with(Options {
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_DATA_TOKEN", DATA_TOKEN),
        ],
        args,
        ..Options::default()
    });
    for name in ["vendor-x", "vendor-y", "billing"] {
        put_limit(&server, name, RATE).await;
    }
    put_limit(
        &server,
        "billing-api",
        r#"{"kind":"rate","limit":100,"period_ms":60000,
            "match":{"method":"GET","path":"/billing/#"}}"#,
    )
    .await;
    server
}

/// Make a token through the admin API; its secret.
async fn create_token(server: &Server, body: &str) -> String {
    let answer = post(&server.admin(), "/v1/tokens", body).await;
    assert_eq!(answer.status, 201, "create {body}: {}", answer.text());
    let json = answer.json.expect("json");
    json["secret"].as_str().expect("a secret").to_owned()
}

/// A 403 `forbidden` whose message names `what`.
#[track_caller]
fn assert_forbidden(answer: &tollgate_cli::client::Answer, what: &str) {
    assert_eq!(answer.status.as_u16(), 403, "{}", answer.text());
    assert_eq!(answer.error_code(), Some("forbidden"), "{}", answer.text());
    assert!(
        answer.error_message().is_some_and(|m| m.contains(what)),
        "the message names {what}: {}",
        answer.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_is_held_to_its_limits_priority_and_pausing() {
    let server = guarded_server(Vec::new()).await;
    let secret = create_token(
        &server,
        r#"{"name":"team-a","limits":["vendor-*"],"priority_max":"normal","may_pause":false}"#,
    )
    .await;
    let scoped = server.with_token(&secret);

    // Within its scope: as the data token.
    let grant = granted(&scoped, r#"{"limits":["vendor-x","vendor-y"]}"#).await;
    let commit = post(
        &scoped,
        &format!("/v1/permits/{}/commit", permit_of(&grant)),
        r#"{"used":1}"#,
    )
    .await;
    assert_eq!(commit.status, 200, "{}", commit.text());
    // At or below its highest priority, or with none given.
    granted(&scoped, r#"{"limits":["vendor-x"],"priority":"low"}"#).await;
    granted(&scoped, r#"{"limits":["vendor-x"]}"#).await;

    // A limit outside the scope, alone or beside one within it.
    for body in [
        r#"{"limits":["billing"]}"#,
        r#"{"limits":["vendor-x","billing"]}"#,
    ] {
        assert_forbidden(&post(&scoped, "/v1/acquire", body).await, "billing");
    }
    // Above its highest priority.
    assert_forbidden(
        &post(
            &scoped,
            "/v1/acquire",
            r#"{"limits":["vendor-x"],"priority":"high"}"#,
        )
        .await,
        "priority",
    );
    // No pausing, not even of its own limits.
    assert_forbidden(
        &post(
            &scoped,
            "/v1/pause",
            r#"{"limit":"vendor-x","retry_after_ms":86400000}"#,
        )
        .await,
        "may_pause",
    );
    // An inbound check that matches a limit outside the scope.
    assert_forbidden(
        &post(
            &scoped,
            "/v1/check",
            r#"{"method":"GET","path":"/billing/12"}"#,
        )
        .await,
        "billing-api",
    );
    // Stats show its limits only, and refuse another by name.
    let stats = call(&scoped, Method::GET, "/v1/stats", "").await;
    assert_eq!(stats.status, 200, "{}", stats.text());
    let names: Vec<String> = stats.json.expect("json")["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .filter_map(|limit| limit["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["vendor-x", "vendor-y"]);
    assert_forbidden(
        &call(&scoped, Method::GET, "/v1/stats?limit=billing", "").await,
        "billing",
    );
    // Nothing it was refused was counted or paused.
    let billing = call(
        &server.with_token(DATA_TOKEN),
        Method::GET,
        "/v1/stats?limit=billing",
        "",
    )
    .await;
    let billing = billing.json.expect("json");
    assert_eq!(billing["limits"][0]["usage"]["used"], 0, "{billing}");
    let vendor = call(
        &server.with_token(DATA_TOKEN),
        Method::GET,
        "/v1/stats?limit=vendor-x",
        "",
    )
    .await;
    assert_eq!(
        vendor.json.expect("json")["limits"][0]["usage"]["paused_ms"],
        0
    );

    // A token that may pause, and may ask for high, over every limit.
    let operator = create_token(
        &server,
        r#"{"name":"operator","limits":["*"],"priority_max":"high","may_pause":true}"#,
    )
    .await;
    let operator = server.with_token(&operator);
    granted(&operator, r#"{"limits":["billing"],"priority":"high"}"#).await;
    let paused = post(
        &operator,
        "/v1/pause",
        r#"{"limit":"billing","retry_after_ms":1000}"#,
    )
    .await;
    assert_eq!(paused.status, 200, "{}", paused.text());

    // The data token keeps every right; a wrong token is still a 401.
    granted(
        &server.with_token(DATA_TOKEN),
        r#"{"limits":["vendor-x"],"priority":"high"}"#,
    )
    .await;
    let wrong = post(
        &server.with_token("tgd_not-a-token"),
        "/v1/acquire",
        r#"{"limits":["vendor-x"]}"#,
    )
    .await;
    assert_error(&wrong, 401, "unauthorized", None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_listed_without_secrets_refused_when_malformed_and_kept_hashed() {
    let server = guarded_server(Vec::new()).await;
    let secret = create_token(
        &server,
        r#"{"name":"team-a","limits":["vendor-x","vendor-*"],"priority_max":"low"}"#,
    )
    .await;
    let list = call(&server.admin(), Method::GET, "/v1/tokens", "").await;
    assert_eq!(list.status, 200, "{}", list.text());
    let mut json = list.json.clone().expect("json");
    let created_ms = json["tokens"][0]
        .as_object_mut()
        .and_then(|token| token.remove("created_ms"))
        .and_then(|created| created.as_u64())
        .expect("created_ms");
    assert!(created_ms > 1_700_000_000_000, "{created_ms}");
    assert_eq!(
        json["tokens"],
        serde_json::json!([{"name":"team-a","limits":["vendor-x","vendor-*"],
            "priority_max":"low","may_pause":false,"cost_max":null,"wait_max_ms":null}]),
        "{json}"
    );
    assert!(!list.text().contains(&secret), "the list shows no secret");
    // The secret is in the state database only as its hash.
    let database = std::fs::read(server.directory.path().join("tollgate.db")).expect("db");
    let wal = std::fs::read(server.directory.path().join("tollgate.db-wal")).unwrap_or_default();
    for bytes in [&database, &wal] {
        assert!(
            !bytes
                .windows(secret.len())
                .any(|window| window == secret.as_bytes()),
            "the secret is stored in the clear"
        );
    }

    // The admin API alone manages tokens.
    for client in [server.with_token(DATA_TOKEN), server.with_token(&secret)] {
        let answer = call(&client, Method::GET, "/v1/tokens", "").await;
        assert_error(&answer, 401, "unauthorized", None);
    }
    // Bad bodies name their field; a name taken is a conflict.
    for (body, field) in [
        (r#"{"limits":["vendor-x"]}"#, "name"),
        (r#"{"name":"Bad Name","limits":["vendor-x"]}"#, "name"),
        (r#"{"name":"b"}"#, "limits"),
        (r#"{"name":"b","limits":[]}"#, "limits"),
        (r#"{"name":"b","limits":["ven*dor"]}"#, "limits[0]"),
        (r#"{"name":"b","limits":["a","Bad"]}"#, "limits[1]"),
        (
            r#"{"name":"b","limits":["a"],"priority_max":"urgent"}"#,
            "priority_max",
        ),
        (
            r#"{"name":"b","limits":["a"],"may_pause":"yes"}"#,
            "may_pause",
        ),
        (r#"{"name":"b","limits":["a"],"secret":"mine"}"#, "secret"),
    ] {
        let answer = post(&server.admin(), "/v1/tokens", body).await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
    let again = post(
        &server.admin(),
        "/v1/tokens",
        r#"{"name":"team-a","limits":["billing"]}"#,
    )
    .await;
    assert_error(&again, 409, "conflict", None);
    // The first team-a is unchanged by the refused one.
    granted(&server.with_token(&secret), r#"{"limits":["vendor-y"]}"#).await;

    let gone = call(&server.admin(), Method::DELETE, "/v1/tokens/nobody", "").await;
    assert_error(&gone, 404, "not_found", None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_is_immediate_here_and_within_the_reload_interval_on_another_replica() {
    let first = guarded_server(vec!["--reload-interval-ms", "200"]).await;
    // A second replica on the same rules database, whose tokens it reads. Its memory store
    // keeps its own state database: a second server on the first's would take its run over.
    let database = first.directory.path().join("tollgate.db");
    let rules = format!("sqlite://{}", database.display());
    let second = Server::start_with(Options {
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_DATA_TOKEN", DATA_TOKEN),
        ],
        args: vec![
            "--rules",
            &rules,
            "--state",
            "sqlite://state.db",
            "--reload-interval-ms",
            "200",
        ],
        ..Options::default()
    });
    let secret = create_token(&first, r#"{"name":"team-a","limits":["vendor-x"]}"#).await;
    let body = r#"{"limits":["vendor-x"]}"#;
    granted(&first.with_token(&secret), body).await;
    // Made on the first replica, known to the second within its reload interval.
    until("the second replica knows the token", async || {
        post(&second.with_token(&secret), "/v1/acquire", body)
            .await
            .status
            == 200
    })
    .await;

    let deleted = call(&first.admin(), Method::DELETE, "/v1/tokens/team-a", "").await;
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_eq!(
        deleted.json.expect("json"),
        serde_json::json!({"name":"team-a","deleted":true})
    );
    // At once where it was revoked.
    let refused = post(&first.with_token(&secret), "/v1/acquire", body).await;
    assert_error(&refused, 401, "unauthorized", None);
    // On the other replica within the reload interval (200 ms; the deadline is generous).
    let started = std::time::Instant::now();
    until("the second replica forgets the token", async || {
        post(&second.with_token(&secret), "/v1/acquire", body)
            .await
            .status
            == 401
    })
    .await;
    assert!(
        started.elapsed() < DEADLINE,
        "revoked after {:?}",
        started.elapsed()
    );
    // Still refused after more reloads: the revocation does not come undone.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = post(&second.with_token(&secret), "/v1/acquire", body).await;
    assert_error(&refused, 401, "unauthorized", None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokens_command_creates_lists_and_deletes() {
    let server = guarded_server(Vec::new()).await;
    let tokens = |args: &[&str]| {
        let output = command(server.directory.path())
            .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .args(["tokens", "--server", &server.url])
            .args(args)
            .output()
            .expect("run tollgate tokens");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = tokens(&[
        "create",
        "team-b",
        "--limit",
        "vendor-x",
        "--limit",
        "billing",
        "--priority-max",
        "high",
        "--may-pause",
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let created: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let secret = created["secret"].as_str().expect("secret").to_owned();
    assert!(stderr.contains("shown once"), "{stderr}");
    granted(
        &server.with_token(&secret),
        r#"{"limits":["billing"],"priority":"high"}"#,
    )
    .await;

    let (code, stdout, _) = tokens(&["--output", "table", "list"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("NAME"), "{stdout}");
    let row = stdout
        .lines()
        .find(|line| line.starts_with("team-b"))
        .unwrap_or_else(|| panic!("no team-b row: {stdout}"));
    for cell in ["vendor-x,billing", "high", "yes"] {
        assert!(row.contains(cell), "{row}");
    }
    assert!(!stdout.contains(&secret));

    let (code, _, stderr) = tokens(&["create", "team-b", "--limit", "vendor-x"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("conflict"), "{stderr}");

    let (code, stdout, stderr) = tokens(&["delete", "team-b"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let refused = post(
        &server.with_token(&secret),
        "/v1/acquire",
        r#"{"limits":["billing"]}"#,
    )
    .await;
    assert_error(&refused, 401, "unauthorized", None);
}
