//! TLS on the HTTP and gRPC listeners: the certificate and key from PEM files (`tls_cert`,
//! `tls_key`), checked at start, watched while the server runs and reloaded when either file
//! changes on disk (a renewal by a certificate manager); a new pair that cannot be read, or
//! whose key is not the certificate's, or whose key file group or others may read, is refused
//! loudly and the pair in force stays; at start, any of these stops the server. Both
//! listeners serve the same pair (one [`TlsFiles`]), with ring as rustls' crypto provider.
//!
//! What an accept loop calls: [`TlsAcceptor::accept`], which turns one accepted TCP stream into
//! a TLS stream within [`TLS_HANDSHAKE_TIMEOUT`]. Both listeners (`listener.rs`) call it in
//! each connection's task, apart from each other and under the connection cap and timeouts
//! they share, so a client that never finishes a handshake holds up nobody else.
//!
//! TLS is not authentication: a server beyond loopback needs a data token all the same.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

/// Longest a client may take over its handshake before its connection is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate and key files are looked at for a change.
pub const TLS_RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Largest certificate or key file read, in bytes: a chain is a few KiB.
pub const TLS_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// Why TLS could not be set up, naming the setting at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error(
        "{missing} is not set but {given} is: TLS needs both (PEM files: tls_cert the \
         certificate chain, tls_key its private key) or neither"
    )]
    Half {
        missing: &'static str,
        given: &'static str,
    },
    #[error("{setting} {path}: {reason}")]
    File {
        setting: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS: {0}")]
    Rustls(String),
}

/// What identifies a file's contents without reading them: a rename, a rewrite or a touch
/// changes it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    #[cfg(unix)]
    inode: u64,
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let metadata = std::fs::metadata(path).ok()?;
        Some(Stamp {
            modified: metadata.modified().ok(),
            len: metadata.len(),
            #[cfg(unix)]
            inode: std::os::unix::fs::MetadataExt::ino(&metadata),
        })
    }
}

/// The certificate and key files, and the pair of them in force.
#[derive(Debug)]
pub struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    in_force: RwLock<Arc<CertifiedKey>>,
    /// The files as last read (successfully or not): a failed pair is tried again only once
    /// either file changes, so it is reported once, not every check.
    seen: Mutex<(Option<Stamp>, Option<Stamp>)>,
}

/// Read a PEM file of at most `TLS_FILE_BYTES_MAX` bytes.
fn read_pem(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let fail = |reason: String| TlsError::File {
        setting,
        path: path.display().to_string(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|error| fail(error.to_string()))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, TLS_FILE_BYTES_MAX + 1),
        &mut bytes,
    )
    .map_err(|error| fail(error.to_string()))?;
    if bytes.len() as u64 > TLS_FILE_BYTES_MAX {
        return Err(fail(format!("larger than {TLS_FILE_BYTES_MAX} bytes")));
    }
    Ok(bytes)
}

