//! Test support: start the built `tollgate` binary as a real server process on a free port in
//! its own temporary directory, talk to it over HTTP, stop it with a real signal.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use hyper::Method;
use tollgate_cli::client::{Answer, Client};

/// Far beyond what any step needs on an idle machine; only a hang takes this long.
pub const DEADLINE: Duration = Duration::from_secs(30);
pub const ADMIN_TOKEN: &str = "admin-token-for-tests";

/// Environment variables the server reads; cleared so the caller's shell cannot leak in.
const SERVER_VARIABLES: [&str; 40] = [
    "TOLLGATE_GRPC_LISTEN",
    "TOLLGATE_ENVOY_CONFIG",
    "TOLLGATE_STATE",
    "TOLLGATE_REDIS_NAMESPACE",
    "TOLLGATE_STORE_FAIL_OPEN",
    "TOLLGATE_REDIS_ALLOW_EVICTION",
    "TOLLGATE_REDIS_MODULE",
    "TOLLGATE_STORE_TIMEOUT_MS",
    "TOLLGATE_CONFIG",
    "TOLLGATE_LISTEN",
    "TOLLGATE_STORE",
    "TOLLGATE_RULES",
    "TOLLGATE_RULES_TABLE",
    "TOLLGATE_RELOAD_INTERVAL_MS",
    "TOLLGATE_ADMIN_TOKEN",
    "TOLLGATE_DATA_TOKEN",
    "TOLLGATE_METRICS_TOKEN",
    "TOLLGATE_BODY_BYTES_MAX",
    "TOLLGATE_WAIT_MS_MAX",
    "TOLLGATE_KEYS_TRACKED_MAX",
    "TOLLGATE_KEYS_PER_LIMIT_MAX",
    "TOLLGATE_PAUSE_MS_MAX",
    "TOLLGATE_RECOVER_ON_START",
    "TOLLGATE_PERMIT_SECRET",
    "TOLLGATE_SHUTDOWN_GRACE_MS",
    "TOLLGATE_LOG",
    "TOLLGATE_LOG_FORMAT",
    "TOLLGATE_SERVER",
    "TOLLGATE_PATH_CASE",
    "TOLLGATE_PATH_PARAMS",
    "TOLLGATE_TLS_CERT",
    "TOLLGATE_TLS_KEY",
    "TOLLGATE_FORWARD_AUTH_USER_HEADER",
    "TOLLGATE_FORWARD_AUTH_TRUSTED_PROXIES",
    "TOLLGATE_FORWARD_AUTH_IPV6_PREFIX_LEN",
    "TOLLGATE_FORWARD_AUTH_PROXY",
    "TOLLGATE_FORWARD_AUTH_METHOD_HEADER",
    "TOLLGATE_FORWARD_AUTH_URI_HEADER",
    "TOLLGATE_FORWARD_AUTH_NETWORK_KEYS_MAX",
    "TOLLGATE_PATH_ENCODED_SLASH",
];

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_tollgate")
}

/// A `tollgate` command with a clean environment, in `directory`.
pub fn command(directory: &std::path::Path) -> Command {
    clean(Command::new(binary()), directory)
}

/// `tollgate` run with at most `files` open file descriptors (`ulimit -n`), as `command`.
pub fn command_with_files_max(directory: &std::path::Path, files: u32) -> Command {
    let mut command = Command::new("sh");
    command.args([
        "-c",
        &format!("ulimit -n {files} && exec \"$0\" \"$@\""),
        binary(),
    ]);
    clean(command, directory)
}

fn clean(mut command: Command, directory: &std::path::Path) -> Command {
    command.current_dir(directory);
    // A server keeps a copy of the admin token it makes in the user's state directory: the
    // test's own, never the home of whoever runs the tests.
    command.env("XDG_STATE_HOME", directory.join(".state"));
    for variable in SERVER_VARIABLES {
        command.env_remove(variable);
    }
    command
}

pub struct Server {
    child: Child,
    pub url: String,
    /// Envoy's rate limit service, when the server was started with `--grpc-listen`.
    #[allow(dead_code)]
    pub grpc: Option<String>,
    pub directory: tempfile::TempDir,
    log: PathBuf,
}

/// How a test server starts.
pub struct Options<'a> {
    /// `--listen`: loopback on a free port unless a test says otherwise.
    pub listen: &'a str,
    pub args: Vec<&'a str>,
    pub env: Vec<(&'a str, &'a str)>,
    /// Start without `--recover-on-start false`, to see the default.
    pub default_recovery: bool,
    pub directory: Option<tempfile::TempDir>,
    /// Run the server with at most this many open file descriptors.
    pub files_max: Option<u32>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            listen: "127.0.0.1:0",
            args: Vec::new(),
            env: vec![("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)],
            default_recovery: false,
            directory: None,
            files_max: None,
        }
    }
}

impl Server {
    /// A server with the admin token set, no start-up recovery, rules in ./tollgate.db.
    pub fn start() -> Server {
        Server::start_with(Options::default())
    }

