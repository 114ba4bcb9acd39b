//! The HTTP listener, which owns every connection: it accepts them, caps how many are open,
//! closes those that send too slowly or sit idle, and stops them gracefully.
//!
//! Each connection is in one phase: reading a request's **head** (from its first byte, or from
//! the accept), reading its **body**, **busy** (a handler runs, e.g. an acquire that waits), or
//! **idle** between requests. A head or a body must arrive within `header_read_timeout`, an
//! idle connection is closed after `idle_timeout`; a busy one is never cut (its handler is
//! bounded by `wait_ms_max`). At `connections_max`, a new connection closes the one that has
//! been idle or half-sent the longest, so that sockets which send half a request and hold can
//! never keep a real request (a `/healthz` probe) out; only when every connection is busy is
//! the new one refused. `connections_max` is lowered to what the open-file limit leaves.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

use crate::tls::TlsAcceptor;
use tokio::time::Instant;
use tower_service::Service;

/// File descriptors kept for everything but HTTP connections (the store's and databases'
/// connections, the gRPC listener's, logs), at least; an eighth of the limit above 512.
const FILES_RESERVED_MIN: u64 = 64;
/// After a failed accept (out of descriptors), how long before the next.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(10);
/// How often a full listener may log that it refused a connection.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Timeouts are checked this often at least, and at most every quarter of the shorter one.
const SWEEP_INTERVAL_MAX: Duration = Duration::from_secs(1);
const SWEEP_INTERVAL_MIN: Duration = Duration::from_millis(10);

/// What the listener enforces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// Already lowered to what the open-file limit leaves (`connections_max`).
    pub(crate) connections_max: usize,
}

/// The process's open-file limit (RLIMIT_NOFILE, soft), if it has one.
fn open_files_max() -> Option<u64> {
    #[cfg(unix)]
    {
        rustix::process::getrlimit(rustix::process::Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// `configured`, lowered to what the open-file limit leaves after a reserve for the other
/// descriptors the server holds; and that limit, when it lowered it.
pub(crate) fn connections_max(configured: usize) -> (usize, Option<u64>) {
    let Some(files) = open_files_max() else {
        return (configured, None);
    };
    let reserved = FILES_RESERVED_MIN.max(files / 8);
    let room = usize::try_from(files.saturating_sub(reserved))
        .unwrap_or(usize::MAX)
        .max(1);
    if room < configured {
        (room, Some(files))
    } else {
        (configured, None)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Head {
        since: Instant,
    },
    Body {
        since: Instant,
    },
    Busy,
    Idle {
        since: Instant,
    },
    /// Told to close; its task has yet to run.
    Closing,
}

/// One connection's state, shared by its task, its I/O, its requests and the sweeper.
#[derive(Debug)]
struct Connection {
    phase: Mutex<Phase>,
    close: Notify,
}

impl Connection {
    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner) = phase;
    }

    /// Close it (its task drops the socket on its next poll), and never pick it again.
    fn close(&self) {
        self.set(Phase::Closing);
        self.close.notify_one();
    }

    /// Bytes arrived: an idle connection starts a request's head.
    fn received(&self) {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*phase, Phase::Idle { .. }) {
            *phase = Phase::Head {
                since: Instant::now(),
            };
        }
    }

    /// The request's body has arrived whole.
    fn body_read(&self) {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*phase, Phase::Body { .. }) {
            *phase = Phase::Busy;
        }
    }

    /// Since when the connection is idle or half-sent; `None` while a handler runs.
    fn waiting_since(&self) -> Option<Instant> {
        match self.phase() {
            Phase::Head { since } | Phase::Body { since } | Phase::Idle { since } => Some(since),
            Phase::Busy | Phase::Closing => None,
        }
    }

    fn deadline(&self, bounds: &Bounds) -> Option<Instant> {
        match self.phase() {
            Phase::Head { since } | Phase::Body { since } => {
                Some(since + bounds.header_read_timeout)
            }
            Phase::Idle { since } => Some(since + bounds.idle_timeout),
            Phase::Busy | Phase::Closing => None,
        }
    }
}

/// Every open connection, and how many there are (which a graceful stop waits on).
#[derive(Debug)]
struct Registry {
    connections: Mutex<HashMap<u64, Arc<Connection>>>,
    open: watch::Sender<usize>,
}

