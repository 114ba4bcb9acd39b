//! Which admin token a command sends: the environment's, the config file's, or one a local
//! server keeps beside its SQLite state (or in this user's copy for its port), sent only to the
//! server that wrote it; where a server keeps the one it makes; and the hint after a 401.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use tollgate_cli::kept_token;
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

/// The admin token for a command talking to `server_url`: the environment's, the config
/// file's, or one a local server keeps (beside its SQLite state file, else in this user's copy
/// for its port), which is sent only to the server that wrote it. Also where it looked, for a
/// 401's hint.
pub(crate) fn admin_token(file: &FileConfig, server_url: &str) -> Result<(Option<String>, String)> {
    if let Some(token) = env_text("TOLLGATE_ADMIN_TOKEN").or_else(|| file.admin_token.clone()) {
        return Ok((
            Some(token),
            "TOLLGATE_ADMIN_TOKEN or the config file's admin_token".into(),
        ));
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
        match kept_token::read(path)? {
            Some(kept) if kept.belongs_to(server_url) => {
                return Ok((Some(kept.token), path.display().to_string()));
            }
            Some(kept) => foreign = foreign.or(Some((path, kept))),
            None => {}
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
    Ok((None, looked))
}

/// After a 401 from an admin command: where the token sent (or none) came from.
pub(crate) fn hint_unauthorized(code: ExitCode, sent: bool, looked: &str) -> ExitCode {
    if sent {
        eprintln!("tollgate: the admin token sent came from {looked}; it is not this server's");
    } else {
        eprintln!("tollgate: no admin token found; looked in {looked}");
    }
    code
}
