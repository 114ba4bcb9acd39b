//! Which admin token a command sends, and where: the environment's or the config file's to the
//! server it is told, or one a local server keeps beside its SQLite state (or in this user's
//! copy for its port) to the address that server recorded, once it has proved it holds it;
//! where a server keeps the one it makes; and the hint after a 401.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use hyper::Method;
use tollgate_cli::client::Client;
use tollgate_cli::kept_token::{self, KeptToken};
use tollgate_server::DEFAULT_RULES_URL;

use crate::config::{FileConfig, env_text};

/// Where a server whose state is in a SQLite file keeps the admin token it made: beside the
/// file.
pub(crate) fn admin_token_path(state_url: &str) -> Option<PathBuf> {
    let file = state_url.strip_prefix("sqlite://")?;
    let file = file.split('?').next().unwrap_or(file);
    if file.is_empty() || file == ":memory:" {
        return None;
    }
    Some(PathBuf::from(format!("{file}.admin-token")))
}

/// What an admin command sends, and where.
pub(crate) struct AdminAccess {
    /// The token to send, if any.
    pub(crate) token: Option<String>,
    /// The server to send to: `server_url`, or for a kept token the address its server
    /// recorded.
    pub(crate) url: String,
    /// Where the token was looked for, for a 401's hint.
    pub(crate) looked: String,
}

/// How long a server has to prove it holds a kept token.
const PROOF_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin token for a command talking to `server_url`: the environment's, the config
/// file's, or one a local server keeps (beside its SQLite state file, else in this user's copy
/// for its port). A kept token is sent only to the server that wrote it, at the address it
/// recorded, and only once the server there has proved that it holds it; a copy that fails
/// the proof (left by a server that has stopped, or another listener on the port) is ignored.
pub(crate) async fn admin_token(file: &FileConfig, server_url: &str) -> Result<AdminAccess> {
    if let Some(token) = env_text("TOLLGATE_ADMIN_TOKEN").or_else(|| file.admin_token.clone()) {
        return Ok(AdminAccess {
            token: Some(token),
            url: server_url.to_owned(),
            looked: "TOLLGATE_ADMIN_TOKEN or the config file's admin_token".into(),
        });
    }
    let rules = env_text("TOLLGATE_RULES")
        .or_else(|| file.rules.clone())
        .unwrap_or_else(|| DEFAULT_RULES_URL.to_owned());
    let state = match env_text("TOLLGATE_STATE").or_else(|| file.state.clone()) {
        Some(state) => state,
        None if rules.starts_with("file://") => DEFAULT_RULES_URL.to_owned(),
        None => rules,
    };
    let port = kept_token::url_port(server_url);
    let places: Vec<PathBuf> = admin_token_path(&state)
        .into_iter()
        .chain(port.and_then(kept_token::user_copy_path))
        .collect();
    let looked = std::iter::once("TOLLGATE_ADMIN_TOKEN, the config file's admin_token".to_owned())
        .chain(places.iter().map(|path| path.display().to_string()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut foreign = None;
    for path in &places {
        let Some(kept) = kept_token::read(path)? else {
            continue;
        };
        let Some(url) = kept.base_for(server_url) else {
            foreign = foreign.or(Some((path, kept)));
            continue;
        };
        match prove(&kept, &url).await {
            Ok(()) => {
                return Ok(AdminAccess {
                    token: Some(kept.token),
                    url,
                    looked: path.display().to_string(),
                });
            }
            Err(why) => eprintln!(
                "tollgate: not sending the admin token kept in {}: the server at {url} did not \
                 prove that it holds it ({why}); the file may be left by a server that has \
                 stopped, and another program may listen on its port",
                path.display()
            ),
        }
    }
    if let Some((path, kept)) = foreign {
        let written_by = kept.listen.map_or_else(
            || "a server that has not listened yet".to_owned(),
            |listen| format!("the server listening on {listen}"),
        );
        eprintln!(
            "tollgate: not sending the admin token kept in {} to {server_url}: it was made \
             by {written_by}; give TOLLGATE_ADMIN_TOKEN for another server",
            path.display()
        );
    }
    Ok(AdminAccess {
        token: None,
        url: server_url.to_owned(),
        looked,
    })
}

/// Ask the server at `url` (no token sent) to prove that it holds `kept`'s token: a fresh
/// nonce out, the answer checked in constant time. The reason when it does not.
async fn prove(kept: &KeptToken, url: &str) -> Result<(), String> {
    let nonce = kept_token::proof_nonce().map_err(|error| error.to_string())?;
    let client = Client::new(url, None, PROOF_TIMEOUT).map_err(|error| error.to_string())?;
    let answer = client
        .send(Method::GET, &KeptToken::proof_request(&nonce), None)
        .await
        .map_err(|error| error.to_string())?;
    if answer.status != 200 {
        return Err(format!("it answered {}", answer.status));
    }
    let proof = answer
        .json
        .as_ref()
        .and_then(|json| json.get("proof"))
        .and_then(serde_json::Value::as_str)
        .ok_or("its answer holds no proof")?;
    if !kept.proved_by(proof, &nonce) {
        return Err("its proof does not match".into());
    }
    Ok(())
}

/// After a 401 from an admin command: where the token sent (or none) came from.
pub(crate) fn hint_unauthorized(code: ExitCode, sent: bool, looked: &str) -> ExitCode {
    if sent {
        eprintln!(
            "tollgate: the admin token sent came from {looked}; it is not this server's: set \
             TOLLGATE_ADMIN_TOKEN to the server's admin token"
        );
    } else {
        eprintln!(
            "tollgate: no admin token found; looked in {looked}: set TOLLGATE_ADMIN_TOKEN to \
             the server's admin token"
        );
    }
    code
}
