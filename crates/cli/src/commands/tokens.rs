//! `tokens`: the admin API's `/v1/tokens` (create, list, delete).

use std::process::ExitCode;

use anyhow::Result;
use hyper::Method;
use tollgate_cli::client::Client;

use crate::admin_token::admin_token;
use crate::cli::{Output, ServerArgs, TokensAction};
use crate::config::FileConfig;
use crate::http::{CLIENT_TIMEOUT, admin_succeeded, print_json, segment, server_url};
use crate::tables::tokens_table;

/// `tokens`: the admin API's `/v1/tokens`, with the admin token `limits` uses.
pub(crate) async fn tokens(
    server: ServerArgs,
    output: Output,
    action: TokensAction,
    file: FileConfig,
) -> Result<ExitCode> {
    let access = admin_token(&file, &server_url(&server, &file)).await?;
    let had_token = access.token.is_some();
    let looked = access.looked;
    let client = Client::new(&access.url, access.token, CLIENT_TIMEOUT)?;
    let sent = match &action {
        TokensAction::Create {
            name,
            limits,
            priority_max,
            may_pause,
        } => {
            let mut body = serde_json::json!({
                "name": name,
                "limits": limits,
                "may_pause": may_pause,
            });
            if let (Some(priority_max), Some(object)) = (priority_max, body.as_object_mut()) {
                object.insert("priority_max".into(), priority_max.clone().into());
            }
            client.send(Method::POST, "/v1/tokens", Some(&body)).await
        }
        TokensAction::List => client.send(Method::GET, "/v1/tokens", None).await,
        TokensAction::Delete { name } => {
            client
                .send(
                    Method::DELETE,
                    &format!("/v1/tokens/{}", segment(name)),
                    None,
                )
                .await
        }
    };
    let answer = match admin_succeeded(sent, had_token, &looked) {
        Ok(answer) => answer,
        Err(code) => return Ok(code),
    };
    match (&action, output, &answer.json) {
        (TokensAction::List, Output::Table, Some(json)) => print!("{}", tokens_table(json)),
        _ => print_json(&answer)?,
    }
    if let TokensAction::Create { .. } = action {
        eprintln!(
            "tollgate: the secret is shown once: the server keeps only its hash; give it to the \
             caller as its data token"
        );
    }
    Ok(ExitCode::SUCCESS)
}
