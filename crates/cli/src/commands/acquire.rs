//! `acquire LIMIT -- COMMAND`: a permit asked for, its leases renewed while the command runs,
//! and committed once it has ended; the exit code is the command's.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow};
use hyper::Method;
use tollgate_api::data::{AcquireBody, CommitBody, Granted, RateLimited};

use crate::EXIT_SERVER_FAILED;
use crate::cli::{AcquireArgs, ServerArgs};
use crate::config::{FileConfig, env_text};
use crate::http::{CLIENT_TIMEOUT, client, report_error};
use crate::supervise::{exit_code_of, run_command};

/// Exit code of `acquire` when nothing was granted within the wait (sysexits EX_TEMPFAIL).
const EXIT_NOT_GRANTED: u8 = 75;

/// Exit code of `acquire` when the command could not be started (as a shell does).
const EXIT_COMMAND_NOT_STARTED: u8 = 127;

pub(crate) async fn acquire(
    args: AcquireArgs,
    server: ServerArgs,
    file: FileConfig,
) -> Result<ExitCode> {
    let token = env_text("TOLLGATE_DATA_TOKEN").or_else(|| file.data_token.clone());
    let client = client(server, &file, token, CLIENT_TIMEOUT + args.wait)?;
    let wait_ms = u64::try_from(args.wait.as_millis()).unwrap_or(u64::MAX);
    let body = serde_json::to_value(AcquireBody {
        limits: args.limits.clone(),
        key: args.key.clone(),
        cost: Some(args.cost),
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
    if answer.status.as_u16() == 429 {
        let denied = answer
            .json
            .clone()
            .and_then(|json| serde_json::from_value::<RateLimited>(json).ok());
        let retry = denied.as_ref().map_or(0, |denied| denied.retry_after_ms);
        let why = denied.map_or("the limit is used up", |denied| denied.reason.0.meaning());
        eprintln!(
            "tollgate: not granted within {}: {why}; retry in {}",
            tollgate_server::human_duration(args.wait),
            tollgate_server::human_duration(Duration::from_millis(retry))
        );
        return Ok(ExitCode::from(EXIT_NOT_GRANTED));
    }
    if !answer.status.is_success() {
        let code = report_error(&answer);
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
    // Renew leases at a third of their lifetime, so two missed renewals still leave time.
    let lease_ms = grant
        .limits
        .iter()
        .filter_map(|limit| limit.expires_ms)
        .min();
    let renewer = lease_ms.map(|lease_ms| {
        let client = client.clone();
        let permit = permit.clone();
        tokio::spawn(async move {
            let period = Duration::from_millis((lease_ms / 3).max(10));
            loop {
                tokio::time::sleep(period).await;
                let path = format!("/v1/permits/{permit}/renew");
                match client.send(Method::POST, &path, None).await {
                    Ok(answer) if answer.status.is_success() => {}
                    Ok(answer) => {
                        eprintln!(
                            "tollgate: lease renewal refused: {}",
                            answer.error_message().unwrap_or_default()
                        );
                        break;
                    }
                    Err(error) => eprintln!("tollgate: lease renewal failed: {error}"),
                }
            }
        })
    });
    let (program, arguments) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow!("no command given after --"))?;
    let status = run_command(program, arguments).await?;
    if let Some(renewer) = renewer {
        renewer.abort();
    }
    // A command that never started made no call: refund everything. Otherwise the units were
    // (or may have been) used.
    let used = if status.is_some() { args.cost } else { 0 };
    let commit = client
        .send(
            Method::POST,
            &format!("/v1/permits/{permit}/commit"),
            Some(&serde_json::to_value(CommitBody {
                used: Some(used),
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
