//! Limits as code, end to end: `serve --rules file://...` (read-only, reloaded on change, bad
//! entries rejected alone, a broken file keeping what is in force) and `limits apply` /
//! `limits export` against a server whose limits live in SQL.

mod common;

use std::path::Path;
use std::process::Output;

use common::*;
use hyper::Method;

fn run(server: &Server, args: &[&str]) -> Output {
    command(server.directory.path())
        .args(args)
        .env("TOLLGATE_SERVER", &server.url)
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .expect("runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn limits(server: &Server) -> serde_json::Value {
    let answer = call(&server.admin(), Method::GET, "/v1/limits", "").await;
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.text());
    answer.json.expect("json")
}

fn limit_of(list: &serde_json::Value, name: &str) -> Option<serde_json::Value> {
    list["limits"]
        .as_array()?
        .iter()
        .find(|limit| limit["name"] == name)
        .cloned()
}

/// Replace a file the way editors that save atomically do: write beside it, then rename.
fn save(path: &Path, text: &str) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).expect("write");
    std::fs::rename(&temporary, path).expect("rename");
}

const VENDOR_X: &str = r#"
[limits.vendor-x]
kind = "rate"
limit = 2
period_ms = 60000
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_file_is_served_reloaded_and_never_written() {
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("limits.toml");
    std::fs::write(&file, VENDOR_X).expect("write");
    let server = Server::start_with(Options {
        args: vec![
            "--rules",
            "file://limits.toml",
            "--reload-interval-ms",
            "100",
        ],
        directory: Some(directory),
        ..Options::default()
    });
    let list = limits(&server).await;
    assert_eq!(limit_of(&list, "vendor-x").expect("in force")["limit"], 2);
    // In force: two grants, then a denial.
    let data = server.anonymous();
    let acquire = r#"{"limits":["vendor-x"]}"#;
    for _ in 0..2 {
        granted(&data, acquire).await;
    }
    let denied = post(&data, "/v1/acquire", acquire).await;
    assert_eq!(denied.status.as_u16(), 429, "{}", denied.text());
    // The admin API cannot change a file's limits, and says where they are changed.
    let refused = call(
        &server.admin(),
        Method::PUT,
        "/v1/limits/vendor-y",
        r#"{"kind":"rate","limit":1,"period_ms":1000}"#,
    )
    .await;
    assert_error(&refused, 409, "conflict", None);
    assert!(refused.text().contains("limits.toml"), "{}", refused.text());
    let refused = call(&server.admin(), Method::DELETE, "/v1/limits/vendor-x", "").await;
    assert_error(&refused, 409, "conflict", None);
    let stats = call(&server.anonymous(), Method::GET, "/v1/stats", "").await;
    let stats = stats.json.expect("json");
    assert_eq!(stats["rules"]["writable"], false, "{stats}");
    assert_eq!(stats["rules"]["source"], "file limits.toml", "{stats}");

    // An edit takes effect; the counters are kept (the two grants still count against 3).
    save(&file, &VENDOR_X.replace("limit = 2", "limit = 3"));
    until("the edited limit is in force", async || {
        limit_of(&limits(&server).await, "vendor-x").is_some_and(|limit| limit["limit"] == 3)
    })
    .await;
    granted(&data, acquire).await;
    let denied = post(&data, "/v1/acquire", acquire).await;
    assert_eq!(denied.status.as_u16(), 429, "{}", denied.text());

    // A bad entry is rejected alone, naming its field; the good ones stay in force.
    let with_typo = format!(
        "{}\n[limits.typo]\nkind = \"rate\"\nlimt = 5\n",
        VENDOR_X.replace("limit = 2", "limit = 3")
    );
    save(&file, &with_typo);
    until("the bad entry is reported", async || {
        limits(&server).await["rejected"]
            .as_array()
            .is_some_and(|rejected| !rejected.is_empty())
    })
    .await;
    let list = limits(&server).await;
    let rejected = &list["rejected"][0];
    assert_eq!(rejected["name"], "typo");
    assert_eq!(rejected["column"], "limt");
    assert!(
        rejected["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("unknown field")),
        "{rejected}"
    );
    assert!(limit_of(&list, "vendor-x").is_some());

    // A file that does not parse changes nothing, and is counted as a failed reload.
    save(&file, "[limits.vendor-x\nkind = ");
    until("the failed reload is counted", async || {
        let metrics = call(&server.anonymous(), Method::GET, "/metrics", "").await;
        metrics.text().lines().any(|line| {
            line.starts_with("tollgate_rules_reloads_total{outcome=\"failed\"}")
                && !line.ends_with(" 0")
        })
    })
    .await;
    let list = limits(&server).await;
    assert_eq!(limit_of(&list, "vendor-x").expect("kept")["limit"], 3);
    assert!(server.log().contains("limits.toml"), "{}", server.log());
    // Readiness holds: what is in force is still served.
    let ready = call(&server.anonymous(), Method::GET, "/readyz", "").await;
    assert_eq!(ready.status.as_u16(), 200, "{}", ready.text());
}

#[test]
fn a_limits_file_that_does_not_parse_stops_serve_naming_the_file() {
    let directory = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        directory.path().join("limits.yaml"),
        "limits:\n  a: {kind: rate\n",
    )
    .expect("write");
    for (rules, says) in [
        ("file://limits.yaml", "limits file limits.yaml: "),
        ("file://missing.toml", "limits file missing.toml: "),
        ("file://limits.json", "must end in .toml, .yaml or .yml"),
    ] {
        let output = command(directory.path())
            .args(["serve", "--listen", "127.0.0.1:0", "--rules", rules])
            .output()
            .expect("runs");
        assert!(!output.status.success(), "{rules}");
        assert!(
            stderr(&output).contains(says),
            "{rules}: {}",
            stderr(&output)
        );
    }
}

