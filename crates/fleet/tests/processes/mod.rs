//! Child processes of the multi-process tests that start servers and workers themselves: a
//! child killed when dropped, its output as lines, the line that says it is ready, and package
//! `tollgate-cli`'s server, started in a directory of its own with nothing from the caller's
//! environment.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

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

/// The rest of the first line `lines` brings that starts with `prefix`; fails the test if none
/// comes within three minutes (a slow machine's build and start, never a test's pace).
pub fn first_line(lines: &Receiver<String>, what: &str, prefix: &str) -> String {
    loop {
        match lines.recv_timeout(Duration::from_secs(180)) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return rest.to_owned();
                }
            }
            Err(error) => panic!("no {what}: {error}"),
        }
    }
}

/// Start `command` with its output piped, and wait for its line starting with `prefix`: the
/// child, and the rest of that line (an address).
pub fn start(command: &mut Command, what: &str, prefix: &str) -> (Killed, String) {
    let mut child = Killed(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("start {what}: {error}")),
    );
    let lines = lines_of(&mut child.0);
    let url = first_line(&lines, what, prefix);
    (child, url)
}

/// `tollgate` run in `directory`, its state there too, its log in `server.log`, and nothing
/// from the caller's environment configuring it; the caller adds its tokens and arguments.
pub fn server_command(directory: &Path) -> Command {
    let log = std::fs::File::create(directory.join("server.log")).expect("log");
    let mut command = Command::new(server_binary());
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("TOLLGATE_")) {
        command.env_remove(name);
    }
    command
        .current_dir(directory)
        .env("XDG_STATE_HOME", directory.join(".state"))
        .stderr(log);
    command
}
