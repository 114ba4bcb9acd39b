//! What the benches that start servers share: a child process killed when dropped, a free
//! loopback port, and where throttlecrab-server is.

use std::process::{Child, Command};

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
