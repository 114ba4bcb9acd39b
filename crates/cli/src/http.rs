//! The client commands' side of the HTTP API: which server, the client, the exit code an
//! answer ends with (69 for a server that failed or could not be reached), printing an answer,
//! and path segments.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use tollgate_cli::client::{Answer, Client};

use crate::EXIT_SERVER_FAILED;
use crate::admin_token::hint_unauthorized;
use crate::cli::ServerArgs;
use crate::config::FileConfig;

const DEFAULT_SERVER_URL: &str = "http://127.0.0.1:7070";

/// How long client commands wait for an answer beyond the acquire's own wait.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The server a command talks to: `--server`, the config file's, or the local default.
pub(crate) fn server_url(server: &ServerArgs, file: &FileConfig) -> String {
    server
        .server
        .clone()
        .or_else(|| file.server.clone())
        .unwrap_or_else(|| DEFAULT_SERVER_URL.to_owned())
}

pub(crate) fn client(
    server: ServerArgs,
    file: &FileConfig,
    token: Option<String>,
    timeout: Duration,
) -> Result<Client> {
    Ok(Client::new(&server_url(&server, file), token, timeout)?)
}

/// The successful answer of a client command's request, or the exit code it ends with: 69 for
/// a server that cannot be reached (as for `acquire`: try again later, not a usage error), or
/// the error answer's code.
pub(crate) fn succeeded(
    sent: std::result::Result<Answer, tollgate_cli::client::ClientError>,
) -> std::result::Result<Answer, ExitCode> {
    match sent {
        Ok(answer) if answer.status.is_success() => Ok(answer),
        Ok(answer) => Err(report_error(&answer)),
        Err(error) => {
            eprintln!("tollgate: {error}");
            Err(ExitCode::from(EXIT_SERVER_FAILED))
        }
    }
}

/// `succeeded` for an admin command, saying after a 401 where the token came from.
pub(crate) fn admin_succeeded(
    sent: std::result::Result<Answer, tollgate_cli::client::ClientError>,
    had_token: bool,
    looked: &str,
) -> std::result::Result<Answer, ExitCode> {
    let unauthorized = matches!(&sent, Ok(answer) if answer.status.as_u16() == 401);
    succeeded(sent).map_err(|code| {
        if unauthorized {
            hint_unauthorized(code, had_token, looked)
        } else {
            code
        }
    })
}

/// `succeeded` for a data-plane command (`acquire`, `status`), saying after a 401 which
/// environment variable holds the data token: the server's message names only the header.
pub(crate) fn data_succeeded(
    sent: std::result::Result<Answer, tollgate_cli::client::ClientError>,
    had_token: bool,
) -> std::result::Result<Answer, ExitCode> {
    let unauthorized = matches!(&sent, Ok(answer) if answer.status.as_u16() == 401);
    succeeded(sent).inspect_err(|_| {
        if unauthorized {
            hint_data_unauthorized(had_token);
        }
    })
}

/// After a 401 on the data plane: set TOLLGATE_DATA_TOKEN, or the one sent is not accepted.
pub(crate) fn hint_data_unauthorized(had_token: bool) {
    if had_token {
        eprintln!(
            "tollgate: the server does not accept the data token sent (from TOLLGATE_DATA_TOKEN \
             or the config file's data_token): set TOLLGATE_DATA_TOKEN to its data token or a \
             scoped token that covers this limit"
        );
    } else {
        eprintln!(
            "tollgate: the server needs a data token: set TOLLGATE_DATA_TOKEN (or data_token \
             in the config file) to its data token or a scoped token"
        );
    }
}

/// Print an error answer; returns the exit code for it.
pub(crate) fn report_error(answer: &Answer) -> ExitCode {
    let code = answer.error_code().unwrap_or("unknown");
    let message = answer
        .error_message()
        .map_or_else(|| answer.text(), str::to_owned);
    eprintln!("tollgate: {} {code}: {message}", answer.status.as_u16());
    if answer.status.is_server_error() {
        ExitCode::from(EXIT_SERVER_FAILED)
    } else {
        ExitCode::FAILURE
    }
}

pub(crate) fn print_json(answer: &Answer) -> Result<()> {
    match &answer.json {
        Some(json) => println!("{}", serde_json::to_string_pretty(json)?),
        None => println!("{}", answer.text()),
    }
    Ok(())
}

/// A path segment: limit names are validated by the server; encode anything that would change
/// the path's meaning.
pub(crate) fn segment(name: &str) -> String {
    let mut encoded = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'-') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}