impl TlsFiles {
    /// The pair `cert` and `key` name, read and checked now: `None` when neither is set, an
    /// error naming the one missing when only one is, or the file at fault.
    pub fn open(
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<Arc<TlsFiles>>, TlsError> {
        let (cert, key) = match (cert, key) {
            (None, None) => return Ok(None),
            (Some(_), None) => {
                return Err(TlsError::Half {
                    missing: "tls_key",
                    given: "tls_cert",
                });
            }
            (None, Some(_)) => {
                return Err(TlsError::Half {
                    missing: "tls_cert",
                    given: "tls_key",
                });
            }
            (Some(cert), Some(key)) => (cert.to_owned(), key.to_owned()),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let seen = (Stamp::of(&cert), Stamp::of(&key));
        let pair = load(&cert, &key, &provider)?;
        Ok(Some(Arc::new(TlsFiles {
            cert,
            key,
            provider,
            in_force: RwLock::new(Arc::new(pair)),
            seen: Mutex::new(seen),
        })))
    }

    fn current(&self) -> Arc<CertifiedKey> {
        match self.in_force.read() {
            Ok(pair) => pair.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reload the pair if either file changed since it was last read. Returns whether a new
    /// pair is in force.
    pub fn check(&self) -> bool {
        let now = (Stamp::of(&self.cert), Stamp::of(&self.key));
        {
            let mut seen = match self.seen.lock() {
                Ok(seen) => seen,
                Err(poisoned) => poisoned.into_inner(),
            };
            if *seen == now {
                return false;
            }
            *seen = now;
        }
        match load(&self.cert, &self.key, &self.provider) {
            Ok(pair) => {
                match self.in_force.write() {
                    Ok(mut slot) => *slot = Arc::new(pair),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(pair),
                }
                tracing::info!(
                    tls_cert = %self.cert.display(),
                    tls_key = %self.key.display(),
                    "TLS certificate reloaded"
                );
                true
            }
            Err(error) => {
                // A pair caught mid-renewal (one file written, not the other) lands here too,
                // and is tried again when the second file changes.
                tracing::error!(
                    %error,
                    "TLS certificate not reloaded: the certificate in force stays until \
                     tls_cert and tls_key are a valid pair"
                );
                false
            }
        }
    }

    /// Look at the files every `TLS_RELOAD_CHECK_INTERVAL` until `stop` turns true.
    pub fn spawn_watcher(self: &Arc<Self>, stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let files = self.clone();
        crate::spawn_every(TLS_RELOAD_CHECK_INTERVAL, stop, move || {
            // Reading two small files: off the runtime's threads all the same.
            let checking = files.clone();
            async move {
                let _ = tokio::task::spawn_blocking(move || checking.check()).await;
            }
        })
    }

    /// An acceptor serving this pair (the one in force at each handshake), offering the
    /// application protocols `alpn` (`h2` for gRPC, `http/1.1` for the HTTP API).
    pub fn acceptor(self: &Arc<Self>, alpn: &[&[u8]]) -> Result<TlsAcceptor, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Rustls(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        Ok(TlsAcceptor {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// Refuse a private key file that anyone but its owner may read or write: whoever reads it can
/// pass for this server, and whoever writes it can choose the key it serves.
fn check_key_mode(key: &Path) -> Result<(), TlsError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let metadata = std::fs::metadata(key).map_err(|error| TlsError::File {
            setting: "tls_key",
            path: key.display().to_string(),
            reason: error.to_string(),
        })?;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TlsError::File {
                setting: "tls_key",
                path: key.display().to_string(),
                reason: format!(
                    "the private key is open to group or others (mode {mode:04o}); make it \
                     readable by the server's user alone: chmod 600 {}",
                    key.display()
                ),
            });
        }
    }
    #[cfg(not(unix))]
    let _ = key;
    Ok(())
}

/// Read and check a pair: a certificate chain, a private key (readable by its owner alone),
/// and the key the certificate's.
fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let cert_error = |reason: String| TlsError::File {
        setting: "tls_cert",
        path: cert.display().to_string(),
        reason,
    };
    let key_error = |reason: String| TlsError::File {
        setting: "tls_key",
        path: key.display().to_string(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(&read_pem("tls_cert", cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| cert_error(format!("not a PEM certificate chain: {error}")))?;
    if chain.is_empty() {
        return Err(cert_error(
            "holds no certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    check_key_mode(key)?;
    let private = PrivateKeyDer::from_pem_slice(&read_pem("tls_key", key)?)
        .map_err(|error| key_error(format!("not a PEM private key: {error}")))?;
    CertifiedKey::from_der(chain, private, provider).map_err(|error| {
        key_error(format!(
            "not a key for the certificate in tls_cert {}: {error}",
            cert.display()
        ))
    })
}

/// Hands every handshake the pair in force.
#[derive(Debug)]
struct Resolver(Arc<TlsFiles>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// Turns accepted TCP streams into TLS streams.
#[derive(Clone)]
pub struct TlsAcceptor {
    inner: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor").finish_non_exhaustive()
    }
}

impl TlsAcceptor {
    /// The handshake on `stream`, within `TLS_HANDSHAKE_TIMEOUT`.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, self.inner.accept(stream)).await {
            Ok(accepted) => accepted,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no TLS handshake within {TLS_HANDSHAKE_TIMEOUT:?}"),
            )),
        }
    }
}
