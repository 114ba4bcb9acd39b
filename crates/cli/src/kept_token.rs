//! The admin token a local server makes when none is configured, kept in a file beside its
//! SQLite state database (`tollgate.db.admin-token`), and the rules for trusting and sending
//! it.
//!
//! The file's first line is the token; the server adds `listen ADDRESS` once it listens, so
//! that the commands send the token to that server alone and never to whatever `--server`
//! they are given, and takes it away again when it stops cleanly. A command connects to that
//! address as written and sends the token only after the server there has proved it holds it
//! (`GET /v1/admin-token/proof`, `tollgate_server::admin_proof`): a file left by a server that
//! has stopped, and another listener on the same port, get no token. A file that others could
//! have written or read (looser than 0600, or owned by another user) is refused: a planted
//! token would let its author in.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use tollgate_server::admin_proof::{ADMIN_PROOF_NONCE, ADMIN_PROOF_PATH, admin_proof_matches};

/// The file's line that records where the server that wrote the token listens.
const LISTEN_PREFIX: &str = "listen ";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeptTokenError {
    #[error("admin token file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("admin token file {path} is empty")]
    Empty { path: PathBuf },
    #[error(
        "admin token file {path} has mode {mode:o}: others could read or replace it; \
         make it readable by its owner alone (chmod 600 {path}) or remove it"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error(
        "admin token file {path} belongs to user {owner}, not to this user ({user}): it may \
         have been planted; remove it"
    )]
    NotOurs {
        path: PathBuf,
        owner: u32,
        user: u32,
    },
    #[error("admin token file {path}: line {line:?} is not `listen ADDRESS`")]
    BadListen { path: PathBuf, line: String },
    #[error("no randomness for a token: {0}")]
    Random(String),
}

/// A kept token, and where the server that keeps it listens (once it has said).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptToken {
    pub token: String,
    pub listen: Option<SocketAddr>,
}

impl KeptToken {
    /// Whether a command talking to `url` may send this token: only to the server that wrote
    /// it, reached at its own port over loopback (or at the exact address it listens on).
    pub fn belongs_to(&self, url: &str) -> bool {
        let Some(listen) = self.listen else {
            return false;
        };
        let Some((host, port)) = url_host_port(url) else {
            return false;
        };
        if port != listen.port() {
            return false;
        }
        let localhost = host.eq_ignore_ascii_case("localhost");
        match host.parse::<IpAddr>() {
            // The address it is bound to, or any loopback address when it is bound to all.
            Ok(ip) => ip == listen.ip() || (ip.is_loopback() && listen.ip().is_unspecified()),
            // Another server may hold 127.0.0.2 or [::1] at the same port: `localhost` is
            // taken for the server only when it listens on loopback or everywhere.
            Err(_) => localhost && (listen.ip().is_loopback() || listen.ip().is_unspecified()),
        }
    }

    /// Where a command connects to reach the server that wrote this token: the address it
    /// recorded, as written (a name such as `localhost` is never looked up again, since it may
    /// lead to another listener on the same port), loopback for a server bound to all
    /// addresses.
    pub fn connect_address(&self) -> Option<SocketAddr> {
        let listen = self.listen?;
        let ip = match listen.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        Some(SocketAddr::new(ip, listen.port()))
    }

    /// `url` with its host and port replaced by `connect_address`: where a command that sends
    /// this token talks to, `None` when the token does not belong to `url`.
    pub fn base_for(&self, url: &str) -> Option<String> {
        if !self.belongs_to(url) {
            return None;
        }
        let (scheme, rest) = url.split_once("://")?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        Some(format!(
            "{scheme}://{}{}",
            self.connect_address()?,
            &rest[authority_end..]
        ))
    }

    /// The path and query that ask the server for its proof of this token, for `nonce`.
    pub fn proof_request(nonce: &str) -> String {
        format!("{ADMIN_PROOF_PATH}?{ADMIN_PROOF_NONCE}={nonce}")
    }

    /// Whether `proof` shows that the server answering it holds this token and listens where
    /// the file says, for `nonce` (compared in constant time).
    pub fn proved_by(&self, proof: &str, nonce: &str) -> bool {
        self.listen.is_some_and(|listen| {
            admin_proof_matches(proof, &self.token, &listen.to_string(), nonce)
        })
    }
}

