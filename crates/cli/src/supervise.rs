//! Running `acquire`'s command: started without the credentials `tollgate` was given, kept
//! alive through the signals that would stop `tollgate` first, passed SIGINT, SIGTERM and
//! SIGHUP, stopped (SIGTERM, then SIGKILL after a grace period) when its lease is lost, and its
//! exit code (or 128 + the signal that ended it) as shells report it.

use std::time::Duration;

use anyhow::{Context, Result};

/// What `acquire` does with its command when the lease it runs under is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OnLeaseLost {
    /// SIGTERM to the command (its process group), SIGKILL after `--kill-grace`.
    Stop,
    /// Let it run on; `acquire` still exits non-zero and says the lease was lost.
    KeepRunning,
}

/// How the command ran: its status, and whether it was stopped for a lost lease.
pub(crate) struct Ran {
    pub(crate) status: std::io::Result<std::process::ExitStatus>,
    /// SIGKILL was sent after the grace period.
    pub(crate) killed: bool,
}

/// Runs `acquire`'s command to its end; `None` when it could not start. `tollgate` outlives the
/// signals that would otherwise stop it first, and commits only once the command has stopped
/// calling: had it died, an orphaned command would go on calling while its lease ran out and
/// was granted to another. SIGTERM and SIGHUP, which a supervisor or `kill` sends to this
/// process alone, are passed on to the command.
///
/// When `lost` resolves (the lease is gone) and `on_lost` is `Stop`, the command gets SIGTERM,
/// and SIGKILL `grace` later if it is still running: another holder may be granted the lease
/// meanwhile, so a command that ignores SIGTERM must not go on.
///
/// The command runs in a process group of its own, so that the signals reach what it started
/// too; except in the foreground of a terminal, where it shares `tollgate`'s group so that it
/// can read the terminal and Ctrl-C reaches it (there the signals go to the command alone).
#[cfg(unix)]
pub(crate) async fn run_command(
    program: &str,
    arguments: &[String],
    lost: impl Future<Output = ()>,
    on_lost: OnLeaseLost,
    grace: Duration,
) -> Result<Option<Ran>> {
    use rustix::process::{Signal, kill_process, kill_process_group};
    use tokio::signal::unix::{SignalKind, signal};
    // Installed before the command starts, so no signal meets the default action (death).
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let on_terminal = in_terminal_foreground();
    let Some(mut child) = spawn_command(program, arguments, !on_terminal) else {
        return Ok(None);
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw);
    let send = |signal: Signal| {
        if let Some(pid) = pid {
            // It may have ended since: then there is nobody left to tell.
            let _ = if on_terminal {
                kill_process(pid, signal)
            } else {
                kill_process_group(pid, signal)
            };
        }
    };
    tokio::pin!(lost);
    let mut lease_lost = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut killed = false;
    loop {
        // Biased: a command that has ended is reaped first, so a signal is never passed to its
        // pid after the system could have given that pid to another process.
        let pass_on = tokio::select! {
            biased;
            status = child.wait() => return Ok(Some(Ran { status, killed })),
            () = &mut lost, if !lease_lost => {
                lease_lost = true;
                if on_lost == OnLeaseLost::KeepRunning {
                    continue;
                }
                kill_at = Some(tokio::time::Instant::now() + grace);
                Signal::TERM
            }
            () = sleep_until(kill_at) => {
                kill_at = None;
                killed = true;
                Signal::KILL
            }
            _ = terminate.recv() => Signal::TERM,
            _ = hangup.recv() => Signal::HUP,
            // On a terminal, Ctrl-C has reached the command already through the terminal's
            // process group; elsewhere (`kill -INT`) it is passed on.
            _ = interrupt.recv() => {
                if on_terminal {
                    continue;
                }
                Signal::INT
            }
        };
        send(pass_on);
    }
}

#[cfg(unix)]
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Whether `tollgate` runs in the foreground of its terminal: standard input is a terminal
/// whose foreground process group is this process's.
#[cfg(unix)]
fn in_terminal_foreground() -> bool {
    let stdin = std::io::stdin();
    rustix::termios::isatty(&stdin)
        && rustix::termios::tcgetpgrp(&stdin).is_ok_and(|group| group == rustix::process::getpgrp())
}

#[cfg(not(unix))]
pub(crate) async fn run_command(
    program: &str,
    arguments: &[String],
    lost: impl Future<Output = ()>,
    on_lost: OnLeaseLost,
    _grace: Duration,
) -> Result<Option<Ran>> {
    let Some(mut child) = spawn_command(program, arguments, false) else {
        return Ok(None);
    };
    tokio::pin!(lost);
    let mut lease_lost = false;
    // Ctrl-C reaches the command too; stay alive to commit.
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Some(Ran { status, killed: lease_lost })),
            () = &mut lost, if !lease_lost => {
                lease_lost = true;
                if on_lost == OnLeaseLost::Stop {
                    let _ = child.start_kill();
                }
            }
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

/// Starts `acquire`'s command (in a process group of its own when `own_group`), or says why
/// it could not. The command runs under a permit; it is not trusted with the credentials that
/// grant permits or change limits.
fn spawn_command(
    program: &str,
    arguments: &[String],
    own_group: bool,
) -> Option<tokio::process::Child> {
    let mut command = tokio::process::Command::new(program);
    for name in SECRET_VARIABLES {
        command.env_remove(name);
    }
    #[cfg(unix)]
    if own_group {
        command.process_group(0);
    }
    #[cfg(not(unix))]
    let _ = own_group;
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
