//! TLS on the HTTP and gRPC listeners, on the built `tollgate` binary, with real TLS clients
//! (curl, verifying the chain against the test's own CA file, and openssl): certificates made
//! in the test by `openssl req -x509`, replaced on disk while the server runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A self-signed certificate for 127.0.0.1 and localhost, named `name`: its PEM files.
fn certificate(directory: &Path, name: &str) -> (PathBuf, PathBuf) {
    let cert = directory.join(format!("{name}.crt"));
    let key = directory.join(format!("{name}.key"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "2", "-subj", &format!("/CN={name}")])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req failed");
    (cert, key)
}

/// Put `from`'s contents at `to` in one step (a rename), as a certificate manager does.
fn replace(from: &Path, to: &Path) {
    let staged = to.with_extension("staged");
    std::fs::copy(from, &staged).expect("copy");
    std::fs::rename(&staged, to).expect("rename");
}

/// `curl` over TLS, trusting `ca` only: the status code, or `None` if no TLS session (or no
/// answer) was had.
fn curl(ca: &Path, url: &str, extra: &[&str]) -> Option<u16> {
    let output = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg("--cacert")
        .arg(ca)
        .args(extra)
        .arg(url)
        .output()
        .expect("run curl");
    let code: u16 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .ok()?;
    (output.status.success() && code != 0).then_some(code)
}

/// The subject of the certificate the server at `address` presents, as openssl prints it.
fn served_subject(address: &str) -> String {
    let client = Command::new("openssl")
        .args(["s_client", "-connect", address, "-servername", "localhost"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run openssl s_client");
    let output = client.wait_with_output().expect("s_client output");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|line| line.trim().strip_prefix("subject="))
        .unwrap_or("")
        .to_owned()
}

fn poll(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < DEADLINE,
            "not within {DEADLINE:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `tollgate serve` with `args`, which must refuse to start: its exit code and standard error.
fn refused_start(directory: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = command(directory)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate serve");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("the server started with {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_certificate_without_its_key_or_a_bad_one_stops_the_start_naming_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (cert, key) = certificate(directory.path(), "one");
    let cert = cert.to_str().expect("utf-8");
    let key = key.to_str().expect("utf-8");
    for (args, named) in [
        (vec!["--tls-cert", cert], "tls_key"),
        (vec!["--tls-key", key], "tls_cert"),
        (vec!["--tls-cert", key, "--tls-key", key], "tls_cert"),
        (
            vec!["--tls-cert", cert, "--tls-key", "missing.key"],
            "tls_key",
        ),
    ] {
        let (code, stderr) = refused_start(directory.path(), &args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?} names {named}: {stderr}");
    }
    // A certificate and a key that are not a pair.
    let (other_cert, _) = certificate(directory.path(), "two");
    let (code, stderr) = refused_start(
        directory.path(),
        &[
            "--tls-cert",
            other_cert.to_str().expect("utf-8"),
            "--tls-key",
            key,
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("tls_key"), "{stderr}");
}

/// A private key file that group or others may read stops the start, naming `tls_key`, the
/// file, its mode and the fix; once `chmod 600`, the same pair serves.
#[test]
fn a_private_key_others_may_read_stops_the_start_naming_it() {
    use std::os::unix::fs::PermissionsExt;
    let directory = tempfile::tempdir().expect("tempdir");
    let (cert, key) = certificate(directory.path(), "one");
    let args = [
        "--tls-cert",
        cert.to_str().expect("utf-8"),
        "--tls-key",
        key.to_str().expect("utf-8"),
    ];
    for mode in [0o644, 0o640, 0o604] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let (code, stderr) = refused_start(directory.path(), &args);
        assert_eq!(code, Some(1), "mode {mode:o}: {stderr}");
        for words in [
            "tls_key",
            key.to_str().expect("utf-8"),
            &format!("{mode:04o}"),
            "chmod 600",
        ] {
            assert!(
                stderr.contains(words),
                "mode {mode:o} names {words}: {stderr}"
            );
        }
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let server = Server::start_with(Options {
        args: args.to_vec(),
        ..Options::default()
    });
    assert_eq!(
        curl(&cert, &format!("{}/healthz", server.url), &[]),
        Some(200)
    );
}

#[test]
fn https_serves_the_certificate_and_the_one_that_replaces_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (one_cert, one_key) = certificate(directory.path(), "one");
    let (two_cert, two_key) = certificate(directory.path(), "two");
    let cert = directory.path().join("server.crt");
    let key = directory.path().join("server.key");
    replace(&one_cert, &cert);
    replace(&one_key, &key);
    let server = Server::start_with(Options {
        args: vec![
            "--tls-cert",
            cert.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
        ],
        ..Options::default()
    });
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let healthz = format!("{}/healthz", server.url);
    assert_eq!(curl(&one_cert, &healthz, &[]), Some(200));
    // Only the certificate served is trusted: the other CA sees no valid chain.
    assert_eq!(curl(&two_cert, &healthz, &[]), None);
    // Plain HTTP gets no answer from a TLS listener.
    let plain = server.url.replacen("https://", "http://", 1);
    assert_eq!(curl(&one_cert, &format!("{plain}/healthz"), &[]), None);
    // The API over TLS, admin token and all.
    let limits = format!("{}/v1/limits", server.url);
    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");
    assert_eq!(curl(&one_cert, &limits, &["-H", &bearer]), Some(200));

    // A bad certificate is refused, loudly, and the one in force stays.
    std::fs::write(&cert, "not a certificate\n").expect("write");
    poll("the bad certificate reported", || {
        server.log().contains("TLS certificate not reloaded")
    });
    assert!(server.log().contains("tls_cert"), "{}", server.log());
    assert_eq!(curl(&one_cert, &healthz, &[]), Some(200));

    // The new pair, key first then certificate, is served once both are in place.
    replace(&two_key, &key);
    replace(&two_cert, &cert);
    poll("the new certificate served", || {
        curl(&two_cert, &healthz, &[]) == Some(200)
    });
    assert_eq!(curl(&one_cert, &healthz, &[]), None);
    let address = server.url.trim_start_matches("https://");
    assert!(
        served_subject(address).contains("two"),
        "{}",
        served_subject(address)
    );
    assert!(
        server.log().contains("TLS certificate reloaded"),
        "{}",
        server.log()
    );
}

#[test]
fn the_grpc_listener_serves_the_same_certificate() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (one_cert, one_key) = certificate(directory.path(), "one");
    let server = Server::start_envoy(
        directory,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
        &[
            "--tls-cert",
            one_cert.to_str().expect("utf-8"),
            "--tls-key",
            one_key.to_str().expect("utf-8"),
        ],
    );
    let grpc = server.grpc.clone().expect("the gRPC address");
    let address = grpc.trim_start_matches("http://");
    // grpc.health.v1.Health/Check with an empty request: a gRPC frame of length 0.
    let request = server.directory.path().join("health-request");
    std::fs::write(&request, [0u8; 5]).expect("write");
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--http2", "-D", "-", "-o", "-"])
        .arg("--cacert")
        .arg(&one_cert)
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("--data-binary")
        .arg(format!("@{}", request.display()))
        .arg(format!("https://{address}/grpc.health.v1.Health/Check"))
        .output()
        .expect("run curl");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer = output.stdout;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/2 200"), "{text}");
    assert!(text.contains("grpc-status: 0"), "{text}");
    // The answer's message: field 1 (status) = 1 (SERVING).
    assert!(
        answer
            .windows(7)
            .any(|bytes| bytes == [0, 0, 0, 0, 2, 8, 1]),
        "{text}"
    );
    assert!(
        served_subject(address).contains("one"),
        "{}",
        served_subject(address)
    );
    // And nothing in the clear.
    let plain = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "--http2-prior-knowledge",
            "-o",
            "/dev/null",
        ])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("--data-binary")
        .arg(format!("@{}", request.display()))
        .arg(format!("http://{address}/grpc.health.v1.Health/Check"))
        .output()
        .expect("run curl");
    assert!(!plain.status.success(), "plain HTTP/2 was answered");
}

