//! What the benches that start servers share: a child process killed when dropped, starting
//! `tollgate serve` and reading its address, starting the bench binary itself again as a floor
//! server, a free loopback port, and where throttlecrab-server is.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A server process, killed (and reaped) when the bench is done with it.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

/// This bench binary started again as a floor server: `variable` set to a free loopback address
/// tells its `main` to serve there instead of benching. The process and its base URL.
pub fn start_floor(variable: &str) -> (Process, String) {
    let port = free_port();
    let child = Command::new(std::env::current_exe().expect("this binary"))
        .env(variable, format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the floor server");
    (Process(child), format!("http://127.0.0.1:{port}"))
}

/// What a floor server runs on: the address `start_floor` gave it, and a multi-threaded
/// runtime, as the servers it stands beside.
pub fn floor_runtime(address: &str) -> (std::net::SocketAddr, tokio::runtime::Runtime) {
    let address = address.parse().expect("an address");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    (address, runtime)
}

/// `THROTTLECRAB_SERVER`, else throttlecrab-server on `PATH`.
pub fn throttlecrab_binary() -> Option<String> {
    if let Ok(path) = std::env::var("THROTTLECRAB_SERVER") {
        return Some(path);
    }
    let found = Command::new("sh")
        .args(["-c", "command -v throttlecrab-server"])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    (!path.is_empty()).then_some(path)
}

/// Start `tollgate serve` as `command` says (listening on port 0) and read the address it prints
/// first: the process and its base URL.
pub fn start_serving(mut command: Command) -> (Process, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn tollgate serve");
    let stdout = child.stdout.take().expect("its stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("its listening line");
    let base = line
        .trim()
        .strip_prefix("tollgate: listening on ")
        .expect("a listening line")
        .to_owned();
    (Process(child), base)
}

/// `POST /v1/acquire` with `acquire`, then commit the permit granted with `commit`; both must
/// answer 200.
pub async fn acquire_and_commit(
    client: &tollgate_cli::client::Client,
    acquire: &serde_json::Value,
    commit: &serde_json::Value,
) {
    let granted = client
        .send(hyper::Method::POST, "/v1/acquire", Some(acquire))
        .await
        .expect("acquire");
    assert_eq!(granted.status, 200, "{}", granted.text());
    let permit = granted
        .json
        .as_ref()
        .and_then(|json| json["permit"].as_str())
        .expect("a permit");
    let path = format!("/v1/permits/{permit}/commit");
    let committed = client
        .send(hyper::Method::POST, &path, Some(commit))
        .await
        .expect("commit");
    assert_eq!(committed.status, 200, "{}", committed.text());
}
