//! `limits`: the admin API's `/v1/limits` (list, get, put, delete, resume, export), and the
//! limits file commands `check` and `apply`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use hyper::Method;
use tollgate_cli::client::Client;

use crate::EXIT_SERVER_FAILED;
use crate::admin_token::{admin_token, hint_unauthorized};
use crate::cli::{LimitsAction, Output, ServerArgs};
use crate::config::FileConfig;
use crate::http::{CLIENT_TIMEOUT, admin_succeeded, print_json, report_error, segment, server_url};
use crate::limits_file;
use crate::tables::limits_table;

fn read_rule(rule: &str) -> Result<serde_json::Value> {
    let text = if rule == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the rule from standard input")?
    } else if let Some(path) = rule.strip_prefix('@') {
        std::fs::read_to_string(path).with_context(|| format!("reading the rule from {path}"))?
    } else {
        rule.to_owned()
    };
    serde_json::from_str(&text).context("the rule is not valid JSON")
}

pub(crate) async fn limits(
    server: ServerArgs,
    output: Output,
    action: LimitsAction,
    file: FileConfig,
) -> Result<ExitCode> {
    let access = admin_token(&file, &server_url(&server, &file)).await?;
    let had_token = access.token.is_some();
    let looked = access.looked;
    let client = Client::new(&access.url, access.token, CLIENT_TIMEOUT)?;
    let sent = match &action {
        LimitsAction::Apply {
            file,
            dry_run,
            prune,
        } => return apply(&client, file, *dry_run, *prune, had_token, &looked).await,
        LimitsAction::List | LimitsAction::Export { .. } => {
            client.send(Method::GET, "/v1/limits", None).await
        }
        // Dispatched before a server is looked for (`run`).
        LimitsAction::Check { file } => return check_limits(file).await,
        LimitsAction::Get { name } => {
            client
                .send(Method::GET, &format!("/v1/limits/{}", segment(name)), None)
                .await
        }
        LimitsAction::Put { name, rule } => {
            let body = read_rule(rule)?;
            client
                .send(
                    Method::PUT,
                    &format!("/v1/limits/{}", segment(name)),
                    Some(&body),
                )
                .await
        }
        LimitsAction::Delete { name } => {
            client
                .send(
                    Method::DELETE,
                    &format!("/v1/limits/{}", segment(name)),
                    None,
                )
                .await
        }
        LimitsAction::Resume { name, key } => {
            let path = keyed_path(name, "pause", key.as_deref());
            client.send(Method::DELETE, &path, None).await
        }
        LimitsAction::Reset { name, key } => {
            let path = keyed_path(name, "usage", key.as_deref());
            client.send(Method::DELETE, &path, None).await
        }
    };
    let answer = match admin_succeeded(sent, had_token, &looked) {
        Ok(answer) => answer,
        Err(code) => return Ok(code),
    };
    if let LimitsAction::Export { format } = action {
        let (text, rejected) = limits_file::export(&answer, format)?;
        print!("{text}");
        if rejected > 0 {
            eprintln!(
                "tollgate: {rejected} rejected row(s) are not in force and not exported; \
                 `tollgate limits list` shows them"
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Records (a list, a limit) follow --output; the answer to a change is its JSON.
    let records = matches!(action, LimitsAction::List | LimitsAction::Get { .. });
    match (output, &answer.json) {
        (Output::Table, Some(json)) if records => print!("{}", limits_table(json)),
        _ => print_json(&answer)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `limits check`: a summary and success, or every rejected entry (the error) and failure.
pub(crate) async fn check_limits(path: &Path) -> Result<ExitCode> {
    print!("{}", limits_file::check(path).await?);
    Ok(ExitCode::SUCCESS)
}

/// `/v1/limits/{name}/{part}`, with `?key=` for one key of a limit counted per key.
fn keyed_path(name: &str, part: &str, key: Option<&str>) -> String {
    let mut path = format!("/v1/limits/{}/{part}", segment(name));
    if let Some(key) = key {
        path.push_str(&format!("?key={}", segment(key)));
    }
    path
}

/// `limits apply`: validate the whole file, compare it with the limits in force, show the
/// difference, and (unless a dry run) make it so.
async fn apply(
    client: &Client,
    path: &Path,
    dry_run: bool,
    prune: bool,
    had_token: bool,
    looked: &str,
) -> Result<ExitCode> {
    let wanted = limits_file::read_limits_file(path).await?;
    let sent = client.send(Method::GET, "/v1/limits", None).await;
    let answer = match admin_succeeded(sent, had_token, looked) {
        Ok(answer) => answer,
        Err(code) => return Ok(code),
    };
    let plan = limits_file::plan(&wanted, &limits_file::limits_in_force(&answer)?);
    print!("{}", limits_file::describe(&plan, prune));
    if dry_run || plan.is_empty(prune) {
        return Ok(ExitCode::SUCCESS);
    }
    match limits_file::carry_out(client, &plan, prune).await {
        Ok(None) => Ok(ExitCode::SUCCESS),
        Ok(Some(refused)) if refused.status.as_u16() == 401 => {
            Ok(hint_unauthorized(report_error(&refused), had_token, looked))
        }
        Ok(Some(refused)) => Ok(report_error(&refused)),
        Err(error) => {
            eprintln!("tollgate: {error}");
            Ok(ExitCode::from(EXIT_SERVER_FAILED))
        }
    }
}
