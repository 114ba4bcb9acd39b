//! `tollgate acquire LIMIT -- COMMAND` when the lease the command runs under is lost, over the
//! real binary and a real server that crashes: a server that restarts no longer knows the
//! permit and refuses its renewal, a server that stays down lets the lease run out; either way
//! the command is stopped (SIGTERM to its process group, SIGKILL after `--kill-grace` if it
//! ignores SIGTERM), `acquire` exits 79 and says so in one line, or with `--on-lease-lost
//! keep-running` lets it run on and still exits 79. The times asserted are bounds with ample
//! room (the machine may be slow): what is checked is that the command does not outlive its
//! lease by more than the grace, not how fast it is stopped.

mod common;

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;

const LEASE_TTL_MS: u64 = 2_000;
/// Long enough for the server to be back before the lease could run out: its renewal is then
/// refused, rather than left to expire.
const RESTART_LEASE_TTL_MS: u64 = 10_000;
const KILL_GRACE: &str = "1s";
/// Room for a slow machine on top of TTL and grace; a command left running fails the test
/// after it.
const MARGIN: Duration = Duration::from_secs(25);

/// A server whose store recovers after a crash, as a default start does.
fn server_in(directory: tempfile::TempDir, listen: &str) -> Server {
    Server::start_with(Options {
        listen,
        default_recovery: true,
        directory: Some(directory),
        ..Options::default()
    })
}

/// Kill the server as the kernel's OOM killer would (SIGKILL): nothing runs after.
fn kill_hard(server: &mut Server) {
    let killed = Command::new("kill")
        .args(["-KILL", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    server.wait_exit();
}

/// `tollgate acquire pool` running `script` under `sh -c`, in `directory`.
fn acquire(server: &Server, directory: &Path, extra: &[&str], script: &str) -> Child {
    command(directory)
        .env("TOLLGATE_SERVER", &server.url)
        .args(["acquire", "pool", "--kill-grace", KILL_GRACE])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate acquire")
}

/// Waits for `path` to exist.
fn wait_for_file(path: &Path, child: &mut Child) {
    let started = Instant::now();
    while !path.exists() {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("acquire ended before its command started: {status:?}");
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The exit of `child` within `within`, or it is killed and the test fails.
fn exit_within(
    child: &mut Child,
    directory: &Path,
    within: Duration,
    what: &str,
) -> (ExitStatus, String) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return (status, stderr);
        }
        if started.elapsed() > within {
            // The command (`sh`, which wrote its pid) and what it runs, then acquire.
            if let Ok(pid) = std::fs::read_to_string(directory.join("started")) {
                let pid = pid.trim();
                let _ = Command::new("kill")
                    .args(["-KILL", &format!("-{pid}")])
                    .status();
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
            let _ = child.kill();
            let _ = child.wait();
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            panic!(
                "{what}: acquire still ran {within:?} after the lease was lost; stderr:\n{stderr}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn concurrency_pool(server: &Server, lease_ttl_ms: u64) {
    put_limit(
        server,
        "pool",
        &format!(r#"{{"kind":"concurrency","limit":1,"lease_ttl_ms":{lease_ttl_ms}}}"#),
    )
    .await;
}

/// A command that says it started, writes `stopped` when SIGTERM reaches it, and otherwise
/// runs for ten minutes.
const STOPPABLE: &str = "trap 'echo stopped > stopped; exit 0' TERM; echo $$ > started; \
                         i=0; while [ $i -lt 3000 ]; do sleep 0.2; i=$((i+1)); done";

/// The server crashes and comes back on the same address: it no longer knows the permit, so
/// the next renewal is refused (404) and the command is stopped with SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_refused_after_a_server_restart_stops_the_command() {
    let directory = tempfile::tempdir().expect("tempdir");
    let mut server = server_in(directory, "127.0.0.1:0");
    concurrency_pool(&server, RESTART_LEASE_TTL_MS).await;
    let work = tempfile::tempdir().expect("tempdir");
    let mut child = acquire(&server, work.path(), &[], STOPPABLE);
    wait_for_file(&work.path().join("started"), &mut child);
    let listen = server.url.trim_start_matches("http://").to_owned();
    kill_hard(&mut server);
    let crashed = Instant::now();
    let directory = std::mem::replace(&mut server.directory, tempfile::tempdir().expect("tempdir"));
    let restarted = server_in(directory, &listen);
    let grace = Duration::from_secs(1);
    let (status, stderr) = exit_within(
        &mut child,
        work.path(),
        Duration::from_millis(RESTART_LEASE_TTL_MS) + grace + MARGIN,
        "restart",
    );
    let stopped_after = crashed.elapsed();
    assert_eq!(status.code(), Some(79), "{stderr}");
    assert!(
        std::fs::read_to_string(work.path().join("stopped")).is_ok_and(|text| text == "stopped\n"),
        "the command never saw SIGTERM; stderr:\n{stderr}"
    );
    let said: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("the lease on pool was lost at"))
        .collect();
    assert_eq!(said.len(), 1, "one sentence says it: {stderr}");
    for part in [" UTC (", "unknown permit", "was stopped with SIGTERM"] {
        assert!(said[0].contains(part), "{part}: {stderr}");
    }
    // No commit of a permit the server does not know: no 404 printed.
    assert!(!stderr.contains("404"), "{stderr}");
    // The restarted server still holds the limit back (a crash hold) while the lease could
    // count; the command is stopped within the bound, whatever the hold.
    assert!(stopped_after < Duration::from_millis(RESTART_LEASE_TTL_MS) + grace + MARGIN);
    drop(restarted);
}

/// The server crashes and stays down: renewals fail until the lease's TTL has passed, and the
/// command, which ignores SIGTERM, is killed with SIGKILL after the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_while_the_server_is_down_stops_even_a_command_that_ignores_sigterm()
{
    let directory = tempfile::tempdir().expect("tempdir");
    let mut server = server_in(directory, "127.0.0.1:0");
    concurrency_pool(&server, LEASE_TTL_MS).await;
    let work = tempfile::tempdir().expect("tempdir");
    let stubborn = "trap 'echo ignored >> ignored' TERM; echo $$ > started; \
                    i=0; while [ $i -lt 3000 ]; do sleep 0.2; i=$((i+1)); done";
    let mut child = acquire(&server, work.path(), &[], stubborn);
    wait_for_file(&work.path().join("started"), &mut child);
    kill_hard(&mut server);
    let crashed = Instant::now();
    let (status, stderr) = exit_within(
        &mut child,
        work.path(),
        Duration::from_millis(LEASE_TTL_MS) + Duration::from_secs(1) + MARGIN,
        "server down",
    );
    assert_eq!(status.code(), Some(79), "{stderr}");
    // Not before the lease could have run out, as the client counts it.
    assert!(
        crashed.elapsed() >= Duration::from_millis(LEASE_TTL_MS / 3),
        "{stderr}"
    );
    assert!(
        work.path().join("ignored").exists(),
        "SIGTERM came first: {stderr}"
    );
    let line = stderr
        .lines()
        .find(|line| line.contains("the lease on pool was lost at"))
        .unwrap_or_else(|| panic!("no sentence on the lost lease: {stderr}"));
    for part in ["renewals failed", "SIGKILL", "after SIGTERM"] {
        assert!(line.contains(part), "{part}: {stderr}");
    }
}

/// The server hangs (stopped, as a frozen process or a partition that drops packets looks):
/// a renewal gets no answer at all, and the lease must still be counted out at its TTL, not
/// waited on forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_renewals_go_unanswered_stops_the_command_at_its_ttl() {
    let directory = tempfile::tempdir().expect("tempdir");
    let server = server_in(directory, "127.0.0.1:0");
    concurrency_pool(&server, LEASE_TTL_MS).await;
    let work = tempfile::tempdir().expect("tempdir");
    let mut child = acquire(&server, work.path(), &[], STOPPABLE);
    wait_for_file(&work.path().join("started"), &mut child);
    let pid = server.pid().to_string();
    let frozen = Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .expect("kill");
    assert!(frozen.success());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        exit_within(
            &mut child,
            work.path(),
            Duration::from_millis(LEASE_TTL_MS) + Duration::from_secs(1) + MARGIN,
            "server frozen",
        )
    }));
    // Thawed either way, so that dropping the server stops it.
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    let (status, stderr) = result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert_eq!(status.code(), Some(79), "{stderr}");
    assert!(
        std::fs::read_to_string(work.path().join("stopped")).is_ok_and(|text| text == "stopped\n"),
        "the command never saw SIGTERM; stderr:\n{stderr}"
    );
    let line = stderr
        .lines()
        .find(|line| line.contains("the lease on pool was lost at"))
        .unwrap_or_else(|| panic!("no sentence on the lost lease: {stderr}"));
    assert!(line.contains("renewals failed"), "{stderr}");
}

