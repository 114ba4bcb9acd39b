//! Credentials on this machine, end to end against the real binary: a kept admin token file
//! that another user could have planted or read is refused, the commands send a kept token to
//! the server that wrote it and to no other, the command under `acquire` inherits no token,
//! and the state database is readable by this user alone.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use common::*;

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// A token file others could write (a planted token) or read is refused by `serve` and by
/// the commands, naming the file, its mode and the fix.
#[test]
fn a_kept_token_file_looser_than_0600_is_refused() {
    let directory = tempfile::tempdir().expect("tempdir");
    let kept = directory.path().join("tollgate.db.admin-token");
    std::fs::write(&kept, "planted-by-someone-else\n").expect("write");
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let serve = refused_start(command(directory.path()).args(["serve", "--listen", "127.0.0.1:0"]));
    assert!(
        stderr(&serve).contains("tollgate.db.admin-token has mode 666"),
        "{}",
        stderr(&serve)
    );
    assert!(stderr(&serve).contains("chmod 600"), "{}", stderr(&serve));
    let list = command(directory.path())
        .args(["limits", "list"])
        .output()
        .expect("runs");
    assert!(!list.status.success());
    assert!(stderr(&list).contains("has mode 666"), "{}", stderr(&list));
}

/// The output of a command that must stop by itself; one that goes on serving past
/// `DEADLINE` is killed and fails the test.
fn refused_start(command: &mut std::process::Command) -> Output {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = std::time::Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!("started instead of refusing:\n{}", stderr(&output));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    assert!(!output.status.success(), "{}", stderr(&output));
    output
}

/// One request read off a socket: its head, as text.
fn read_head(stream: &mut std::net::TcpStream) -> String {
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A kept token goes to the server that made it, found by the address it recorded when it
/// started listening; pointed at any other server, the command sends no token and says why.
#[test]
fn the_kept_token_is_sent_only_to_the_server_that_wrote_it() {
    let server = Server::start_with(Options {
        env: vec![],
        ..Options::default()
    });
    let kept = std::fs::read_to_string(server.directory.path().join("tollgate.db.admin-token"))
        .expect("kept");
    let token = kept.lines().next().expect("a token line").to_owned();
    assert!(kept.contains("listen 127.0.0.1:"), "{kept}");
    let own = command(server.directory.path())
        .args(["limits", "list"])
        .env("TOLLGATE_SERVER", &server.url)
        .output()
        .expect("runs");
    assert!(own.status.success(), "{}", stderr(&own));

    // Another server, on another port of this machine, that would log what it is sent.
    let other = TcpListener::bind("127.0.0.1:0").expect("bind");
    let other_url = format!("http://{}", other.local_addr().expect("address"));
    let heard = std::thread::spawn(move || {
        let (mut stream, _) = other.accept().expect("accept");
        let head = read_head(&mut stream);
        let body = r#"{"error":{"code":"unauthorized","message":"no"}}"#;
        let _ = write!(
            stream,
            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        head
    });
    let sent = command(server.directory.path())
        .args(["limits", "list"])
        .env("TOLLGATE_SERVER", &other_url)
        .output()
        .expect("runs");
    let head = heard.join().expect("the other server heard a request");
    assert!(!sent.status.success());
    assert!(
        !head.to_ascii_lowercase().contains("authorization"),
        "the kept token went to another server:\n{head}"
    );
    assert!(!head.contains(&token), "{head}");
    assert!(
        stderr(&sent).contains("not sending the admin token kept in"),
        "{}",
        stderr(&sent)
    );
}

/// The command `acquire` runs is trusted with its permit, not with the credentials that grant
/// permits or change limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_under_acquire_sees_no_token() {
    let server = Server::start_with(Options {
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_DATA_TOKEN", "data-token-for-tests"),
        ],
        ..Options::default()
    });
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":10,"period_ms":1000}"#,
    )
    .await;
    let output = command(server.directory.path())
        .args(["acquire", "vendor-x", "--", "env"])
        .env("TOLLGATE_SERVER", &server.url)
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("TOLLGATE_DATA_TOKEN", "data-token-for-tests")
        .env("TOLLGATE_PERMIT_SECRET", "00112233445566778899aabbccddeeff")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{}", stderr(&output));
    let environment = String::from_utf8_lossy(&output.stdout);
    assert!(
        environment.contains("TOLLGATE_SERVER="),
        "the rest of the environment is passed: {environment}"
    );
    for secret in [
        ADMIN_TOKEN,
        "data-token-for-tests",
        "00112233445566778899aabbccddeeff",
    ] {
        assert!(!environment.contains(secret), "{secret} in {environment}");
    }
}

/// The state database holds every user key counted and the limits in force: readable by this
/// user alone, whether the server makes it or finds one made looser.
#[test]
fn the_state_database_is_readable_by_this_user_alone() {
    let server = Server::start();
    let database = server.directory.path().join("tollgate.db");
    assert_eq!(mode(&database), 0o600);
    for companion in ["tollgate.db-wal", "tollgate.db-shm"] {
        let path = server.directory.path().join(companion);
        if path.exists() {
            assert_eq!(mode(&path), 0o600, "{companion}");
        }
    }
    drop(server);

    let directory = tempfile::tempdir().expect("tempdir");
    let loose = directory.path().join("tollgate.db");
    std::fs::write(&loose, b"").expect("an empty SQLite file");
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let server = Server::start_with(Options {
        directory: Some(directory),
        ..Options::default()
    });
    assert_eq!(mode(&server.directory.path().join("tollgate.db")), 0o600);
    assert!(server.log().contains("made it 0600"), "{}", server.log());
}

/// A server that makes its admin token keeps a copy for this user's commands in any directory
/// (`$XDG_STATE_HOME/tollgate/servers/PORT.admin-token`, 0600 in a 0700 directory); a command
/// run elsewhere finds it for that server, and a 401 names every place it looked.
#[test]
fn the_kept_admin_token_is_found_from_any_directory() {
    let state = tempfile::tempdir().expect("tempdir");
    let server = Server::start_with(Options {
        env: vec![("XDG_STATE_HOME", state.path().to_str().expect("utf-8"))],
        ..Options::default()
    });
    let port = server.url.rsplit(':').next().expect("a port").to_owned();
    let copy = state
        .path()
        .join("tollgate")
        .join("servers")
        .join(format!("{port}.admin-token"));
    assert!(copy.exists(), "no copy at {}", copy.display());
    assert_eq!(mode(&copy), 0o600);
    assert_eq!(mode(copy.parent().expect("its directory")), 0o700);

    let elsewhere = tempfile::tempdir().expect("tempdir");
    let list = command(elsewhere.path())
        .args(["limits", "list", "-s", &server.url])
        .env("XDG_STATE_HOME", state.path())
        .output()
        .expect("runs");
    assert!(list.status.success(), "{}", stderr(&list));

    // Without that state directory, the command finds nothing and says where it looked.
    let lost = command(elsewhere.path())
        .args(["limits", "list", "-s", &server.url])
        .output()
        .expect("runs");
    assert_eq!(lost.status.code(), Some(1), "{}", stderr(&lost));
    assert!(
        stderr(&lost).contains("401 unauthorized"),
        "{}",
        stderr(&lost)
    );
    assert!(
        stderr(&lost).contains("no admin token found; looked in TOLLGATE_ADMIN_TOKEN"),
        "{}",
        stderr(&lost)
    );
    assert!(
        stderr(&lost).contains(&format!("{port}.admin-token")),
        "{}",
        stderr(&lost)
    );
}
