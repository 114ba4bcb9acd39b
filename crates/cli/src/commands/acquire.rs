//! `acquire LIMIT -- COMMAND`: a permit asked for, its leases renewed while the command runs,
//! and committed once it has ended; the exit code is the command's.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow};
use hyper::Method;
use tollgate_api::data::{AcquireBody, CommitBody, Granted, RateLimited, Used};
use tollgate_cli::client::Client;

use crate::EXIT_SERVER_FAILED;
use crate::cli::{AcquireArgs, ServerArgs};
use crate::config::{FileConfig, env_text};
use crate::http::{CLIENT_TIMEOUT, client, hint_data_unauthorized, report_error};
use crate::supervise::{OnLeaseLost, Ran, exit_code_of, run_command};

/// Exit code of `acquire` when nothing was granted within the wait (sysexits EX_TEMPFAIL).
const EXIT_NOT_GRANTED: u8 = 75;

/// Exit code of `acquire` when the command could not be started (as a shell does).
const EXIT_COMMAND_NOT_STARTED: u8 = 127;

/// Exit code of `acquire` when the lease its command ran under was lost (whether the command
/// was stopped or, with `--on-lease-lost keep-running`, ran on): outside sysexits' range and
/// the shells' own codes, so it is not read as the command's failure.
pub(crate) const EXIT_LEASE_LOST: u8 = 79;

/// Retries of a renewal that failed (the server unreachable or failing), at most this far
/// apart: a server that comes back is asked again soon, and says whether it still knows the
/// permit.
const RENEWAL_RETRY_MAX: Duration = Duration::from_secs(1);

pub(crate) async fn acquire(
    args: AcquireArgs,
    server: ServerArgs,
    file: FileConfig,
) -> Result<ExitCode> {
    let token = env_text("TOLLGATE_DATA_TOKEN").or_else(|| file.data_token.clone());
    let had_token = token.is_some();
    let client = client(server, &file, token, CLIENT_TIMEOUT + args.wait)?;
    let wait_ms = u64::try_from(args.wait.as_millis()).unwrap_or(u64::MAX);
    let body = serde_json::to_value(AcquireBody {
        limits: args.limits.clone(),
        key: args.key.clone(),
        cost: Some(args.cost),
        costs: None,
        priority: Some(args.priority.clone()),
        wait_ms: Some(wait_ms),
        refundable: None,
    })?;
    let answer = match client.send(Method::POST, "/v1/acquire", Some(&body)).await {
        Ok(answer) => answer,
        Err(error) => {
            eprintln!("tollgate: {error}");
            return Ok(ExitCode::from(EXIT_SERVER_FAILED));
        }
    };
    let received = tokio::time::Instant::now();
    if answer.status.as_u16() == 429 {
        let denied = answer
            .json
            .clone()
            .and_then(|json| serde_json::from_value::<RateLimited>(json).ok());
        let retry = denied.as_ref().map_or(0, |denied| denied.retry_after_ms);
        // The server's own clause where it says more than the reason's meaning: units left
        // but kept for higher priority are not a used-up limit.
        let why = denied.map_or_else(
            || "the limit is used up".to_owned(),
            |denied| match kept_clause(&denied.error.message) {
                Some(clause) => clause.to_owned(),
                None => denied.reason.0.meaning().to_owned(),
            },
        );
        eprintln!(
            "tollgate: not granted within {}: {why}; retry in {}",
            tollgate_server::human_duration(args.wait),
            tollgate_server::human_duration(Duration::from_millis(retry))
        );
        return Ok(ExitCode::from(EXIT_NOT_GRANTED));
    }
    if !answer.status.is_success() {
        let code = report_error(&answer);
        if answer.status.as_u16() == 401 {
            hint_data_unauthorized(had_token);
        }
        return Ok(if answer.status.is_server_error() {
            code
        } else {
            ExitCode::FAILURE
        });
    }
    let grant: Granted = answer
        .json
        .clone()
        .and_then(|json| serde_json::from_value(json).ok())
        .ok_or_else(|| anyhow!("the server's grant is not a grant: {:?}", answer.json))?;
    let permit = grant.permit;
    // The limits held by lease, and when the earliest lease ends unless renewed: counted from
    // the grant's arrival, which is after the server decided.
    let leased: Vec<String> = grant
        .limits
        .iter()
        .filter(|limit| limit.expires_ms.is_some())
        .map(|limit| limit.name.clone())
        .collect();
    let lease_ms = grant
        .limits
        .iter()
        .filter_map(|limit| limit.expires_ms)
        .min();
    let (lost_sender, lost_receiver) = tokio::sync::oneshot::channel::<LeaseLost>();
    let renewer = lease_ms.map(|lease_ms| {
        tokio::spawn(keep_leases(
            client.clone(),
            permit.clone(),
            lease_ms,
            received,
            lost_sender,
        ))
    });
    let (program, arguments) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow!("no command given after --"))?;
    let mut lost = None;
    let lost_future = async {
        match lost_receiver.await {
            Ok(why) => lost = Some(why),
            // The renewer ended without a loss (no lease): nothing to wait for.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let ran = run_command(
        program,
        arguments,
        lost_future,
        args.on_lease_lost,
        args.kill_grace,
    )
    .await?;
    if let Some(renewer) = renewer {
        renewer.abort();
    }
    if let Some(lost) = lost {
        // The permit is gone (or its lease ran out): there is nothing to commit.
        return Ok(ExitCode::from(lease_lost(
            &lost,
            &leased,
            &args,
            program,
            ran.as_ref(),
        )));
    }
    let status = ran.map(|ran| ran.status);
    // A command that never started made no call: refund everything. Otherwise the units were
    // (or may have been) used.
    let used = if status.is_some() { args.cost } else { 0 };
    let commit = client
        .send(
            Method::POST,
            &format!("/v1/permits/{permit}/commit"),
            Some(&serde_json::to_value(CommitBody {
                used: Some(Used::All(used)),
                sent_after_ms: None,
            })?),
        )
        .await;
    match commit {
        Ok(answer) if answer.status.is_success() => {}
        Ok(answer) => {
            report_error(&answer);
        }
        Err(error) => eprintln!("tollgate: commit failed: {error}"),
    }
    let code = match status {
        None => EXIT_COMMAND_NOT_STARTED,
        Some(Ok(status)) => exit_code_of(status),
        Some(Err(error)) => {
            eprintln!("tollgate: waiting for {program:?}: {error}");
            1
        }
    };
    Ok(ExitCode::from(code))
}

