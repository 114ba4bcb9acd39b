//! `status`: `/v1/stats` with the data token, as `status`'s table or as JSON.

use std::process::ExitCode;

use anyhow::Result;
use hyper::Method;

use crate::cli::{Output, ServerArgs};
use crate::config::{FileConfig, env_text};
use crate::http::{CLIENT_TIMEOUT, client, data_succeeded, print_json, segment};
use crate::status;

pub(crate) async fn status(
    server: ServerArgs,
    limit: Option<String>,
    key: Option<String>,
    output: Output,
    file: FileConfig,
) -> Result<ExitCode> {
    let token = env_text("TOLLGATE_DATA_TOKEN").or_else(|| file.data_token.clone());
    let had_token = token.is_some();
    let client = client(server, &file, token, CLIENT_TIMEOUT)?;
    let mut path = "/v1/stats".to_owned();
    if let Some(limit) = &limit {
        path.push_str(&format!("?limit={}", segment(limit)));
        if let Some(key) = &key {
            path.push_str(&format!("&key={}", segment(key)));
        }
    }
    let answer = match data_succeeded(client.send(Method::GET, &path, None).await, had_token) {
        Ok(answer) => answer,
        Err(code) => return Ok(code),
    };
    let stats = answer
        .json
        .clone()
        .and_then(|json| serde_json::from_value(json).ok());
    match (output, stats) {
        (Output::Table, Some(stats)) => print!("{}", status::table(&stats)),
        _ => print_json(&answer)?,
    }
    Ok(ExitCode::SUCCESS)
}
