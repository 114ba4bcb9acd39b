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

/// A stand-in for another user's program on a port this user's commands may reach: it writes
/// down the head of every request it is sent and answers 401, or, for a proof request when
/// `relay` is given, passes the request to that server and its answer back (as an attacker
/// who wants the real server to answer the challenge for it would).
struct StandIn {
    address: std::net::SocketAddr,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StandIn {
    fn bind(address: std::net::SocketAddr, relay: Option<std::net::SocketAddr>) -> StandIn {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind(address)
            .unwrap_or_else(|error| panic!("the stand-in binds {address}: {error}"));
        let address = listener.local_addr().expect("address");
        listener.set_nonblocking(true).expect("nonblocking");
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (written, stopped) = (heads.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let mut stream = match listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        continue;
                    }
                };
                let _ = stream.set_nonblocking(false);
                let head = read_head(&mut stream);
                written.lock().expect("heads").push(head.clone());
                let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                match relay {
                    Some(server) if path.starts_with("/v1/admin-token/proof") => {
                        let answer = relayed(server, &path);
                        let _ = stream.write_all(&answer);
                    }
                    _ => {
                        let body = r#"{"error":{"code":"unauthorized","message":"no"}}"#;
                        let _ = write!(
                            stream,
                            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                    }
                }
            }
        });
        StandIn {
            address,
            heads,
            stop,
        }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("heads").clone()
    }

    /// Fails if any request this stand-in was sent carried `token` or any `Authorization`.
    #[track_caller]
    fn assert_never_sent(&self, token: &str) {
        for head in self.heads() {
            assert!(
                !head.contains(token),
                "the kept token reached the stand-in:\n{head}"
            );
            assert!(
                !head.to_ascii_lowercase().contains("authorization"),
                "credentials reached the stand-in:\n{head}"
            );
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `GET path` asked of `server`, its whole answer as sent.
fn relayed(server: std::net::SocketAddr, path: &str) -> Vec<u8> {
    let mut stream = std::net::TcpStream::connect(server).expect("connect to the real server");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    let _ = write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {server}\r\nconnection: close\r\n\r\n"
    );
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

fn kept_token_in(directory: &std::path::Path) -> String {
    let kept = std::fs::read_to_string(directory.join("tollgate.db.admin-token")).expect("kept");
    kept.lines().next().expect("a token line").to_owned()
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("a port")
}

fn user_copy(state: &std::path::Path, port: u16) -> std::path::PathBuf {
    state
        .join("tollgate")
        .join("servers")
        .join(format!("{port}.admin-token"))
}

/// A server that stopped without cleaning up (killed) left its copy of the token for its port.
/// Another program now listens on that port and passes every proof request on to the same
/// server, restarted on another port with the same token: the command sends it no token (the
/// proof it relays is for the other address), says why, and the restarted server still gets
/// the token at its own address.
#[test]
fn a_token_left_by_a_stopped_server_is_not_sent_to_whoever_listens_on_its_port() {
    let state = tempfile::tempdir().expect("tempdir");
    let state_home = state.path().to_str().expect("utf-8");
    let mut first = Server::start_with(Options {
        env: vec![("XDG_STATE_HOME", state_home)],
        ..Options::default()
    });
    let token = kept_token_in(first.directory.path());
    let port = port_of(&first.url);
    first.stop_with("KILL");
    assert!(
        user_copy(state.path(), port).exists(),
        "a killed server leaves its copy"
    );

    let database = first.directory.path().join("tollgate.db");
    let state_url = format!("sqlite://{}", database.display());
    let restarted = Server::start_with(Options {
        env: vec![
            ("XDG_STATE_HOME", state_home),
            ("TOLLGATE_STATE", &state_url),
        ],
        ..Options::default()
    });
    let restarted_address = restarted
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let stand_in = StandIn::bind(
        format!("127.0.0.1:{port}").parse().expect("address"),
        Some(restarted_address),
    );

    let elsewhere = tempfile::tempdir().expect("tempdir");
    let list = command(elsewhere.path())
        .args(["limits", "list", "-s", &format!("http://127.0.0.1:{port}")])
        .env("XDG_STATE_HOME", state.path())
        .output()
        .expect("runs");
    stand_in.assert_never_sent(&token);
    assert!(
        !stand_in.heads().is_empty(),
        "the command went to the stand-in"
    );
    assert!(!list.status.success(), "{}", stderr(&list));
    assert!(
        stderr(&list).contains("did not prove that it holds it"),
        "{}",
        stderr(&list)
    );

    // The restarted server, at the address it recorded, is sent the same token.
    let own = command(elsewhere.path())
        .args(["limits", "list", "-s", &restarted.url])
        .env("XDG_STATE_HOME", state.path())
        .output()
        .expect("runs");
    assert!(own.status.success(), "{}", stderr(&own));
    assert_eq!(kept_token_in(first.directory.path()), token);
}

/// The loopback address `localhost` leads to first on this machine, and the other one.
fn localhost_first_and_other() -> (std::net::IpAddr, std::net::IpAddr) {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};
    let first = ("localhost", 0)
        .to_socket_addrs()
        .expect("localhost resolves")
        .next()
        .expect("an address")
        .ip();
    let other = if first.is_ipv4() {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    };
    (first, other)
}

/// The server listens on one loopback address and another program on the same port of the
/// other one, where `localhost` leads first (`[::1]` on most hosts, 127.0.0.1 here when
/// `localhost` is IPv4 alone). Told `http://localhost:PORT`, the command goes to the address
/// the server recorded, not where the name leads, and the other program sees nothing of the
/// token.
#[test]
fn a_kept_token_goes_to_the_recorded_address_not_where_localhost_leads() {
    let (first, other) = localhost_first_and_other();
    let stand_in = StandIn::bind(std::net::SocketAddr::new(first, 0), None);
    let port = stand_in.address.port();
    let listen = std::net::SocketAddr::new(other, port).to_string();
    let state = tempfile::tempdir().expect("tempdir");
    let server = Server::start_with(Options {
        listen: &listen,
        env: vec![("XDG_STATE_HOME", state.path().to_str().expect("utf-8"))],
        ..Options::default()
    });
    let token = kept_token_in(server.directory.path());

    let elsewhere = tempfile::tempdir().expect("tempdir");
    let list = command(elsewhere.path())
        .args(["limits", "list", "-s", &format!("http://localhost:{port}")])
        .env("XDG_STATE_HOME", state.path())
        .output()
        .expect("runs");
    stand_in.assert_never_sent(&token);
    assert!(list.status.success(), "{}", stderr(&list));
}

/// A server stopped cleanly takes back what it recorded: this user's copy for its port is
/// removed, and the file beside its state keeps the token without a `listen` line.
#[test]
fn a_clean_stop_removes_the_kept_copy() {
    let state = tempfile::tempdir().expect("tempdir");
    let mut server = Server::start_with(Options {
        env: vec![("XDG_STATE_HOME", state.path().to_str().expect("utf-8"))],
        ..Options::default()
    });
    let token = kept_token_in(server.directory.path());
    let copy = user_copy(state.path(), port_of(&server.url));
    assert!(copy.exists(), "no copy at {}", copy.display());
    assert!(server.terminate().success(), "{}", server.log());
    assert!(
        !copy.exists(),
        "{} is left after a clean stop",
        copy.display()
    );
    let beside = std::fs::read_to_string(server.directory.path().join("tollgate.db.admin-token"))
        .expect("kept");
    assert_eq!(beside.trim(), token, "{beside}");
}

/// `GET /v1/admin-token/proof` needs no token and answers the proof for the nonce and the
/// address the server listens on, never the token; a nonce that is missing, short, not hex or
/// given twice is a 400 naming `nonce`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proof_is_given_without_a_token_and_reveals_none() {
    use tollgate_server::admin_proof::admin_proof;
    let server = Server::start();
    let client = server.anonymous();
    let nonce = "0123456789abcdef".repeat(4);
    let answer = call(
        &client,
        hyper::Method::GET,
        &format!("/v1/admin-token/proof?nonce={nonce}"),
        "",
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let listen = server.url.trim_start_matches("http://");
    let json = answer.json.as_ref().expect("json");
    assert_eq!(json["proof"], admin_proof(ADMIN_TOKEN, listen, &nonce));
    assert!(!answer.text().contains(ADMIN_TOKEN), "{}", answer.text());
    assert_eq!(
        answer
            .headers
            .get("cache-control")
            .and_then(|value| value.to_str().ok()),
        Some("no-store")
    );
    let short = "ab".repeat(15);
    let not_hex = "g".repeat(32);
    let twice = format!("nonce={nonce}&nonce={nonce}");
    for query in [
        String::new(),
        format!("nonce={short}"),
        format!("nonce={not_hex}"),
        twice,
    ] {
        let answer = call(
            &client,
            hyper::Method::GET,
            &format!("/v1/admin-token/proof?{query}"),
            "",
        )
        .await;
        assert_error(&answer, 400, "bad_request", Some("nonce"));
    }
}