/// A fresh nonce for a proof: 32 random bytes in hex.
pub fn proof_nonce() -> Result<String, KeptTokenError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| KeptTokenError::Random(error.to_string()))?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// The port a `http://HOST:PORT/...` URL names (the scheme's when it names none).
pub fn url_port(url: &str) -> Option<u16> {
    url_host_port(url).map(|(_, port)| port)
}

/// `http://HOST:PORT/...` as (host, port), the host without IPv6 brackets; the port defaults
/// to the scheme's.
fn url_host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    // Credentials in the URL never name the host.
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().ok()?),
            None => (authority, default_port),
        }
    };
    Some((host.to_owned(), port))
}

/// The token in `path`, if the file is there; refused when it could have been written or read
/// by another user.
pub fn read(path: &Path) -> Result<Option<KeptToken>, KeptTokenError> {
    let io = |source| KeptTokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io(error)),
    };
    check_private(path)?;
    let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let Some(token) = lines.next() else {
        return Err(KeptTokenError::Empty {
            path: path.to_path_buf(),
        });
    };
    let mut listen = None;
    for line in lines {
        let address = line
            .strip_prefix(LISTEN_PREFIX)
            .and_then(|address| address.trim().parse().ok())
            .ok_or_else(|| KeptTokenError::BadListen {
                path: path.to_path_buf(),
                line: line.to_owned(),
            })?;
        listen = Some(address);
    }
    Ok(Some(KeptToken {
        token: token.to_owned(),
        listen,
    }))
}

/// The token in `path`, made there (random, readable by this user alone) if there is none yet.
pub fn read_or_make(path: &Path) -> Result<KeptToken, KeptTokenError> {
    if let Some(kept) = read(path)? {
        return Ok(kept);
    }
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|error| KeptTokenError::Random(error.to_string()))?;
    let token: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    write_private(path, &format!("{token}\n"), true)?;
    Ok(KeptToken {
        token,
        listen: None,
    })
}

