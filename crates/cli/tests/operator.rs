//! What an operator meets, over the real binary: a denial whose units left are kept for higher
//! priority says so rather than "used up"; `status` shows a hold after a crash as a hold, not a
//! pause; the commands name the environment variable to set after a 401; SIGHUP reloads the
//! rules at once; a Redis that lost Tollgate's state is logged with a readable time; an
//! administrator undoes a mistaken lockout of one key.

mod common;

use std::process::{Command, Output};

use hyper::Method;

use common::*;

fn run(server: &Server, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = command(server.directory.path());
    command.args(args).env("TOLLGATE_SERVER", &server.url);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn acquire_body(priority: &str) -> String {
    format!(r#"{{"limits":["pool"],"priority":"{priority}"}}"#)
}

/// Four units an hour, two kept for `high`: with two used, a `normal` request is denied with
/// reason `capacity` (the wire's reason is unchanged), and its message, over HTTP and from
/// `tollgate acquire`, says the two units left are kept for higher priority; once those are
/// taken too, a denial is plain capacity again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_of_units_kept_for_higher_priority_says_they_are_kept() {
    let server = Server::start();
    put_limit(
        &server,
        "pool",
        r#"{"kind":"rate","limit":4,"period_ms":3600000,"reserve":{"high":2}}"#,
    )
    .await;
    let client = server.anonymous();
    for _ in 0..2 {
        granted(&client, &acquire_body("normal")).await;
    }
    let denied = post(&client, "/v1/acquire", &acquire_body("normal")).await;
    assert_eq!(denied.status, 429, "{}", denied.text());
    let json = denied.json.clone().expect("json");
    assert_eq!(json["reason"], "capacity", "{}", denied.text());
    let message = denied.error_message().unwrap_or_default();
    assert!(
        message.contains(r#"the 2 units left of limit "pool" are kept for higher priority"#),
        "{message}"
    );
    let shown = run(&server, &["status", "pool", "-o", "table"], &[]);
    assert!(stdout(&shown).contains("2/4"), "{}", stdout(&shown));
    let refused = run(&server, &["acquire", "pool", "--", "true"], &[]);
    assert_eq!(refused.status.code(), Some(75), "{}", stderr(&refused));
    assert!(
        stderr(&refused)
            .contains(r#"the 2 units left of limit "pool" are kept for higher priority"#),
        "{}",
        stderr(&refused)
    );
    assert!(
        !stderr(&refused).contains("used up"),
        "{}",
        stderr(&refused)
    );
    // High takes one: the one left is kept still.
    granted(&client, &acquire_body("high")).await;
    let denied = post(&client, "/v1/acquire", &acquire_body("low")).await;
    let message = denied.error_message().unwrap_or_default();
    assert!(
        message.contains(r#"the 1 unit left of limit "pool" is kept for higher priority"#),
        "{message}"
    );
    // Everything used: used up, and said plainly.
    granted(&client, &acquire_body("high")).await;
    let denied = post(&client, "/v1/acquire", &acquire_body("normal")).await;
    let message = denied.error_message().unwrap_or_default();
    assert!(message.starts_with("not granted: capacity"), "{message}");
    let refused = run(&server, &["acquire", "pool", "--", "true"], &[]);
    assert!(
        stderr(&refused).contains("the limit is used up"),
        "{}",
        stderr(&refused)
    );
}

/// After a crash, a concurrency limit the crashed run had is held back until its leases can no
/// longer count: `status` shows that under HELD FOR, says what a hold is, and leaves PAUSED FOR
/// empty, since nobody paused it; the stats carry it as `held_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_hold_after_a_crash_as_held_not_paused() {
    let mut server = Server::start_with(Options {
        default_recovery: true,
        ..Options::default()
    });
    put_limit(
        &server,
        "exports",
        r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":3600000}"#,
    )
    .await;
    granted(&server.anonymous(), r#"{"limits":["exports"]}"#).await;
    let killed = Command::new("kill")
        .args(["-KILL", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    server.wait_exit();
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    let restarted = Server::start_with(Options {
        default_recovery: true,
        directory: Some(directory),
        ..Options::default()
    });
    let json = run(&restarted, &["status", "exports", "-o", "json"], &[]);
    let stats: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    let usage = &stats["limits"][0]["usage"];
    assert!(
        usage["held_ms"].as_u64().unwrap_or(0) > 3_000_000,
        "{usage}"
    );
    let table = run(&restarted, &["status", "exports", "-o", "table"], &[]);
    let shown = stdout(&table);
    let mut lines = shown.lines();
    let header = lines.next().expect("a header");
    let row = lines.next().expect("a row");
    let paused_at = header.find("PAUSED FOR").expect("PAUSED FOR");
    let held_at = header.find("HELD FOR").expect("HELD FOR");
    let cell = |at: usize| {
        row.get(at..)
            .unwrap_or_default()
            .split("  ")
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    assert_eq!(cell(paused_at), "-", "not a pause:\n{shown}");
    let held = cell(held_at);
    assert!(
        held.contains("min") || held.contains('h'),
        "{held}:\n{shown}"
    );
    assert!(shown.contains("HELD FOR: a hold after"), "{shown}");
}

/// A server with a data token answers 401 to `status` and `acquire` without it (or with
/// another): the commands say to set TOLLGATE_DATA_TOKEN; the admin commands, `limits apply`
/// among them, say to set TOLLGATE_ADMIN_TOKEN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_401_the_commands_name_the_variable_to_set() {
    let server = Server::start_with(Options {
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_DATA_TOKEN", "data-token-for-tests"),
        ],
        ..Options::default()
    });
    put_limit(
        &server,
        "pool",
        r#"{"kind":"rate","limit":5,"period_ms":1000}"#,
    )
    .await;
    for args in [
        &["status"][..],
        &["status", "pool"][..],
        &["acquire", "pool", "--", "true"][..],
    ] {
        let refused = run(&server, args, &[]);
        assert_eq!(
            refused.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&refused)
        );
        assert!(
            stderr(&refused).contains("set TOLLGATE_DATA_TOKEN"),
            "{args:?}: {}",
            stderr(&refused)
        );
        let refused = run(&server, args, &[("TOLLGATE_DATA_TOKEN", "not-this-one")]);
        assert_eq!(
            refused.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&refused)
        );
        assert!(
            stderr(&refused).contains("does not accept the data token sent")
                && stderr(&refused).contains("TOLLGATE_DATA_TOKEN"),
            "{args:?}: {}",
            stderr(&refused)
        );
    }
    let granted = run(
        &server,
        &["acquire", "pool", "--", "true"],
        &[("TOLLGATE_DATA_TOKEN", "data-token-for-tests")],
    );
    assert_eq!(granted.status.code(), Some(0), "{}", stderr(&granted));
    std::fs::write(
        server.directory.path().join("limits.toml"),
        "[limits.pool]\nkind = \"rate\"\nlimit = 6\nperiod_ms = 1000\n",
    )
    .expect("write");
    for args in [
        &["limits", "list"][..],
        &["limits", "apply", "-f", "limits.toml"][..],
    ] {
        let refused = run(&server, args, &[("TOLLGATE_ADMIN_TOKEN", "not-this-one")]);
        assert_eq!(
            refused.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&refused)
        );
        assert!(
            stderr(&refused).contains("set TOLLGATE_ADMIN_TOKEN"),
            "{args:?}: {}",
            stderr(&refused)
        );
    }
}

/// SIGHUP reloads a limits file at once (the interval here is an hour), logs it, and the
/// server runs on; a second SIGHUP does too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_rules_at_once_and_the_server_runs_on() {
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("limits.toml");
    let one = "[limits.first]\nkind = \"rate\"\nlimit = 5\nperiod_ms = 1000\n";
    std::fs::write(&file, one).expect("write");
    let mut server = Server::start_with(Options {
        args: vec![
            "--rules",
            "file://limits.toml",
            "--reload-interval-ms",
            "3600000",
        ],
        directory: Some(directory),
        ..Options::default()
    });
    let admin = server.admin();
    let names = async || {
        let answer = call(&admin, Method::GET, "/v1/limits", "").await;
        answer.text()
    };
    assert!(names().await.contains("first"));
    for (round, name) in ["second", "third"].iter().enumerate() {
        let mut text = std::fs::read_to_string(&file).expect("read");
        text.push_str(&format!(
            "[limits.{name}]\nkind = \"rate\"\nlimit = 5\nperiod_ms = 1000\n"
        ));
        std::fs::write(&file, text).expect("write");
        let hup = Command::new("kill")
            .args(["-HUP", &server.pid().to_string()])
            .status()
            .expect("kill");
        assert!(hup.success());
        until(&format!("{name} in force after SIGHUP"), async || {
            names().await.contains(name)
        })
        .await;
        let log = server.log();
        assert_eq!(
            log.matches("rules reloaded").count(),
            round + 1,
            "the reload is logged once a SIGHUP:\n{log}"
        );
    }
    assert!(server.log().contains("SIGHUP"), "{}", server.log());
    // Still a clean stop on SIGTERM.
    assert!(server.terminate().success(), "{}", server.log());
}

/// A Redis that lost Tollgate's state (here its generation deleted, as a flush would) is
/// logged with the generation's birth as a calendar time, not a count of microseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_state_loss_is_logged_with_a_readable_time() {
    let Ok(redis) = std::env::var("TOLLGATE_TEST_REDIS") else {
        tollgate::conformance::skipped(
            "a_redis_state_loss_is_logged_with_a_readable_time: TOLLGATE_TEST_REDIS is unset, \
             so it did not run against Redis",
        );
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    let namespace = format!("operator-{}-{nanos}", std::process::id());
    let server = Server::start_with(Options {
        default_recovery: true,
        args: vec!["--store", &redis, "--redis-namespace", &namespace],
        ..Options::default()
    });
    put_limit(
        &server,
        "daily",
        r#"{"kind":"rate","limit":5,"period_ms":86400000}"#,
    )
    .await;
    granted(&server.anonymous(), r#"{"limits":["daily"]}"#).await;
    let client = redis::Client::open(redis.as_str()).expect("redis url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let _: () = redis::cmd("DEL")
        .arg(format!("tg:{{{namespace}}}:{namespace}:gen"))
        .query_async(&mut connection)
        .await
        .expect("DEL");
    let _ = post(
        &server.anonymous(),
        "/v1/acquire",
        r#"{"limits":["daily"]}"#,
    )
    .await;
    until("the loss is logged", async || {
        server.log().contains("Redis lost Tollgate's state")
    })
    .await;
    let log = server.log();
    let line = log
        .lines()
        .find(|line| line.contains("Redis lost Tollgate's state"))
        .expect("logged");
    // The time, up to its zone: the fields that follow (the namespace) may hold any digits.
    let after = line
        .split_once("until one period after")
        .and_then(|(_, after)| after.split_once(" UTC"))
        .map(|(time, _)| time)
        .unwrap_or_else(|| panic!("no time in UTC: {line}"));
    let digits_in_a_row = after
        .split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    assert!(digits_in_a_row < 10, "a raw reading in: {line}");
}

/// A mistaken lockout undone: `tollgate limits reset` forgets one user's usage of a per-user
/// limit, so that user is granted again while another user stays locked out; only the admin
/// token may; a concurrency limit, or a per-user limit without its key, is refused naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrator_resets_one_users_usage_and_nobody_elses() {
    let server = Server::start();
    put_limit(
        &server,
        "logins",
        r#"{"kind":"rate","limit":2,"period_ms":3600000,"per":"user"}"#,
    )
    .await;
    let client = server.anonymous();
    let body = |user: &str| format!(r#"{{"limits":["logins"],"key":"{user}"}}"#);
    for user in ["alice", "bob"] {
        for _ in 0..2 {
            granted(&client, &body(user)).await;
        }
        let denied = post(&client, "/v1/acquire", &body(user)).await;
        assert_eq!(denied.status, 429, "{user}: {}", denied.text());
    }

    // Not with the data plane's access: an administrator's power.
    let refused = call(
        &client,
        Method::DELETE,
        "/v1/limits/logins/usage?key=alice",
        "",
    )
    .await;
    assert_eq!(refused.status, 401, "{}", refused.text());

    let output = run(
        &server,
        &["limits", "reset", "logins", "--key", "alice"],
        &[("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let said: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(said["reset"], true, "{said}");
    for _ in 0..2 {
        granted(&client, &body("alice")).await;
    }
    let denied = post(&client, "/v1/acquire", &body("alice")).await;
    assert_eq!(
        denied.status,
        429,
        "alice past the limit again: {}",
        denied.text()
    );
    let denied = post(&client, "/v1/acquire", &body("bob")).await;
    assert_eq!(denied.status, 429, "bob was not reset: {}", denied.text());
    assert!(
        server.log().contains("usage reset by an administrator"),
        "the reset is logged"
    );

    let admin = server.admin();
    let without_key = call(&admin, Method::DELETE, "/v1/limits/logins/usage", "").await;
    assert_eq!(without_key.status, 400, "{}", without_key.text());
    assert_eq!(
        without_key
            .json
            .as_ref()
            .map(|json| json["error"]["field"].clone()),
        Some("key".into()),
        "{}",
        without_key.text()
    );
    put_limit(
        &server,
        "exports",
        r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":30000}"#,
    )
    .await;
    let lease = call(&admin, Method::DELETE, "/v1/limits/exports/usage", "").await;
    assert_eq!(lease.status, 400, "{}", lease.text());
    assert_eq!(
        lease
            .json
            .as_ref()
            .map(|json| json["error"]["field"].clone()),
        Some("name".into()),
        "the path names the limit: {}",
        lease.text()
    );
    assert!(
        lease.text().contains("concurrency limit"),
        "{}",
        lease.text()
    );
}