/// The example limits file is one `serve` accepts whole: every entry in force, none rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_limits_file_is_served_whole() {
    let example = tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/limits.toml");
    let rules = format!("file://{}", example.display());
    let server = Server::start_with(Options {
        args: vec!["--rules", &rules],
        ..Options::default()
    });
    let list = limits(&server).await;
    assert_eq!(list["rejected"], serde_json::json!([]), "{list}");
    assert_eq!(list["limits"].as_array().map(Vec::len), Some(3), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_makes_the_servers_limits_the_files_and_export_writes_them_back() {
    let server = Server::start();
    put_limit(
        &server,
        "old",
        r#"{"kind":"rate","limit":1,"period_ms":1000}"#,
    )
    .await;
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":2,"period_ms":60000}"#,
    )
    .await;
    let file = server.directory.path().join("limits.yaml");
    std::fs::write(
        &file,
        "limits:\n  vendor-x: {kind: rate, limit: 5, period_ms: 60000}\n  \
         pool: {kind: concurrency, limit: 2, lease_ttl_ms: 1000}\n",
    )
    .expect("write");
    let path = file.display().to_string();

    // A dry run shows the difference and changes nothing.
    let dry = run(&server, &["limits", "apply", "-f", &path, "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let shown = stdout(&dry);
    assert!(shown.contains("+ pool "), "{shown}");
    assert!(shown.contains("~ vendor-x\n    limit: 2 -> 5"), "{shown}");
    assert!(shown.contains("old is not in the file: kept"), "{shown}");
    assert_eq!(
        limit_of(&limits(&server).await, "vendor-x").expect("there")["limit"],
        2
    );
    assert!(limit_of(&limits(&server).await, "pool").is_none());

    // Applied: created and changed; what the file lacks is kept without --prune.
    let applied = run(&server, &["limits", "apply", "-f", &path]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let list = limits(&server).await;
    assert_eq!(limit_of(&list, "vendor-x").expect("there")["limit"], 5);
    assert_eq!(
        limit_of(&list, "pool").expect("created")["lease_ttl_ms"],
        1000
    );
    assert!(limit_of(&list, "old").is_some());
    let again = run(&server, &["limits", "apply", "-f", &path]);
    assert!(stdout(&again).contains("no changes"), "{}", stdout(&again));
    let pruned = run(&server, &["limits", "apply", "-f", &path, "--prune"]);
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    assert!(stdout(&pruned).contains("- old\n"), "{}", stdout(&pruned));
    assert!(limit_of(&limits(&server).await, "old").is_none());

    // A file with a bad limit is refused whole, every fault named, nothing written.
    std::fs::write(
        &file,
        "limits:\n  vendor-x: {kind: rate, limit: 9, period_ms: 60000}\n  \
         bad: {kind: rate, limit: 0, period_ms: 1000}\n  \
         worse: {kind: sometimes}\n",
    )
    .expect("write");
    let refused = run(&server, &["limits", "apply", "-f", &path]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    let said = stderr(&refused);
    assert!(said.contains("nothing was changed"), "{said}");
    assert!(
        said.contains("limit \"bad\": limit: must be at least 1"),
        "{said}"
    );
    assert!(said.contains("limit \"worse\": "), "{said}");
    assert_eq!(
        limit_of(&limits(&server).await, "vendor-x").expect("there")["limit"],
        5
    );

    // Export, in both formats, reads back as the same limits on another server.
    for format in ["toml", "yaml"] {
        let exported = run(&server, &["limits", "export", "--format", format]);
        assert!(exported.status.success(), "{}", stderr(&exported));
        let other = Server::start();
        let file = other.directory.path().join(format!("exported.{format}"));
        std::fs::write(&file, exported.stdout).expect("write");
        let applied = run(
            &other,
            &["limits", "apply", "-f", &file.display().to_string()],
        );
        assert!(applied.status.success(), "{}", stderr(&applied));
        assert_eq!(
            limits(&other).await["limits"],
            limits(&server).await["limits"]
        );
        let rules = format!("file://{}", file.display());
        let from_file = Server::start_with(Options {
            args: vec!["--rules", &rules],
            ..Options::default()
        });
        assert_eq!(
            limits(&from_file).await["limits"],
            limits(&server).await["limits"]
        );
    }
}

/// `serve --grpc-listen` needs envoyproxy/ratelimit's YAML, refuses a file that service would
/// refuse (naming it), and announces the gRPC address it serves on.
#[test]
fn serve_checks_the_envoy_configuration_before_it_listens() {
    let directory = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        directory.path().join("bad.yaml"),
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    .expect("write");
    for (args, says) in [
        (
            vec!["--grpc-listen", "127.0.0.1:0"],
            "envoy_config must name",
        ),
        (
            vec!["--grpc-listen", "127.0.0.1:0", "--envoy-config", "bad.yaml"],
            "envoy configuration bad.yaml: api.k: rate_limit.unit \"fortnight\" is not a unit",
        ),
    ] {
        let output = command(directory.path())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&args)
            .output()
            .expect("runs");
        assert!(!output.status.success(), "{args:?}");
        assert!(
            stderr(&output).contains(says),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    std::fs::write(
        directory.path().join("good.yaml"),
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .expect("write");
    let mut server = Server::start_with(Options {
        args: vec![
            "--grpc-listen",
            "127.0.0.1:0",
            "--envoy-config",
            "good.yaml",
        ],
        directory: Some(directory),
        ..Options::default()
    });
    assert!(
        server.log().contains("envoy rate limit service listening"),
        "{}",
        server.log()
    );
    assert!(server.terminate().success());
}

/// A limits file with a typo in one entry, as a new user writes it: `1m` is not a number of
/// milliseconds, on line 6 of the YAML and line 9 of the TOML.
const TYPO_YAML: &str = "limits:\n  search: {kind: rate, limit: 100, period_ms: 60000}\n  login-per-user:\n    kind: rate\n    limit: 5\n    period_ms: 1m\n";
const TYPO_TOML: &str = "[limits.search]\nkind = \"rate\"\nlimit = 100\nperiod_ms = 60000\n\n[limits.login-per-user]\nkind = \"rate\"\nlimit = 5\nperiod_ms = \"1m\"\n";

/// A file with any rejected entry stops `serve` before it listens, naming the file, the line,
/// the entry and the field; YAML and TOML alike.
#[test]
fn serve_refuses_a_limits_file_with_a_rejected_entry_naming_file_line_and_field() {
    let directory = tempfile::tempdir().expect("tempdir");
    std::fs::write(directory.path().join("limits.yaml"), TYPO_YAML).expect("write");
    std::fs::write(directory.path().join("limits.toml"), TYPO_TOML).expect("write");
    for (rules, says) in [
        (
            "file://limits.yaml",
            "limits.yaml:6: login-per-user: period_ms: ",
        ),
        (
            "file://limits.toml",
            "limits.toml:9: login-per-user: period_ms: ",
        ),
    ] {
        let mut child = command(directory.path())
            .args(["serve", "--listen", "127.0.0.1:0", "--rules", rules])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("runs");
        // A server that serves the file anyway never exits: give it generous time, then stop it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().expect("waits").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let output = child.wait_with_output().expect("exits");
        assert!(!output.status.success(), "{rules}: {}", stderr(&output));
        assert!(
            stderr(&output).contains(says),
            "{rules}: {}",
            stderr(&output)
        );
        assert!(
            !stderr(&output).contains("listening"),
            "{rules}: {}",
            stderr(&output)
        );
    }
}

/// `limits check` says what `serve` would, without serving: every rejected entry, non-zero;
/// a good file, zero and a summary.
#[test]
fn limits_check_names_every_rejected_entry_and_passes_a_good_file() {
    let directory = tempfile::tempdir().expect("tempdir");
    let two_typos =
        format!("{TYPO_YAML}  zero:\n    kind: rate\n    limit: 0\n    period_ms: 1000\n");
    std::fs::write(directory.path().join("limits.yaml"), &two_typos).expect("write");
    std::fs::write(directory.path().join("limits.toml"), TYPO_TOML).expect("write");
    std::fs::write(directory.path().join("good.toml"), VENDOR_X).expect("write");
    let check = |file: &str| {
        command(directory.path())
            .args(["limits", "check", file])
            .output()
            .expect("runs")
    };
    let output = check("limits.yaml");
    assert!(!output.status.success(), "{}", stdout(&output));
    let said = stderr(&output);
    assert!(
        said.contains("limits.yaml:6: login-per-user: period_ms: "),
        "{said}"
    );
    assert!(said.contains("limits.yaml:9: zero: limit: "), "{said}");
    let output = check("limits.toml");
    assert!(!output.status.success(), "{}", stdout(&output));
    assert!(
        stderr(&output).contains("limits.toml:9: login-per-user: period_ms: "),
        "{}",
        stderr(&output)
    );
    let output = check("good.toml");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("1 limit"), "{}", stdout(&output));
}

/// A bad edit while serving keeps the previous version in force, and shows on `/readyz` (which
/// stays ready: the last good rules are enforced) and in `/v1/stats` until it is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_edit_while_serving_keeps_the_limit_and_shows_until_fixed() {
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("limits.yaml");
    let good = "limits:\n  login:\n    kind: rate\n    limit: 2\n    period_ms: 3600000\n";
    std::fs::write(&file, good).expect("write");
    let server = Server::start_with(Options {
        args: vec![
            "--rules",
            "file://limits.yaml",
            "--reload-interval-ms",
            "100",
        ],
        directory: Some(directory),
        ..Options::default()
    });
    let data = server.anonymous();
    let acquire = r#"{"limits":["login"]}"#;
    granted(&data, acquire).await;

    save(&file, &good.replace("3600000", "1h"));
    until("the bad edit is reported", async || {
        let stats = call(&server.anonymous(), Method::GET, "/v1/stats", "").await;
        stats.json.is_some_and(|stats| {
            stats["rules"]["rejected"]
                .as_array()
                .is_some_and(|rejected| !rejected.is_empty())
        })
    })
    .await;
    // The previous version is enforced: one more grant, then a denial.
    granted(&data, acquire).await;
    let denied = post(&data, "/v1/acquire", acquire).await;
    assert_eq!(denied.status.as_u16(), 429, "{}", denied.text());
    let stats = call(&server.anonymous(), Method::GET, "/v1/stats", "").await;
    let rejected = &stats.json.expect("json")["rules"]["rejected"][0];
    assert_eq!(rejected["name"], "login", "{rejected}");
    assert_eq!(rejected["column"], "period_ms", "{rejected}");
    assert_eq!(rejected["line"], 5, "{rejected}");
    assert_eq!(rejected["previous_in_force"], true, "{rejected}");
    let ready = call(&server.anonymous(), Method::GET, "/readyz", "").await;
    assert_eq!(ready.status.as_u16(), 200, "{}", ready.text());
    let problems = ready.json.expect("json")["rules_problems"].clone();
    assert!(
        problems[0]
            .as_str()
            .is_some_and(|problem| problem.starts_with("limits.yaml:5: login: period_ms: ")),
        "{problems}"
    );

    // A file that no longer parses shows too.
    save(&file, "limits:\n  login: {kind: rate\n");
    until("the broken file is reported", async || {
        let ready = call(&server.anonymous(), Method::GET, "/readyz", "").await;
        ready.status.as_u16() == 200
            && ready.json.is_some_and(|ready| {
                ready["rules_problems"].as_array().is_some_and(|problems| {
                    problems.iter().any(|problem| {
                        problem.as_str().is_some_and(|problem| {
                            problem.starts_with("limits file limits.yaml: ")
                                && problem.contains("the rules in force stay")
                        })
                    })
                })
            })
    })
    .await;
    let stats = call(&server.anonymous(), Method::GET, "/v1/stats", "").await;
    let rules = &stats.json.expect("json")["rules"];
    assert_eq!(rules["last_reload_ok"], false, "{rules}");
    assert!(
        rules["last_reload_error"]
            .as_str()
            .is_some_and(|error| error.contains("limits.yaml")),
        "{rules}"
    );
    let denied = post(&data, "/v1/acquire", acquire).await;
    assert_eq!(denied.status.as_u16(), 429, "{}", denied.text());

    // Fixed: the problem is gone from both.
    save(&file, good);
    until("the fix clears the problem", async || {
        let ready = call(&server.anonymous(), Method::GET, "/readyz", "").await;
        ready
            .json
            .is_some_and(|ready| ready.get("rules_problems").is_none())
    })
    .await;
    let stats = call(&server.anonymous(), Method::GET, "/v1/stats", "").await;
    assert_eq!(
        stats.json.expect("json")["rules"]["rejected"],
        serde_json::json!([])
    );
}