impl Registry {
    fn new() -> Registry {
        Registry {
            connections: Mutex::new(HashMap::new()),
            open: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, id: u64, connection: Arc<Connection>) {
        let mut connections = self.lock();
        connections.insert(id, connection);
        self.open.send_replace(connections.len());
    }

    fn remove(&self, id: u64) {
        let mut connections = self.lock();
        connections.remove(&id);
        self.open.send_replace(connections.len());
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Close the connection idle or half-sent the longest; false if every one is busy.
    fn evict_oldest(&self) -> bool {
        let connections = self.lock();
        let oldest = connections
            .values()
            .filter_map(|connection| Some((connection.waiting_since()?, connection)))
            .min_by_key(|(since, _)| *since);
        match oldest {
            Some((_, connection)) => {
                connection.close();
                true
            }
            None => false,
        }
    }

    /// Close every connection whose head, body or idle time ran out.
    fn sweep(&self, bounds: &Bounds) {
        let now = Instant::now();
        for connection in self.lock().values() {
            if connection
                .deadline(bounds)
                .is_some_and(|deadline| deadline <= now)
            {
                connection.close();
            }
        }
    }
}

/// Serve `router` on `listener` within `bounds` until `shutdown` resolves; then stop
/// accepting, let every connection finish the request it is in (idle ones close at once), and
/// return once none is left. The caller bounds that wait (`shutdown_grace`).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let registry = Arc::new(Registry::new());
    let (stop_sender, stop) = watch::channel(false);
    let sweeper = tokio::spawn(sweep(registry.clone(), bounds, stop.clone()));
    tokio::pin!(shutdown);
    let mut next_id = 0u64;
    let mut refusals = Refusals::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, most likely: make room, and try again shortly rather
                // than spin.
                registry.evict_oldest();
                refusals.note(|| tracing::warn!(%error, "accepting a connection failed"));
                tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                continue;
            }
        };
        if registry.len() >= bounds.connections_max && !registry.evict_oldest() {
            refusals.note(|| {
                tracing::warn!(
                    connections_max = bounds.connections_max,
                    "every connection is busy: refusing a new one (connections_max)"
                );
            });
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let connection = Arc::new(Connection {
            phase: Mutex::new(Phase::Head {
                since: Instant::now(),
            }),
            close: Notify::new(),
        });
        next_id += 1;
        registry.insert(next_id, connection.clone());
        tokio::spawn(run_connection(
            stream,
            peer,
            tls.clone(),
            router.clone(),
            Remove {
                registry: registry.clone(),
                id: next_id,
            },
            connection,
            stop.clone(),
        ));
    }
    drop(listener);
    let _ = stop_sender.send(true);
    let mut open = registry.open.subscribe();
    let _ = open.wait_for(|open| *open == 0).await;
    sweeper.abort();
    Ok(())
}

/// Takes a connection out of the registry however its task ends.
struct Remove {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Remove {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

async fn run_connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    router: Router,
    remove: Remove,
    connection: Arc<Connection>,
    stop: watch::Receiver<bool>,
) {
    let Some(tls) = tls else {
        return serve_connection(stream, peer, router, remove, connection, stop).await;
    };
    // The handshake is part of the head's phase: a client that stalls in it is closed like one
    // that stalls in its head, and at the cap it is among the first to make room.
    let handshake = tokio::select! {
        handshake = tls.accept(stream) => handshake,
        () = connection.close.notified() => return,
    };
    match handshake {
        Ok(stream) => serve_connection(stream, peer, router, remove, connection, stop).await,
        Err(error) => tracing::debug!(%error, "TLS handshake failed"),
    }
}

async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    router: Router,
    _remove: Remove,
    connection: Arc<Connection>,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(Tracked {
        stream,
        connection: connection.clone(),
    });
    let service = {
        let connection = connection.clone();
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let mut router = router.clone();
            let connection = connection.clone();
            async move {
                connection.set(if request.body().is_end_stream() {
                    Phase::Busy
                } else {
                    Phase::Body {
                        since: Instant::now(),
                    }
                });
                let mut request = request.map(|body| {
                    axum::body::Body::new(BodyRead {
                        inner: body,
                        connection: connection.clone(),
                    })
                });
                // Who is at the other end of the socket, for `/v1/forward-auth`.
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                let response = router.call(request).await;
                connection.set(Phase::Idle {
                    since: Instant::now(),
                });
                response
            }
        })
    };
    // No timer: hyper's own header timeout would also cut idle keep-alive connections at the
    // head's bound; the phases above keep the two apart.
    let serving = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, service);
    tokio::pin!(serving);
    let mut stopping = false;
    loop {
        tokio::select! {
            served = serving.as_mut() => {
                if let Err(error) = served {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = connection.close.notified() => return,
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                serving.as_mut().graceful_shutdown();
            }
        }
    }
}

