//! TLS on the HTTP and gRPC listeners: the certificate and key from PEM files (`tls_cert`,
//! `tls_key`), checked at start, watched while the server runs and reloaded when either file
//! changes on disk (a renewal by a certificate manager); a new pair that cannot be read, or
//! whose key is not the certificate's, is refused loudly and the pair in force stays. Both
//! listeners serve the same pair (one [`TlsFiles`]), with ring as rustls' crypto provider.
//!
//! What an accept loop calls: [`TlsAcceptor::accept`], which turns one accepted TCP stream into
//! a TLS stream within [`TLS_HANDSHAKE_TIMEOUT`]. The HTTP listener (`listener.rs`) calls it
//! in each connection's task, under its connection cap and timeouts; for the gRPC listener,
//! [`spawn_accepting`] completes handshakes apart from each other (at most
//! [`TLS_HANDSHAKES_MAX`] at once, so a client that never finishes one holds up nobody else),
//! feeding tonic (`tollgate_envoy::serve_connections`).
//!
//! TLS is not authentication: a server beyond loopback needs a data token all the same.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

/// Longest a client may take over its handshake before its connection is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once per listener; further connections wait in the kernel's
/// backlog until one ends.
pub const TLS_HANDSHAKES_MAX: usize = 256;
/// How often the certificate and key files are looked at for a change.
pub const TLS_RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Largest certificate or key file read, in bytes: a chain is a few KiB.
pub const TLS_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Finished handshakes waiting for the server to take them.
const ACCEPTED_QUEUE: usize = 64;

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

/// Read and check a pair: a certificate chain, a private key, and the key the certificate's.
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

/// Accept on `listener`, each handshake in a task of its own (at most `TLS_HANDSHAKES_MAX` at
/// once), and hand over the TLS streams that complete, until `stop` turns true.
pub fn spawn_accepting(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    mut stop: watch::Receiver<bool>,
) -> mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)> {
    let (sender, receiver) = mpsc::channel(ACCEPTED_QUEUE);
    let handshakes = Arc::new(Semaphore::new(TLS_HANDSHAKES_MAX));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = handshakes.clone().acquire_owned().await else {
                break;
            };
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors, say: pause rather than spin.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = async {
                    let _ = stop.wait_for(|stop| *stop).await;
                } => break,
            };
            // Answers are small and many are in flight: Nagle's algorithm would hold them back.
            let _ = stream.set_nodelay(true);
            let acceptor = acceptor.clone();
            let sender = sender.clone();
            tokio::spawn(async move {
                let accepted = acceptor.accept(stream).await;
                drop(permit);
                match accepted {
                    Ok(tls) => {
                        let _ = sender.send((tls, peer)).await;
                    }
                    Err(error) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                }
            });
        }
    });
    receiver
}