/// `--on-lease-lost keep-running`: the command runs to its own end, and `acquire` still exits
/// 79 and says the lease was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_running_lets_the_command_finish_and_still_says_the_lease_was_lost() {
    let directory = tempfile::tempdir().expect("tempdir");
    let mut server = server_in(directory, "127.0.0.1:0");
    concurrency_pool(&server, LEASE_TTL_MS).await;
    let work = tempfile::tempdir().expect("tempdir");
    // Runs until the test lets it end (a file appears), so it outlives the lease for sure.
    let script = "trap 'echo stopped > stopped; exit 0' TERM; echo $$ > started; \
                  while [ ! -e finish ]; do sleep 0.1; done; exit 3";
    let mut child = acquire(
        &server,
        work.path(),
        &["--on-lease-lost", "keep-running"],
        script,
    );
    wait_for_file(&work.path().join("started"), &mut child);
    kill_hard(&mut server);
    // Past the TTL and the grace, with room: the command must still be running.
    std::thread::sleep(Duration::from_millis(LEASE_TTL_MS) + Duration::from_secs(3));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "acquire ended though told to keep running"
    );
    std::fs::write(work.path().join("finish"), "").expect("finish");
    let (status, stderr) = exit_within(&mut child, work.path(), MARGIN, "keep-running");
    assert_eq!(status.code(), Some(79), "{stderr}");
    assert!(!work.path().join("stopped").exists(), "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("the lease on pool was lost at"))
        .unwrap_or_else(|| panic!("no sentence on the lost lease: {stderr}"));
    for part in ["ran on without it", "keep-running", "exited with 3"] {
        assert!(line.contains(part), "{part}: {stderr}");
    }
}

/// A bad `--kill-grace` is refused, naming the flag.
#[test]
fn a_bad_kill_grace_is_refused_naming_the_flag() {
    let work = tempfile::tempdir().expect("tempdir");
    let output = command(work.path())
        .args(["acquire", "pool", "--kill-grace", "soon", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--kill-grace"), "{stderr}");
}