async fn sweep(registry: Arc<Registry>, bounds: Bounds, mut stop: watch::Receiver<bool>) {
    let every = (bounds.header_read_timeout.min(bounds.idle_timeout) / 4)
        .clamp(SWEEP_INTERVAL_MIN, SWEEP_INTERVAL_MAX);
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        registry.sweep(&bounds);
        // Draining goes on until the last connection is gone: still close the slow ones.
        if *stop.borrow_and_update() && registry.len() == 0 {
            return;
        }
    }
}

/// Rate-limits a log line that a flood would repeat.
#[derive(Default)]
struct Refusals {
    logged_at: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, log: impl FnOnce()) {
        let now = Instant::now();
        if self
            .logged_at
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_LOG_INTERVAL)
        {
            self.logged_at = Some(now);
            log();
        }
    }
}

/// A connection's socket (plain or TLS), telling its phase when bytes arrive.
struct Tracked<S> {
    stream: S,
    connection: Arc<Connection>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.connection.received();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A request's body, telling its connection when it has arrived whole.
struct BodyRead {
    inner: Incoming,
    connection: Arc<Connection>,
}

impl Body for BodyRead {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.connection.body_read();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            connections_max: 4,
        }
    }

    fn connection(phase: Phase) -> Arc<Connection> {
        Arc::new(Connection {
            phase: Mutex::new(phase),
            close: Notify::new(),
        })
    }

    async fn closed(connection: &Connection) -> bool {
        tokio::time::timeout(Duration::from_millis(1), connection.close.notified())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_or_half_sent_connection_goes_first_and_busy_ones_never() {
        let registry = Registry::new();
        let start = Instant::now();
        let busy = connection(Phase::Busy);
        let idle = connection(Phase::Idle { since: start });
        let head = connection(Phase::Head {
            since: start + Duration::from_secs(1),
        });
        registry.insert(1, busy.clone());
        registry.insert(2, head.clone());
        registry.insert(3, idle.clone());
        assert!(registry.evict_oldest());
        assert!(closed(&idle).await && !closed(&head).await && !closed(&busy).await);
        registry.remove(3);
        assert!(registry.evict_oldest());
        assert!(closed(&head).await);
        registry.remove(2);
        assert!(
            !registry.evict_oldest(),
            "a busy connection is never closed"
        );
        assert!(!closed(&busy).await);
    }

    #[tokio::test(start_paused = true)]
    async fn heads_and_bodies_get_the_read_timeout_and_idle_ones_the_idle_timeout() {
        let registry = Registry::new();
        let start = Instant::now();
        let head = connection(Phase::Head { since: start });
        let body = connection(Phase::Body { since: start });
        let idle = connection(Phase::Idle { since: start });
        let busy = connection(Phase::Busy);
        for (id, connection) in [&head, &body, &idle, &busy].into_iter().enumerate() {
            registry.insert(id as u64, Arc::clone(connection));
        }
        tokio::time::advance(Duration::from_secs(9)).await;
        registry.sweep(&bounds());
        assert!(!closed(&head).await && !closed(&body).await && !closed(&idle).await);
        tokio::time::advance(Duration::from_secs(2)).await;
        registry.sweep(&bounds());
        assert!(closed(&head).await && closed(&body).await && !closed(&idle).await);
        tokio::time::advance(Duration::from_secs(110)).await;
        registry.sweep(&bounds());
        assert!(closed(&idle).await && !closed(&busy).await);
    }

    #[test]
    fn bytes_start_a_head_only_on_an_idle_connection_and_a_whole_body_makes_it_busy() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let idle = connection(Phase::Idle {
                since: Instant::now(),
            });
            idle.received();
            assert!(matches!(idle.phase(), Phase::Head { .. }));
            let body = connection(Phase::Body {
                since: Instant::now(),
            });
            body.received();
            assert!(matches!(body.phase(), Phase::Body { .. }));
            body.body_read();
            assert_eq!(body.phase(), Phase::Busy);
        });
    }

    #[test]
    fn the_cap_leaves_room_under_the_open_file_limit() {
        let (cap, lowered) = connections_max(usize::MAX);
        if let Some(files) = open_files_max() {
            assert_eq!(lowered, Some(files));
            assert!((cap as u64) < files);
            assert!(files - cap as u64 >= FILES_RESERVED_MIN.min(files - 1));
        }
        assert_eq!(connections_max(1).0, 1);
    }
}
