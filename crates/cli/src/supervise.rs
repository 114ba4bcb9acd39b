//! Running `acquire`'s command: started without the credentials `tollgate` was given, kept
//! alive through the signals that would stop `tollgate` first, passed SIGTERM and SIGHUP, and
//! its exit code (or 128 + the signal that ended it) as shells report it.

use anyhow::{Context, Result};

/// Runs `acquire`'s command to its end; `None` when it could not start. `tollgate` outlives the
/// signals that would otherwise stop it first, and commits only once the command has stopped
/// calling: had it died, an orphaned command would go on calling while its lease ran out and
/// was granted to another. SIGTERM and SIGHUP, which a supervisor or `kill` sends to this
/// process alone, are passed on to the command; Ctrl-C's SIGINT has reached it already through
/// the terminal's process group.
#[cfg(unix)]
pub(crate) async fn run_command(
    program: &str,
    arguments: &[String],
) -> Result<Option<std::io::Result<std::process::ExitStatus>>> {
    use rustix::process::{Pid, Signal, kill_process};
    use tokio::signal::unix::{SignalKind, signal};
    // Installed before the command starts, so no signal meets the default action (death).
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let Some(mut child) = spawn_command(program, arguments) else {
        return Ok(None);
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw);
    loop {
        // Biased: a command that has ended is reaped first, so a signal is never passed to its
        // pid after the system could have given that pid to another process.
        let pass_on = tokio::select! {
            biased;
            status = child.wait() => return Ok(Some(status)),
            _ = terminate.recv() => Signal::TERM,
            _ = hangup.recv() => Signal::HUP,
            _ = interrupt.recv() => continue,
        };
        if let Some(pid) = pid {
            // It may have ended since: then there is nobody left to tell.
            let _ = kill_process(pid, pass_on);
        }
    }
}

#[cfg(not(unix))]
pub(crate) async fn run_command(
    program: &str,
    arguments: &[String],
) -> Result<Option<std::io::Result<std::process::ExitStatus>>> {
    let Some(mut child) = spawn_command(program, arguments) else {
        return Ok(None);
    };
    // Ctrl-C reaches the command too; stay alive to commit.
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Some(status)),
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}

/// What `acquire`'s command never inherits: the credentials `tollgate` itself was given.
pub(crate) const SECRET_VARIABLES: [&str; 4] = [
    "TOLLGATE_ADMIN_TOKEN",
    "TOLLGATE_DATA_TOKEN",
    "TOLLGATE_METRICS_TOKEN",
    "TOLLGATE_PERMIT_SECRET",
];

/// Starts `acquire`'s command, or says why it could not. The command runs under a permit; it
/// is not trusted with the credentials that grant permits or change limits.
fn spawn_command(program: &str, arguments: &[String]) -> Option<tokio::process::Child> {
    let mut command = tokio::process::Command::new(program);
    for name in SECRET_VARIABLES {
        command.env_remove(name);
    }
    command
        .args(arguments)
        .spawn()
        .inspect_err(|error| eprintln!("tollgate: cannot run {program:?}: {error}"))
        .ok()
}

/// The command's exit code, or 128 + the signal that ended it, as shells report.
pub(crate) fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return u8::try_from((128 + signal) & 0xff).unwrap_or(1);
        }
    }
    1
}