/// Record in `path` that the server keeping `kept` listens on `address`, so that the commands
/// send the token there alone. Written whole to a new file, then renamed over the old one.
pub fn record_listen(
    path: &Path,
    kept: &KeptToken,
    address: SocketAddr,
) -> Result<(), KeptTokenError> {
    let mut staged = path.as_os_str().to_owned();
    staged.push(".new");
    let staged = PathBuf::from(staged);
    // A stale staged file from a crash mid-write is ours to replace.
    let _ = std::fs::remove_file(&staged);
    write_private(
        &staged,
        &format!("{}\n{LISTEN_PREFIX}{address}\n", kept.token),
        true,
    )?;
    std::fs::rename(&staged, path).map_err(|source| KeptTokenError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Where this user's commands find the token of the server listening on `port` from any
/// directory: `$XDG_STATE_HOME/tollgate/servers/PORT.admin-token`, by default under
/// `~/.local/state`. `None` without a home.
pub fn user_copy_path(port: u16) -> Option<PathBuf> {
    user_copy_path_under(
        port,
        std::env::var_os("XDG_STATE_HOME"),
        std::env::var_os("HOME"),
    )
}

/// `user_copy_path` for these values of `XDG_STATE_HOME` and `HOME`.
fn user_copy_path_under(
    port: u16,
    state_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let state = state_home
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
        .or_else(|| {
            home.map(PathBuf::from)
                .filter(|path| path.is_absolute())
                .map(|home| home.join(".local").join("state"))
        })?;
    Some(
        state
            .join("tollgate")
            .join("servers")
            .join(format!("{port}.admin-token")),
    )
}

/// Keep a copy of `kept` for the server listening on `address` where this user's commands
/// look from any directory (`user_copy_path`), in a directory only this user can enter.
/// Returns where.
pub fn record_user_copy(kept: &KeptToken, address: SocketAddr) -> Result<PathBuf, KeptTokenError> {
    let Some(path) = user_copy_path(address.port()) else {
        return Err(KeptTokenError::Io {
            path: PathBuf::from("$HOME/.local/state/tollgate"),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no home directory"),
        });
    };
    if let Some(directory) = path.parent() {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(directory)
            .map_err(|source| KeptTokenError::Io {
                path: directory.to_path_buf(),
                source,
            })?;
    }
    record_listen(&path, kept, address)?;
    Ok(path)
}

/// Whether the file at `path` still records `kept`'s token for a server on `address`: what a
/// server checks before it withdraws a file at its clean stop, so that one another server has
/// since written is left alone.
fn still_records(path: &Path, kept: &KeptToken, address: SocketAddr) -> bool {
    matches!(read(path), Ok(Some(found)) if found.token == kept.token && found.listen == Some(address))
}

/// At a clean stop of the server on `address`: the file beside its state keeps the token (the
/// next start uses it again) without the `listen` line, so that no command looks for a server
/// that has stopped.
pub fn withdraw_listen(
    path: &Path,
    kept: &KeptToken,
    address: SocketAddr,
) -> Result<(), KeptTokenError> {
    if !still_records(path, kept, address) {
        return Ok(());
    }
    let mut staged = path.as_os_str().to_owned();
    staged.push(".new");
    let staged = PathBuf::from(staged);
    let _ = std::fs::remove_file(&staged);
    write_private(&staged, &format!("{}\n", kept.token), true)?;
    std::fs::rename(&staged, path).map_err(|source| KeptTokenError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// At a clean stop of the server on `address`: this user's copy for its port is removed, while
/// it is still this server's. Returns the path removed, if any.
pub fn remove_user_copy(
    kept: &KeptToken,
    address: SocketAddr,
) -> Result<Option<PathBuf>, KeptTokenError> {
    let Some(path) = user_copy_path(address.port()) else {
        return Ok(None);
    };
    if !still_records(&path, kept, address) {
        return Ok(None);
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(Some(path)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(KeptTokenError::Io { path, source }),
    }
}

fn write_private(path: &Path, text: &str, create_new: bool) -> Result<(), KeptTokenError> {
    let io = |source| KeptTokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(create_new);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(io)?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(io)
}

#[cfg(unix)]
fn check_private(path: &Path) -> Result<(), KeptTokenError> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).map_err(|source| KeptTokenError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let user = rustix::process::geteuid().as_raw();
    if metadata.uid() != user {
        return Err(KeptTokenError::NotOurs {
            path: path.to_path_buf(),
            owner: metadata.uid(),
            user,
        });
    }
    let mode = metadata.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeptTokenError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_path: &Path) -> Result<(), KeptTokenError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(listen: &str) -> KeptToken {
        KeptToken {
            token: "t".into(),
            listen: Some(listen.parse().expect("address")),
        }
    }

    #[test]
    fn a_kept_token_goes_only_to_the_server_that_wrote_it() {
        let local = kept("127.0.0.1:7070");
        for url in [
            "http://127.0.0.1:7070",
            "http://localhost:7070/",
            "http://LOCALHOST:7070",
        ] {
            assert!(local.belongs_to(url), "{url}");
        }
        for url in [
            "http://127.0.0.1:7071",
            "http://127.0.0.2:7070/v1",
            "http://[::1]:7070",
            "http://evil.example:7070",
            "http://127.0.0.1.evil.example:7070",
            "http://evil.example@attacker:7070",
            "http://10.0.0.5:7070",
            "http://127.0.0.1",
            "ftp://127.0.0.1:7070",
            "127.0.0.1:7070",
        ] {
            assert!(!local.belongs_to(url), "{url}");
        }
        // Credentials before the host do not make it loopback.
        assert!(!local.belongs_to("http://127.0.0.1:7070@evil.example:7070"));
        let everywhere = kept("0.0.0.0:7070");
        assert!(everywhere.belongs_to("http://127.0.0.1:7070"));
        assert!(!everywhere.belongs_to("http://10.0.0.5:7070"));
        let one_address = kept("10.0.0.5:7070");
        assert!(one_address.belongs_to("http://10.0.0.5:7070"));
        assert!(!one_address.belongs_to("http://127.0.0.1:7070"));
        let unrecorded = KeptToken {
            token: "t".into(),
            listen: None,
        };
        assert!(!unrecorded.belongs_to("http://127.0.0.1:7070"));
    }

    /// The cases every implementation shares (the Python and TypeScript clients read them too).
    #[test]
    fn the_shared_vectors_are_answered_as_they_say() {
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../tests/vectors/kept_token.json"))
                .expect("the vectors are JSON");
        let cases = vectors["belongs"].as_array().expect("belongs");
        assert!(cases.len() > 20, "the vectors were read");
        for case in cases {
            let kept = KeptToken {
                token: "t".into(),
                listen: case["listen"]
                    .as_str()
                    .and_then(|listen| listen.parse().ok()),
            };
            let url = case["url"].as_str().expect("url");
            assert_eq!(kept.belongs_to(url), case["sends"] == true, "{case}");
        }
        for case in vectors["user_copy"].as_array().expect("user_copy") {
            let variable = |name: &str| case[name].as_str().map(std::ffi::OsString::from);
            let port = case["port"]
                .as_u64()
                .and_then(|port| u16::try_from(port).ok());
            let path = user_copy_path_under(
                port.expect("port"),
                variable("XDG_STATE_HOME"),
                variable("HOME"),
            );
            assert_eq!(
                path.as_deref().and_then(Path::to_str),
                case["path"].as_str(),
                "{case}"
            );
        }
    }

    /// The proof's constants live in `tollgate_server::admin_proof`; the clients' copies are
    /// held to the same vectors.
    #[test]
    fn the_shared_proof_vectors_are_answered_as_they_say() {
        use tollgate_server::admin_proof::{
            ADMIN_PROOF_LABEL, ADMIN_PROOF_NONCE_HEX_MAX, ADMIN_PROOF_NONCE_HEX_MIN, admin_proof,
        };
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../tests/vectors/kept_token.json"))
                .expect("the vectors are JSON");
        let proof = &vectors["proof"];
        assert_eq!(proof["path"], ADMIN_PROOF_PATH);
        assert_eq!(proof["nonce_parameter"], ADMIN_PROOF_NONCE);
        assert_eq!(proof["label"], ADMIN_PROOF_LABEL);
        assert_eq!(proof["nonce_hex_min"], ADMIN_PROOF_NONCE_HEX_MIN);
        assert_eq!(proof["nonce_hex_max"], ADMIN_PROOF_NONCE_HEX_MAX);
        let cases = proof["cases"].as_array().expect("cases");
        assert!(cases.len() >= 5, "the vectors were read");
        for case in cases {
            let text = |name: &str| case[name].as_str().expect(name).to_owned();
            let (token, listen, nonce) = (text("token"), text("listen"), text("nonce"));
            assert_eq!(
                admin_proof(&token, &listen, &nonce),
                text("proof"),
                "{case}"
            );
            let kept = KeptToken {
                token,
                listen: listen.parse().ok(),
            };
            assert!(kept.proved_by(&text("proof"), &nonce), "{case}");
            assert!(
                !kept.proved_by(&text("proof").replace('e', "f"), &nonce),
                "{case}"
            );
        }
        for case in vectors["connect"].as_array().expect("connect") {
            let kept = KeptToken {
                token: "t".into(),
                listen: case["listen"]
                    .as_str()
                    .and_then(|listen| listen.parse().ok()),
            };
            let url = case["url"].as_str().expect("url");
            assert_eq!(
                kept.base_for(url).as_deref(),
                case["base"].as_str(),
                "{case}"
            );
        }
    }

    #[test]
    fn a_clean_stop_withdraws_what_it_recorded_and_nothing_else() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("tollgate.db.admin-token");
        let made = read_or_make(&path).expect("made");
        let address: SocketAddr = "127.0.0.1:7070".parse().expect("address");
        record_listen(&path, &made, address).expect("kept");
        // Another server has since recorded itself: left alone.
        withdraw_listen(&path, &made, "127.0.0.1:7071".parse().expect("a")).expect("withdrawn");
        assert_eq!(
            read(&path).expect("read").expect("there").listen,
            Some(address)
        );
        withdraw_listen(&path, &made, address).expect("withdrawn");
        let left = read(&path).expect("read").expect("there");
        assert_eq!((left.token, left.listen), (made.token, None));
    }

    #[test]
    fn the_listen_line_is_recorded_and_read_back() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("tollgate.db.admin-token");
        let made = read_or_make(&path).expect("made");
        assert_eq!(made.listen, None);
        record_listen(&path, &made, "127.0.0.1:7070".parse().expect("address")).expect("kept");
        let read_back = read(&path).expect("read").expect("there");
        assert_eq!(read_back.token, made.token);
        assert_eq!(read_back.listen, Some("127.0.0.1:7070".parse().expect("a")));
        std::fs::write(&path, "token\nlisten nowhere\n").expect("write");
        let refused = read(&path).expect_err("bad line");
        assert!(refused.to_string().contains("listen nowhere"), "{refused}");
    }

    #[cfg(unix)]
    #[test]
    fn a_token_file_others_could_read_or_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("tollgate.db.admin-token");
        std::fs::write(&path, "planted\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let refused = read(&path).expect_err("too open");
        assert!(refused.to_string().contains("mode 666"), "{refused}");
        assert!(refused.to_string().contains("chmod 600"), "{refused}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(
            read(&path).expect("private").expect("there").token,
            "planted"
        );
    }
}