/// Sockets that open a connection to the TLS gRPC listener and never start a handshake, more
/// than a listener would take handshakes at once: a real client's handshake is not held up
/// behind them, and its call is answered at once.
#[test]
fn stalled_handshakes_hold_up_no_new_grpc_connection() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (cert, key) = certificate(directory.path(), "one");
    let server = Server::start_envoy(
        directory,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
        &[
            "--tls-cert",
            cert.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
        ],
    );
    let grpc = server.grpc.clone().expect("the gRPC address");
    let address = grpc.trim_start_matches("http://");
    let held: Vec<std::net::TcpStream> = (0..300)
        .filter_map(|_| std::net::TcpStream::connect(address).ok())
        .collect();
    assert_eq!(held.len(), 300);
    // Give the server time to take them all.
    std::thread::sleep(Duration::from_millis(500));
    let request = server.directory.path().join("health-request");
    std::fs::write(&request, [0u8; 5]).expect("write");
    let started = Instant::now();
    let output = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "--http2",
            "-D",
            "-",
            "-o",
            "/dev/null",
        ])
        .arg("--cacert")
        .arg(&cert)
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("--data-binary")
        .arg(format!("@{}", request.display()))
        .arg(format!("https://{address}/grpc.health.v1.Health/Check"))
        .output()
        .expect("run curl");
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("grpc-status: 0"), "{text}");
    assert!(
        took < Duration::from_secs(2),
        "the call took {took:?} behind {} stalled handshakes",
        held.len()
    );
}