    pub fn start_with(options: Options<'_>) -> Server {
        let directory = options
            .directory
            .unwrap_or_else(|| tempfile::tempdir().expect("tempdir"));
        let log = directory.path().join("server.log");
        let mut command = match options.files_max {
            Some(files) => command_with_files_max(directory.path(), files),
            None => command(directory.path()),
        };
        command.arg("serve").args(["--listen", options.listen]);
        if !options.default_recovery {
            command.args(["--recover-on-start", "false"]);
        }
        command.args(&options.args);
        for (name, value) in &options.env {
            command.env(name, value);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"));
        let mut child = command.spawn().expect("spawn tollgate serve");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut grpc = None;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(address) =
                    line.strip_prefix("tollgate: envoy rate limit service (gRPC) on ")
                {
                    grpc = Some(format!("http://{address}"));
                }
                if let Some(url) = line.strip_prefix("tollgate: listening on ") {
                    let _ = sender.send((url.to_owned(), grpc.take()));
                }
            }
        });
        let (url, grpc) = match receiver.recv_timeout(DEADLINE) {
            Ok(answer) => answer,
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("the server did not start within {DEADLINE:?}; its log:\n{log}");
            }
        };
        Server {
            child,
            url,
            grpc,
            directory,
            log,
        }
    }

    /// A server in `directory` with Envoy's rate limit service on a free port, configured by
    /// `yaml` (written to `api.yaml` there), and `args` besides.
    pub fn start_envoy(directory: tempfile::TempDir, yaml: &str, args: &[&str]) -> Server {
        std::fs::write(directory.path().join("api.yaml"), yaml).expect("write api.yaml");
        let mut all = vec!["--grpc-listen", "127.0.0.1:0", "--envoy-config", "api.yaml"];
        all.extend_from_slice(args);
        Server::start_with(Options {
            args: all,
            directory: Some(directory),
            ..Options::default()
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn admin(&self) -> Client {
        Client::new(&self.url, Some(ADMIN_TOKEN.to_owned()), DEADLINE).expect("client")
    }

    pub fn anonymous(&self) -> Client {
        Client::new(&self.url, None, DEADLINE).expect("client")
    }

    pub fn with_token(&self, token: &str) -> Client {
        Client::new(&self.url, Some(token.to_owned()), DEADLINE).expect("client")
    }

    /// Send SIGTERM and wait for the process to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.stop_with("TERM")
    }

    /// Send the signal named (`TERM`, `HUP`, ...) and wait for the process to exit.
    pub fn stop_with(&mut self, signal: &str) -> ExitStatus {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        self.wait_exit()
    }

    pub fn wait_exit(&mut self) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "the server did not exit; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn call(client: &Client, method: Method, path: &str, body: &str) -> Answer {
    client
        .send_raw(method, path, body.as_bytes().to_vec(), DEADLINE)
        .await
        .expect("the server answers")
}

pub async fn post(client: &Client, path: &str, body: &str) -> Answer {
    call(client, Method::POST, path, body).await
}

/// Create or replace a limit, expecting success.
pub async fn put_limit(server: &Server, name: &str, rule: &str) -> serde_json::Value {
    let answer = call(
        &server.admin(),
        Method::PUT,
        &format!("/v1/limits/{name}"),
        rule,
    )
    .await;
    assert_eq!(answer.status, 200, "put {name}: {}", answer.text());
    answer.json.expect("json")
}

/// The permit of a granted acquire.
pub async fn granted(client: &Client, body: &str) -> serde_json::Value {
    let answer = post(client, "/v1/acquire", body).await;
    assert_eq!(answer.status, 200, "acquire {body}: {}", answer.text());
    answer.json.expect("json")
}

pub fn permit_of(grant: &serde_json::Value) -> String {
    grant["permit"].as_str().expect("permit").to_owned()
}

/// An error answer with this status, code and (if given) field.
#[track_caller]
pub fn assert_error(answer: &Answer, status: u16, code: &str, field: Option<&str>) {
    assert_eq!(answer.status.as_u16(), status, "{}", answer.text());
    assert_eq!(answer.error_code(), Some(code), "{}", answer.text());
    assert!(
        answer.error_message().is_some_and(|m| !m.is_empty()),
        "{}",
        answer.text()
    );
    if let Some(field) = field {
        let json = answer.json.as_ref().expect("json");
        assert_eq!(
            json["error"]["field"].as_str(),
            Some(field),
            "{}",
            answer.text()
        );
        assert!(
            answer.error_message().is_some_and(|m| m.contains(field)),
            "the message names the field: {}",
            answer.text()
        );
    }
}

/// An answer read off the wire: status, headers (names lowercased) and body.
pub struct RawAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Send `head` (the request line and headers, each ended by CRLF, without the blank line;
/// `Connection: close` and the body's length are added) and `body` to the server of `url` over
/// a fresh connection, byte for byte as given: for the headers a client library would not let
/// a test choose (Host, Origin, a missing Content-Type).
pub async fn raw(url: &str, head: &str, body: &str) -> RawAnswer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = url.trim_start_matches("http://");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let request = format!(
            "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read");
        answer
    };
    let answer = tokio::time::timeout(DEADLINE, exchange)
        .await
        .expect("the server answers");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    RawAnswer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Poll `condition` until true, failing after `DEADLINE`.
pub async fn until(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !condition().await {
        assert!(
            started.elapsed() < DEADLINE,
            "not within {DEADLINE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Run `tollgate serve` with `args` and `env`, expecting it to refuse to start: its exit
/// status and its log. A server still running after `DEADLINE` fails the test.
#[allow(dead_code)]
pub fn refused_start(args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    let directory = tempfile::tempdir().expect("tempdir");
    let log = directory.path().join("server.log");
    let mut command = command(directory.path());
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn tollgate serve");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the server started (args {args:?}, env {env:?}); its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}
