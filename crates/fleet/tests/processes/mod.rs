//! Child processes of the multi-process tests that start servers and workers themselves: a
//! child killed when dropped, its output as lines, and package `tollgate-cli`'s server binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc::Receiver;

/// A child process, killed and reaped when dropped, so none outlives the test, pass or fail.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every line `child` prints, read on a thread of its own until the child ends.
pub fn lines_of(child: &mut Child) -> Receiver<String> {
    let stdout = child.stdout.take().expect("piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// Package `tollgate-cli`'s server binary, beside this package's workers.
pub fn server_binary() -> PathBuf {
    let worker = PathBuf::from(env!("CARGO_BIN_EXE_tollgate-fleet-worker"));
    let binary = worker.with_file_name(format!("tollgate{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is not built: run `cargo build -p tollgate-cli -p tollgate-fleet --bins` first",
        binary.display()
    );
    binary
}
