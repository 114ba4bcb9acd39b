//! `/readyz` asks the store itself: a server on a Redis that stops answers 503 naming the
//! store, and 200 again once Redis is back. The Redis here is a private `redis-server` the test
//! starts and stops on a port of its own, so the shared one is never disturbed.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_server::{ServerConfig, StoreChoice};

const DEADLINE: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

struct PrivateRedis(Child);

impl PrivateRedis {
    /// `None` when this machine has no `redis-server` to start.
    fn start(port: u16) -> Option<PrivateRedis> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        Some(PrivateRedis(child))
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn wait_until_listening(port: u16) {
    let start = tokio::time::Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(start.elapsed() < DEADLINE, "redis-server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The status code and body of `GET /readyz`, on a connection of its own.
async fn readyz(address: SocketAddr) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("the server accepts connections");
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .expect("request written");
    let mut answer = String::new();
    tokio::time::timeout(DEADLINE, stream.read_to_string(&mut answer))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    (status, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_a_redis_that_stopped_and_recovers_with_it() {
    let port = free_port();
    let Some(mut redis) = PrivateRedis::start(port) else {
        tollgate::conformance::skipped(
            "readyz_reports_a_redis_that_stopped_and_recovers_with_it: redis-server is not \
             installed; /readyz over Redis was not tested",
        );
        return;
    };
    wait_until_listening(port).await;
    let rules = tempfile::tempdir().expect("a temporary directory");
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().expect("an address"),
        store: StoreChoice::Redis(format!("redis://127.0.0.1:{port}/")),
        rules_url: format!("sqlite://{}", rules.path().join("rules.db").display()),
        state_url: None,
        rules_table: "tollgate_limits".into(),
        reload_interval: Duration::from_secs(2),
        admin_token: None,
        data_token: None,
        metrics_token: None,
        body_bytes_max: tollgate_server::DEFAULT_BODY_BYTES_MAX,
        wait_ms_max: tollgate_server::DEFAULT_WAIT_MS_MAX,
        keys_tracked_max: tollgate_server::DEFAULT_KEYS_TRACKED_MAX,
        keys_per_limit_max: None,
        pause_ms_max: tollgate_server::DEFAULT_PAUSE_MS_MAX,
        learn: tollgate::LearnConfig::default(),
        shares: tollgate::Shares::default(),
        recover_on_start: false,
        permit_secret: None,
        shutdown_grace: Duration::from_secs(1),
        redis_namespace: "readyz-test".into(),
        store_fail_open: false,
        redis_allow_eviction: false,
        redis_module: tollgate_server::DEFAULT_REDIS_MODULE,
        store_timeout: Duration::from_millis(500),
        grpc_listen: None,
        envoy_config: None,
        path_matching: tollgate_server::DEFAULT_PATH_MATCHING,
        forward_auth_user_header: None,
        forward_auth_trusted_proxies: Vec::new(),
        forward_auth_ipv6_prefix_len: tollgate_server::DEFAULT_FORWARD_AUTH_IPV6_PREFIX_LEN,
        path_encoded_slash: tollgate_server::PathEncodedSlash::default(),
        forward_auth_proxy: None,
        forward_auth_method_header: None,
        forward_auth_uri_header: None,
        forward_auth_network_keys_max: tollgate_server::DEFAULT_FORWARD_AUTH_NETWORK_KEYS_MAX,
        allowed_origins: Vec::new(),
        allowed_hosts: Vec::new(),
        header_read_timeout: Duration::from_millis(tollgate_server::DEFAULT_HEADER_READ_TIMEOUT_MS),
        idle_timeout: Duration::from_millis(tollgate_server::DEFAULT_IDLE_TIMEOUT_MS),
        connections_max: tollgate_server::DEFAULT_CONNECTIONS_MAX,
        waiters_max: tollgate_server::DEFAULT_WAITERS_MAX,
        waiters_per_limit_max: tollgate_server::DEFAULT_WAITERS_PER_LIMIT_MAX,
        waiters_per_token_max: tollgate_server::DEFAULT_WAITERS_PER_TOKEN_MAX,
        tls_cert: None,
        tls_key: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (listening_tx, listening_rx) = tokio::sync::oneshot::channel::<SocketAddr>();
    let server = tokio::spawn(tollgate_server::run(
        config,
        async move {
            let _ = stopped.await;
        },
        move |address, _| {
            let _ = listening_tx.send(address);
        },
    ));
    let address = tokio::time::timeout(DEADLINE, listening_rx)
        .await
        .expect("the server listens in time")
        .expect("the server started");

    let (status, answer) = readyz(address).await;
    assert_eq!(status, 200, "{answer}");

    redis.stop();
    let (status, answer) = readyz(address).await;
    assert_eq!(status, 503, "a stopped store must not look ready: {answer}");
    assert!(answer.contains("unreachable"), "{answer}");

    // Back on the same port: the store reconnects on its own and the server is ready again.
    let _redis = PrivateRedis::start(port).expect("redis-server started before");
    wait_until_listening(port).await;
    let start = tokio::time::Instant::now();
    loop {
        let (status, answer) = readyz(address).await;
        if status == 200 {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "not ready {DEADLINE:?} after Redis came back: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let _ = stop.send(());
    let _ = tokio::time::timeout(DEADLINE, server).await;
}
