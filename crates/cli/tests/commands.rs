//! The `tollgate` command line end to end: `limits` and `acquire` against a real server
//! process, configuration precedence (flags over environment over file), and `--help`.

mod common;

use std::process::Output;

use common::*;
use hyper::Method;

fn run(server: &Server, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = command(server.directory.path());
    command.args(args).env("TOLLGATE_SERVER", &server.url);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("runs")
}

/// `tollgate limits put` of a rate limit named vendor-x.
fn put_vendor_x(server: &Server, env: &[(&str, &str)]) -> Output {
    let rule = r#"{"kind":"rate","limit":10,"period_ms":1000}"#;
    run(server, &["limits", "put", "vendor-x", rule], env)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// With no admin token configured, a server on the embedded SQLite file makes one, keeps it
/// beside the file for this user alone, and the commands run in the same place find it; a
/// token from the environment wins, and then no file is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_server_keeps_an_admin_token_the_commands_find() {
    let server = Server::start_with(Options {
        env: vec![],
        ..Options::default()
    });
    let kept = server.directory.path().join("tollgate.db.admin-token");
    let token = std::fs::read_to_string(&kept).expect("the token file beside the database");
    let token = token.lines().next().expect("the token's line");
    assert_eq!(token.len(), 48, "{token:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&kept)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
    assert!(
        server.log().contains("tollgate.db.admin-token"),
        "{}",
        server.log()
    );
    let answer = call(&server.anonymous(), Method::GET, "/v1/limits", "").await;
    assert_error(&answer, 401, "unauthorized", None);
    let answer = call(&server.with_token(token), Method::GET, "/v1/limits", "").await;
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.text());
    // No token in the environment: the command reads the kept one.
    let put = put_vendor_x(&server, &[]);
    assert!(put.status.success(), "{}", stderr(&put));
    // A token given wins over the kept one, which then is not the token in force.
    let wrong = run(
        &server,
        &["limits", "list"],
        &[("TOLLGATE_ADMIN_TOKEN", "not-the-token")],
    );
    assert!(!wrong.status.success(), "{}", stdout(&wrong));
    // The same file on the next start: the token stays.
    let mut server = server;
    server.terminate();
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    let again = Server::start_with(Options {
        env: vec![],
        directory: Some(directory),
        ..Options::default()
    });
    let kept_again = std::fs::read_to_string(&kept).expect("still there");
    assert_eq!(kept_again.lines().next(), Some(token));
    let list = run(&again, &["limits", "list"], &[]);
    assert!(list.status.success(), "{}", stderr(&list));
    // A token from the environment: nothing is written.
    let configured = Server::start();
    assert!(
        !configured
            .directory
            .path()
            .join("tollgate.db.admin-token")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_commands_manage_a_running_server() {
    let server = Server::start();
    let token = [("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)];
    let put = put_vendor_x(&server, &token);
    assert!(put.status.success(), "{}", stderr(&put));
    assert!(
        stdout(&put).contains("\"algorithm\": \"sliding\""),
        "{}",
        stdout(&put)
    );
    let rule_file = server.directory.path().join("pool.json");
    std::fs::write(
        &rule_file,
        r#"{"kind":"concurrency","limit":2,"lease_ttl_ms":1000}"#,
    )
    .expect("write");
    let from_file = format!("@{}", rule_file.display());
    let put = run(&server, &["limits", "put", "pool", &from_file], &token);
    assert!(put.status.success(), "{}", stderr(&put));
    let list = run(&server, &["limits", "list"], &token);
    assert!(list.status.success(), "{}", stderr(&list));
    let listed: serde_json::Value = serde_json::from_slice(&list.stdout).expect("json");
    assert_eq!(listed["limits"].as_array().map(Vec::len), Some(2));
    // The same for people: one line a limit under a header.
    let table = run(&server, &["limits", "list", "--output", "table"], &token);
    assert!(table.status.success(), "{}", stderr(&table));
    let lines: Vec<String> = stdout(&table).lines().map(str::to_owned).collect();
    assert!(lines[0].starts_with("NAME"), "{lines:?}");
    assert!(
        lines.iter().any(|line| line.starts_with("pool ")
            && line.contains("concurrency")
            && line.contains("1000")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("vendor-x ") && line.contains("sliding")),
        "{lines:?}"
    );
    let get = run(&server, &["limits", "get", "pool"], &token);
    let shown: serde_json::Value = serde_json::from_slice(&get.stdout).expect("json");
    assert_eq!(shown["lease_ttl_ms"], 1000);
    let bad = run(
        &server,
        &[
            "limits",
            "put",
            "pool",
            r#"{"kind":"concurrency","limit":0,"lease_ttl_ms":1000}"#,
        ],
        &token,
    );
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("400 bad_request: limit"),
        "{}",
        stderr(&bad)
    );
    let delete = run(&server, &["limits", "delete", "pool"], &token);
    assert!(delete.status.success(), "{}", stderr(&delete));
    let missing = run(&server, &["limits", "get", "pool"], &token);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("404 not_found"),
        "{}",
        stderr(&missing)
    );
    let anonymous = run(&server, &["limits", "list"], &[]);
    assert!(!anonymous.status.success());
    assert!(
        stderr(&anonymous).contains("401 unauthorized"),
        "{}",
        stderr(&anonymous)
    );
}

/// A server that cannot be reached is 69 for every command that talks to one, as for
/// `acquire`: a script tells "try again later" from "you asked wrongly".
#[test]
fn commands_exit_69_when_the_server_cannot_be_reached() {
    let directory = tempfile::tempdir().expect("tempdir");
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let server = format!("http://127.0.0.1:{port}");
    std::fs::write(
        directory.path().join("limits.toml"),
        "[limits.a]\nkind = \"rate\"\nlimit = 1\nperiod_ms = 1000\n",
    )
    .expect("write");
    for args in [
        vec!["limits", "list"],
        vec!["limits", "get", "a"],
        vec!["limits", "delete", "a"],
        vec!["acquire", "a", "--", "true"],
        vec!["status"],
        vec!["limits", "apply", "-f", "limits.toml"],
    ] {
        let output = command(directory.path())
            .args(&args)
            .env("TOLLGATE_SERVER", &server)
            .output()
            .expect("run tollgate");
        assert_eq!(
            output.status.code(),
            Some(69),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_runs_the_command_under_a_permit_and_passes_its_exit_code() {
    let server = Server::start();
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":2,"period_ms":3600000}"#,
    )
    .await;
    let ran = run(
        &server,
        &["acquire", "vendor-x", "--", "sh", "-c", "echo ran; exit 3"],
        &[],
    );
    assert_eq!(ran.status.code(), Some(3), "{}", stderr(&ran));
    assert_eq!(stdout(&ran), "ran\n");
    // A command that cannot start made no call: its unit is refunded.
    let missing = run(
        &server,
        &["acquire", "vendor-x", "--", "/nonexistent/command"],
        &[],
    );
    assert_eq!(missing.status.code(), Some(127), "{}", stderr(&missing));
    let ok = run(
        &server,
        &["acquire", "vendor-x", "--cost", "1", "--", "true"],
        &[],
    );
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    // Two units used, committed as used: the next is not granted.
    let refused = run(
        &server,
        &["acquire", "vendor-x", "--wait", "100ms", "--", "true"],
        &[],
    );
    assert_eq!(refused.status.code(), Some(75), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("not granted"),
        "{}",
        stderr(&refused)
    );
    let unknown = run(&server, &["acquire", "nope", "--", "true"], &[]);
    assert_eq!(unknown.status.code(), Some(1), "{}", stderr(&unknown));
    assert!(
        stderr(&unknown).contains("404 not_found"),
        "{}",
        stderr(&unknown)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_holds_a_lease_while_the_command_runs_and_releases_it_after() {
    let server = Server::start();
    put_limit(
        &server,
        "pool",
        r#"{"kind":"concurrency","limit":1,"lease_ttl_ms":3000}"#,
    )
    .await;
    // The command outlives the lease TTL: only renewals (every second) keep the lease. The TTL
    // leaves two seconds of slack for a busy machine.
    let held = run(&server, &["acquire", "pool", "--", "sleep", "3.5"], &[]);
    assert_eq!(held.status.code(), Some(0), "{}", stderr(&held));
    assert!(
        !stderr(&held).contains("renewal refused"),
        "{}",
        stderr(&held)
    );
    let metrics = call(&server.anonymous(), Method::GET, "/metrics", "")
        .await
        .text();
    assert!(
        metrics.contains("tollgate_store_round_trip_seconds_count{operation=\"renew\"}"),
        "{metrics}"
    );
    // Released at the end: the pool is free at once.
    granted(&server.anonymous(), r#"{"limits":["pool"]}"#).await;
}

/// A stop signal sent to `acquire` alone (by systemd, Kubernetes, `timeout`, `kill`) reaches
/// the command, and the lease comes back once the command has stopped: `acquire` neither dies
/// leaving an orphan that goes on calling while its lease runs out, nor keeps the lease after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_to_acquire_stops_the_command_then_gives_the_lease_back() {
    let server = Server::start();
    // Only a commit can free the pool within the test: the lease outlives it.
    put_limit(
        &server,
        "pool",
        r#"{"kind":"concurrency","limit":1,"lease_ttl_ms":600000}"#,
    )
    .await;
    for (signal, code) in [("-TERM", 128 + 15), ("-HUP", 128 + 1)] {
        let pid_file = server.directory.path().join(format!("command{signal}.pid"));
        let log = server.directory.path().join(format!("acquire{signal}.log"));
        let script = format!("echo $$ > '{}'; exec sleep 120", pid_file.display());
        let mut acquire = command(server.directory.path())
            .args(["acquire", "pool", "--", "sh", "-c", &script])
            .env("TOLLGATE_SERVER", &server.url)
            // A file, not a pipe: an orphaned command would hold a pipe open for minutes.
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn acquire");
        let read_pid = || {
            std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|pid| pid.trim().parse::<u32>().ok())
        };
        until("the command runs under the permit", async || {
            read_pid().is_some()
        })
        .await;
        let command_pid = read_pid().expect("pid").to_string();
        let sent = std::process::Command::new("kill")
            .args([signal, &acquire.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
        let mut status = None;
        until("acquire exits", async || {
            status = acquire.try_wait().expect("try_wait");
            status.is_some()
        })
        .await;
        let status = status.expect("exited");
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(
            status.code(),
            Some(code),
            "{signal}: acquire exits as its command did; {status:?} {said}"
        );
        let alive = std::process::Command::new("kill")
            .args(["-0", &command_pid])
            .stderr(std::process::Stdio::null())
            .status()
            .expect("kill -0");
        assert!(!alive.success(), "{signal}: the command outlived acquire");
        let again = granted(&server.anonymous(), r#"{"limits":["pool"]}"#).await;
        let permit = again["permit"].as_str().expect("permit").to_owned();
        let released = post(
            &server.anonymous(),
            &format!("/v1/permits/{permit}/commit"),
            r#"{"used":0}"#,
        )
        .await;
        assert_eq!(released.status, 200, "{}", released.text());
    }
}

#[test]
fn flags_win_over_the_environment_which_wins_over_the_file() {
    let directory = tempfile::tempdir().expect("tempdir");
    let config = directory.path().join("tollgate.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nrules_table = \"from_file\"\nrecover_on_start = false\n",
    )
    .expect("write");
    let config = config.display().to_string();
    let tables = |directory: &tempfile::TempDir| -> Vec<String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let url = format!("sqlite://{}", directory.path().join("tollgate.db").display());
            let pool = sqlx::SqlitePool::connect(&url).await.expect("db");
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'from_%' AND name NOT LIKE '%_migrations' AND name NOT LIKE '%_runs' AND name NOT LIKE '%_saved' AND name NOT LIKE '%_ahead' AND name NOT LIKE '%_tokens' AND name NOT LIKE '%_valid' ORDER BY name")
                .fetch_all(&pool)
                .await
                .expect("tables")
        })
    };
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 3] = [
        (&[], &[], "from_file"),
        (&[], &[("TOLLGATE_RULES_TABLE", "from_env")], "from_env"),
        (
            &["--rules-table", "from_flag"],
            &[("TOLLGATE_RULES_TABLE", "from_env")],
            "from_flag",
        ),
    ];
    for (args, env, expected) in cases {
        let directory = tempfile::tempdir().expect("tempdir");
        let mut options_args = vec!["--config", config.as_str()];
        options_args.extend_from_slice(args);
        let mut options_env = vec![("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)];
        options_env.extend_from_slice(env);
        let mut server = Server::start_with(Options {
            args: options_args,
            env: options_env,
            directory: Some(directory),
            ..Options::default()
        });
        assert_eq!(tables(&server.directory), vec![expected.to_owned()]);
        server.terminate();
    }
}

#[test]
fn configuration_mistakes_are_reported_not_ignored() {
    let directory = tempfile::tempdir().expect("tempdir");
    let config = directory.path().join("tollgate.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\nlisen = \"typo\"\n").expect("write");
    let output = command(directory.path())
        .args(["serve", "--config", &config.display().to_string()])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("lisen"), "{}", stderr(&output));
    for (flag, value, named) in [
        ("--listen", "localhost", "listen"),
        ("--store", "memcached://x", "store"),
        ("--rules", "oracle://x", "rules URL"),
        ("--rules-table", "bad-name", "rules_table"),
        ("--reload-interval-ms", "1", "reload_interval_ms"),
        ("--path-case", "Insensitive", "path_case"),
        ("--path-params", "drop", "path_params"),
    ] {
        let output = command(directory.path())
            .args(["serve", flag, value])
            .output()
            .expect("runs");
        assert!(!output.status.success(), "{flag} {value}");
        assert!(
            stderr(&output).contains(named),
            "{flag}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn help_explains_every_command() {
    let directory = tempfile::tempdir().expect("tempdir");
    let help = command(directory.path())
        .arg("--help")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&help.stdout);
    for word in [
        "serve",
        "limits",
        "acquire",
        "status",
        "TOLLGATE_ADMIN_TOKEN",
        "Example",
    ] {
        assert!(text.contains(word), "{word} missing from --help:\n{text}");
    }
    let serve = command(directory.path())
        .args(["serve", "--help"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&serve.stdout);
    for word in [
        "--listen",
        "--store",
        "--rules",
        "--config",
        "TOLLGATE_RULES",
        "127.0.0.1:7070",
    ] {
        assert!(
            text.contains(word),
            "{word} missing from serve --help:\n{text}"
        );
    }
}

#[test]
fn completions_are_printed_for_each_shell() {
    let directory = tempfile::tempdir().expect("tempdir");
    for (shell, marker) in [
        ("bash", "_tollgate()"),
        ("zsh", "#compdef tollgate"),
        ("fish", "complete -c tollgate"),
    ] {
        let output = command(directory.path())
            .args(["completions", shell])
            .output()
            .expect("runs");
        assert!(output.status.success(), "{shell}: {}", stderr(&output));
        let script = stdout(&output);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(
            script.contains("limits"),
            "{shell}: the subcommands are completed"
        );
    }
}

/// `status` shows each limit's usage read from the store, its pause, its grants and its
/// denials by reason; a limit counted per key shows the key asked for; and `/v1/stats` names
/// the parameter at fault in every refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_usage_pauses_and_denials() {
    let server = Server::start();
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":2,"period_ms":60000}"#,
    )
    .await;
    put_limit(
        &server,
        "api",
        r#"{"kind":"rate","limit":5,"period_ms":60000,"per":"user"}"#,
    )
    .await;
    let data = server.anonymous();
    for _ in 0..2 {
        granted(&data, r#"{"limits":["vendor-x"]}"#).await;
    }
    let denied = post(&data, "/v1/acquire", r#"{"limits":["vendor-x"]}"#).await;
    assert_eq!(denied.status.as_u16(), 429);
    granted(&data, r#"{"limits":["api"],"key":"user-42"}"#).await;
    let paused = post(
        &data,
        "/v1/pause",
        r#"{"limit":"vendor-x","retry_after_ms":600000}"#,
    )
    .await;
    assert_eq!(paused.status.as_u16(), 200, "{}", paused.text());

    let table = run(&server, &["status", "-o", "table"], &[]);
    assert!(table.status.success(), "{}", stderr(&table));
    let shown = stdout(&table);
    let line = |name: &str| {
        shown
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{shown}"))
            .to_owned()
    };
    let vendor = line("vendor-x ");
    for part in ["2/2", "1 capacity", "min"] {
        assert!(vendor.contains(part), "{part}: {vendor}");
    }
    assert!(line("api ").contains("(per key)"), "{shown}");
    assert!(shown.contains("rules: version"), "{shown}");

    let json = run(&server, &["status", "vendor-x", "--output", "json"], &[]);
    let stats: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    let limit = &stats["limits"][0];
    assert_eq!(limit["usage"]["used"], 2, "{stats}");
    assert_eq!(limit["usage"]["remaining"], 0, "{stats}");
    assert_eq!(limit["usage"]["capacity"], 2, "{stats}");
    assert_eq!(limit["waiting_by_priority"]["high"], 0, "{stats}");
    assert_eq!(stats["rules"]["writable"], true, "{stats}");
    assert!(
        limit["usage"]["paused_ms"].as_u64() > Some(500_000),
        "{stats}"
    );
    assert_eq!(limit["grants"], 2, "{stats}");
    assert_eq!(limit["denials"]["capacity"], 1, "{stats}");
    // The per-key limit names its most asked-for key, with that key's usage.
    let stats = call(&data, Method::GET, "/v1/stats?limit=api", "").await;
    let stats = stats.json.expect("json");
    let hot = &stats["limits"][0]["hot_keys"][0];
    assert_eq!(hot["key"], "user-42", "{stats}");
    assert_eq!(hot["requests"], 1, "{stats}");
    assert_eq!(hot["usage"]["used"], 1, "{stats}");
    let keyed = run(
        &server,
        &["-o", "table", "status", "api", "-k", "user-42"],
        &[],
    );
    assert!(
        stdout(&keyed).contains("api [user-42]"),
        "{}",
        stdout(&keyed)
    );
    assert!(stdout(&keyed).contains("1/5"), "{}", stdout(&keyed));
    // Looking took nothing: the vendor is still at 2 of 2, the user at 1 of 5.
    let again = run(
        &server,
        &["status", "api", "--key", "user-42", "--output=table"],
        &[],
    );
    assert!(stdout(&again).contains("1/5"), "{}", stdout(&again));

    // A high-priority acquire waiting on the full, paused limit is counted by its priority.
    let waiter = server.anonymous();
    let waiting = tokio::spawn(async move {
        post(
            &waiter,
            "/v1/acquire",
            r#"{"limits":["vendor-x"],"priority":"high","wait_ms":20000}"#,
        )
        .await
    });
    until("the waiter is counted by priority", async || {
        let stats = call(&data, Method::GET, "/v1/stats?limit=vendor-x", "").await;
        let stats = stats.json.unwrap_or_default();
        stats["limits"][0]["waiting_by_priority"]["high"] == 1 && stats["limits"][0]["waiting"] == 1
    })
    .await;
    waiting.abort();

    let unknown = run(&server, &["status", "nope"], &[]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("404 not_found"),
        "{}",
        stderr(&unknown)
    );
    for (query, field) in [
        ("?bogus=1", "bogus"),
        ("?key=user-42", "key"),
        ("?limit=vendor-x&key=user-42", "key"),
        ("?limit=Not%20A%20Name", "limit"),
    ] {
        let answer = call(&data, Method::GET, &format!("/v1/stats{query}"), "").await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
}

/// The example configuration is one `serve` accepts as it stands.
#[test]
fn the_example_configuration_starts_a_server() {
    let example = tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/tollgate.toml");
    let example = example.display().to_string();
    let mut server = Server::start_with(Options {
        args: vec!["--config", &example],
        ..Options::default()
    });
    assert!(server.log().contains("starting"), "{}", server.log());
    assert!(server.terminate().success());
}

/// A SIGTERM sent the moment the server says it listens stops it gracefully: its handler is in
/// place before that line is printed, so the signal's default action never kills it.
#[test]
fn a_signal_right_after_listening_stops_the_server_gracefully() {
    for _ in 0..5 {
        let mut server = Server::start();
        let status = server.terminate();
        assert!(status.success(), "{status:?}; log:\n{}", server.log());
        assert!(server.log().contains("stopped"), "{}", server.log());
    }
}

/// A kept admin token file that holds no token stops `serve` with the file named, rather than
/// opening the admin API to an empty token.
#[test]
fn an_empty_kept_token_file_is_refused_by_name() {
    let directory = tempfile::tempdir().expect("tempdir");
    let kept = directory.path().join("tollgate.db.admin-token");
    std::fs::write(&kept, "\n").expect("write");
    #[cfg(unix)]
    std::fs::set_permissions(&kept, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let output = command(directory.path())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("admin token file tollgate.db.admin-token is empty"),
        "{}",
        stderr(&output)
    );
}

/// The client commands take `--server`, `--output` and `--config` (and `-s`, `-o`, `-c`)
/// before or after the subcommand; records print as JSON when piped, as a table when asked;
/// `serve` refuses `--server`, which names the server a client talks to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_options_go_anywhere_and_records_print_as_json_when_piped() {
    let server = Server::start();
    let token = [("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)];
    assert!(put_vendor_x(&server, &token).status.success());
    let directory = server.directory.path();
    let at = |args: &[&str]| {
        let mut command = command(directory);
        command.args(args).env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN);
        command.output().expect("runs")
    };
    let url = server.url.as_str();
    for args in [
        vec!["limits", "list", "--server", url, "--output", "table"],
        vec!["--server", url, "--output", "table", "limits", "list"],
        vec!["limits", "-s", url, "list", "-o", "table"],
        vec!["-o", "table", "limits", "list", "-s", url],
    ] {
        let output = at(&args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let shown = stdout(&output);
        assert!(shown.starts_with("NAME"), "{args:?}: {shown}");
        assert!(shown.contains("vendor-x "), "{args:?}: {shown}");
    }
    // Piped, with no --output: the server's JSON, for every command that prints records.
    for args in [
        vec!["limits", "list", "-s", url],
        vec!["status", "-s", url],
        vec!["tokens", "list", "-s", url],
    ] {
        let output = at(&args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&output.stdout);
        assert!(parsed.is_ok(), "{args:?}: not JSON: {}", stdout(&output));
    }
    // A wrong server after the subcommand is used, not ignored.
    let wrong = at(&["limits", "list", "--server", "http://127.0.0.1:9"]);
    assert_eq!(wrong.status.code(), Some(69), "{}", stderr(&wrong));

    let serve = at(&["serve", "--server", url]);
    assert_eq!(serve.status.code(), Some(1), "{}", stderr(&serve));
    assert!(
        stderr(&serve).contains("serve listens on --listen"),
        "{}",
        stderr(&serve)
    );
}