/// Why a lease was lost, and when.
#[derive(Debug)]
struct LeaseLost {
    at: String,
    why: String,
}

/// Renews the permit's leases until the command ends (the task is aborted then), at a third
/// of their lifetime, so two missed renewals still leave time. Tells `lost` when the lease is
/// gone: the server refused a renewal (it no longer knows the permit, as after a restart, or
/// the lease expired), or renewals failed until the lease's end passed. `deadline` is when
/// the lease ends unless renewed, counted from before each renewal was sent.
async fn keep_leases(
    client: Client,
    permit: String,
    lease_ms: u64,
    granted_at: tokio::time::Instant,
    lost: tokio::sync::oneshot::Sender<LeaseLost>,
) {
    let period = Duration::from_millis((lease_ms / 3).max(10));
    let mut deadline = granted_at + Duration::from_millis(lease_ms);
    let mut next = granted_at + period;
    let mut last_error = String::new();
    let path = format!("/v1/permits/{permit}/renew");
    let why = loop {
        if next >= deadline {
            tokio::time::sleep_until(deadline).await;
            break format!(
                "it expired while renewals failed for longer than its TTL ({last_error})"
            );
        }
        tokio::time::sleep_until(next).await;
        let sent = tokio::time::Instant::now();
        let answer =
            match tokio::time::timeout_at(deadline, client.send(Method::POST, &path, None)).await {
                Ok(answer) => answer,
                Err(_) => {
                    // Unanswered until the lease's end: it is over (asking again now would
                    // only time out at once, over and over).
                    last_error = "the server did not answer".to_owned();
                    next = deadline;
                    continue;
                }
            };
        match answer {
            Ok(answer) if answer.status.is_success() => {
                let renewed = answer
                    .json
                    .as_ref()
                    .and_then(|json| json.get("expires_ms"))
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(lease_ms);
                deadline = sent + Duration::from_millis(renewed);
                next = sent + Duration::from_millis((renewed / 3).max(10));
            }
            // 404: the server does not know the permit (it restarted, or the store lost it);
            // 409: the lease expired or was released. Either way it is another's to take.
            Ok(answer) if matches!(answer.status.as_u16(), 404 | 409) => {
                break format!(
                    "the server refused its renewal: {}",
                    answer
                        .error_message()
                        .map_or_else(|| answer.text(), str::to_owned)
                );
            }
            Ok(answer) => {
                last_error = format!(
                    "renewal answered {}: {}",
                    answer.status.as_u16(),
                    answer
                        .error_message()
                        .map_or_else(|| answer.text(), str::to_owned)
                );
                eprintln!("tollgate: lease renewal failed: {last_error}; retrying");
                next = tokio::time::Instant::now() + period.min(RENEWAL_RETRY_MAX);
            }
            Err(error) => {
                last_error = error.to_string();
                eprintln!("tollgate: lease renewal failed: {last_error}; retrying");
                next = tokio::time::Instant::now() + period.min(RENEWAL_RETRY_MAX);
            }
        }
    };
    let _ = lost.send(LeaseLost {
        at: tollgate::utc_now_text(),
        why,
    });
}

/// Says, in one sentence, that the lease was lost and what became of the command; the exit
/// code of `acquire` then.
fn lease_lost(
    lost: &LeaseLost,
    leased: &[String],
    args: &AcquireArgs,
    program: &str,
    ran: Option<&Ran>,
) -> u8 {
    let limits = leased.join(", ");
    let ended = match ran.map(|ran| &ran.status) {
        Some(Ok(status)) => format!("exited with {}", exit_code_of(*status)),
        Some(Err(error)) => format!("could not be waited for ({error})"),
        None => "did not start".to_owned(),
    };
    match args.on_lease_lost {
        OnLeaseLost::Stop => {
            let how = if ran.is_some_and(|ran| ran.killed) {
                format!(
                    "with SIGKILL, as it was still running {} after SIGTERM",
                    tollgate_server::human_duration(args.kill_grace)
                )
            } else {
                "with SIGTERM".to_owned()
            };
            eprintln!(
                "tollgate: the lease on {limits} was lost at {} ({}), so {program:?} was stopped \
                 {how} and {ended}, since another holder may now be granted it",
                lost.at, lost.why
            );
        }
        OnLeaseLost::KeepRunning => eprintln!(
            "tollgate: the lease on {limits} was lost at {} ({}); {program:?} ran on without \
             it (--on-lease-lost keep-running) and {ended}",
            lost.at, lost.why
        ),
    }
    EXIT_LEASE_LOST
}

/// From a denial's message, the clause saying the units left are kept for higher priority.
fn kept_clause(message: &str) -> Option<&str> {
    let clause = message
        .split("; ")
        .find(|clause| clause.contains(tollgate_server::KEPT_FOR_HIGHER_PRIORITY))?;
    Some(clause.strip_prefix("not granted: ").unwrap_or(clause))
}
