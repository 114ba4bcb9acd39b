//! The listeners, which own every connection, the HTTP API's and Envoy's gRPC service's alike:
//! they accept them, cap how many are open over both listeners together, close those that send
//! too slowly or sit idle, and stop them gracefully.
//!
//! Each connection is in one phase: reading a request's **head** (from the accept, through the
//! TLS handshake and, for gRPC, HTTP/2's preface; on HTTP/1, again from a request's first byte
//! on a kept-alive connection), reading a request's **body**, **busy** (a handler runs, e.g.
//! an acquire that waits), or **idle** between requests. An HTTP/2 connection carries many
//! requests at once: it is busy while any handler runs, else reading while any body is
//! half-sent, else idle. A head or a body must arrive within `header_read_timeout`, an idle
//! connection is closed after `idle_timeout` (an idle HTTP/2 one with a GOAWAY first); a busy one
//! is never cut (its handler is bounded by `wait_ms_max`, or for gRPC by the store's timeout).
//! Frames on an idle HTTP/2 connection (pings, window updates) start nothing, so they keep no
//! connection open. At `connections_max`, over both listeners, a new connection on either
//! closes the one that has been idle or half-sent the longest, so that sockets which connect
//! and hold can never keep a real request (a `/healthz` probe, Envoy's next call) out; only
//! when every connection is busy is the new one refused. `connections_max` is lowered to what
//! the open-file limit leaves after a reserve for everything else the process holds.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

use crate::tls::TlsAcceptor;
use tokio::time::Instant;
use tower_service::Service;

/// File descriptors kept for everything but connections (the store's and databases'
/// connections, the listening sockets, logs), at least; an eighth of the limit above 512.
const FILES_RESERVED_MIN: u64 = 64;
/// After a failed accept (out of descriptors), how long before the next.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(10);
/// How often a full listener may log that it refused a connection.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Timeouts are checked this often at least, and at most every quarter of the shorter one.
const SWEEP_INTERVAL_MAX: Duration = Duration::from_secs(1);
const SWEEP_INTERVAL_MIN: Duration = Duration::from_millis(10);
/// An idle HTTP/2 connection told to go (GOAWAY) is dropped if it has not gone after this.
const GOAWAY_GRACE: Duration = Duration::from_secs(1);
/// HTTP/2's connection preface (`PRI * HTTP/2.0...`): once a client has sent this many bytes,
/// its connection is no longer in its head.
const HTTP2_PREFACE_BYTES: u64 = 24;

/// What the listeners enforce.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// Over both listeners; already lowered to what the open-file limit leaves
    /// (`connections_max`).
    pub(crate) connections_max: usize,
}

/// What a listener speaks.
#[derive(Clone)]
pub(crate) enum Protocol {
    /// The HTTP API, over HTTP/1.1.
    Http1(Router),
    /// Envoy's rate limit service: gRPC, over HTTP/2 alone.
    Grpc(Router),
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

/// A connection's phase and the requests in it (one at a time on HTTP/1, any number on
/// HTTP/2).
#[derive(Debug)]
struct State {
    phase: Phase,
    /// Requests whose body has yet to arrive whole, and since when one has been.
    reading: usize,
    reading_since: Instant,
    /// Requests whose handler runs.
    busy: usize,
}

impl State {
    /// The phase the requests in flight make.
    fn settle(&mut self) {
        if self.phase == Phase::Closing {
            return;
        }
        self.phase = if self.busy > 0 {
            Phase::Busy
        } else if self.reading > 0 {
            Phase::Body {
                since: self.reading_since,
            }
        } else {
            Phase::Idle {
                since: Instant::now(),
            }
        };
    }
}

/// One connection's state, shared by its task, its I/O, its requests and the sweeper.
#[derive(Debug)]
struct Connection {
    state: Mutex<State>,
    close: Notify,
    /// Closed for having been idle: an HTTP/2 connection is told so first (GOAWAY).
    idle_out: AtomicBool,
    /// HTTP/1: bytes on an idle connection start a request's head. HTTP/2: bytes read so far,
    /// until the preface is in.
    http1: bool,
    read: AtomicU64,
}

impl Connection {
    fn new(http1: bool) -> Connection {
        let now = Instant::now();
        Connection {
            state: Mutex::new(State {
                phase: Phase::Head { since: now },
                reading: 0,
                reading_since: now,
                busy: 0,
            }),
            close: Notify::new(),
            idle_out: AtomicBool::new(false),
            http1,
            read: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn phase(&self) -> Phase {
        self.lock().phase
    }

    /// Close it (its task drops the socket on its next poll), and never pick it again.
    fn close(&self) {
        self.lock().phase = Phase::Closing;
        self.close.notify_one();
    }

    /// Bytes arrived: on HTTP/1 an idle connection starts a request's head; on HTTP/2 the
    /// preface, once in, ends the head.
    fn received(&self, bytes: usize) {
        if self.http1 {
            let mut state = self.lock();
            if matches!(state.phase, Phase::Idle { .. }) {
                state.phase = Phase::Head {
                    since: Instant::now(),
                };
            }
            return;
        }
        let before = self.read.load(Ordering::Relaxed);
        if before >= HTTP2_PREFACE_BYTES {
            return;
        }
        let after = before.saturating_add(bytes as u64);
        self.read.store(after, Ordering::Relaxed);
        if after >= HTTP2_PREFACE_BYTES {
            let mut state = self.lock();
            if matches!(state.phase, Phase::Head { .. }) {
                state.settle();
            }
        }
    }

    /// A request's head has arrived: it reads its body, or with none its handler runs.
    fn request_started(&self, body_whole: bool) {
        let mut state = self.lock();
        if body_whole {
            state.busy += 1;
        } else {
            if state.reading == 0 {
                state.reading_since = Instant::now();
            }
            state.reading += 1;
        }
        state.settle();
    }

    /// A request's body has arrived whole: its handler runs.
    fn body_read(&self) {
        let mut state = self.lock();
        state.reading = state.reading.saturating_sub(1);
        state.busy += 1;
        state.settle();
    }

    /// A request is answered (or given up), its body read whole or not.
    fn request_ended(&self, body_whole: bool) {
        let mut state = self.lock();
        if body_whole {
            state.busy = state.busy.saturating_sub(1);
        } else {
            state.reading = state.reading.saturating_sub(1);
        }
        state.settle();
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

/// One request's place in its connection's counts, given back however the request ends.
struct InFlight {
    connection: Arc<Connection>,
    body_whole: AtomicBool,
}

impl InFlight {
    fn start(connection: Arc<Connection>, body_whole: bool) -> Arc<InFlight> {
        connection.request_started(body_whole);
        Arc::new(InFlight {
            connection,
            body_whole: AtomicBool::new(body_whole),
        })
    }

    fn body_read(&self) {
        if !self.body_whole.swap(true, Ordering::AcqRel) {
            self.connection.body_read();
        }
    }
}

/// Ends the request in its connection's counts when the handler's future ends or is dropped.
struct Answered(Arc<InFlight>);

impl Drop for Answered {
    fn drop(&mut self) {
        let whole = self.0.body_whole.load(Ordering::Acquire);
        self.0.connection.request_ended(whole);
    }
}

/// Every open connection, over every listener: the one budget of connections.
#[derive(Debug)]
pub(crate) struct Registry {
    connections: Mutex<HashMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    bounds: Bounds,
}

impl Registry {
    pub(crate) fn new(bounds: Bounds) -> Arc<Registry> {
        Arc::new(Registry {
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            bounds,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, connection: Arc<Connection>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, connection);
        id
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
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
    fn sweep(&self) {
        let now = Instant::now();
        for connection in self.lock().values() {
            let phase = connection.phase();
            if connection
                .deadline(&self.bounds)
                .is_some_and(|deadline| deadline <= now)
            {
                if matches!(phase, Phase::Idle { .. }) {
                    connection.idle_out.store(true, Ordering::Relaxed);
                }
                connection.close();
            }
        }
    }

    /// Check the timeouts until `stop` turns true.
    pub(crate) fn spawn_sweeper(
        self: &Arc<Self>,
        mut stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let registry = self.clone();
        let bounds = self.bounds;
        let every = (bounds.header_read_timeout.min(bounds.idle_timeout) / 4)
            .clamp(SWEEP_INTERVAL_MIN, SWEEP_INTERVAL_MAX);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => registry.sweep(),
                    _ = stop.wait_for(|stop| *stop) => return,
                }
            }
        })
    }
}

/// Serve `protocol` on `listener`, its connections counted in `registry` (shared with the other
/// listener), until `shutdown` resolves; then stop accepting, let every connection of this
/// listener finish the request it is in (idle ones close at once), and return once none is
/// left. The caller bounds that wait (`shutdown_grace`). The registry's sweeper must run
/// meanwhile (`Registry::spawn_sweeper`), which keeps checking the timeouts while this drains.
pub(crate) async fn serve(
    listener: TcpListener,
    protocol: Protocol,
    registry: Arc<Registry>,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let bounds = registry.bounds;
    let (stop_sender, stop) = watch::channel(false);
    // This listener's connections, which a graceful stop waits on.
    let open = Arc::new(watch::Sender::new(0usize));
    tokio::pin!(shutdown);
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
        // Answers are small and many are in flight: Nagle's algorithm would hold them back.
        let _ = stream.set_nodelay(true);
        let connection = Arc::new(Connection::new(matches!(protocol, Protocol::Http1(_))));
        let id = registry.insert(connection.clone());
        open.send_modify(|open| *open += 1);
        tokio::spawn(run_connection(
            stream,
            peer,
            tls.clone(),
            protocol.clone(),
            Remove {
                registry: registry.clone(),
                open: open.clone(),
                id,
            },
            connection,
            stop.clone(),
        ));
    }
    drop(listener);
    let _ = stop_sender.send(true);
    let mut open = open.subscribe();
    let _ = open.wait_for(|open| *open == 0).await;
    Ok(())
}

/// Takes a connection out of the registry and its listener's count however its task ends.
struct Remove {
    registry: Arc<Registry>,
    open: Arc<watch::Sender<usize>>,
    id: u64,
}

impl Drop for Remove {
    fn drop(&mut self) {
        self.registry.remove(self.id);
        self.open.send_modify(|open| *open = open.saturating_sub(1));
    }
}

async fn run_connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    protocol: Protocol,
    remove: Remove,
    connection: Arc<Connection>,
    stop: watch::Receiver<bool>,
) {
    let Some(tls) = tls else {
        return serve_connection(stream, peer, protocol, remove, connection, stop).await;
    };
    // The handshake is part of the head's phase: a client that stalls in it is closed like one
    // that stalls in its head, and at the cap it is among the first to make room.
    let handshake = tokio::select! {
        handshake = tls.accept(stream) => handshake,
        () = connection.close.notified() => return,
    };
    match handshake {
        Ok(stream) => serve_connection(stream, peer, protocol, remove, connection, stop).await,
        Err(error) => tracing::debug!(%error, "TLS handshake failed"),
    }
}

/// The service of one connection: each request counted in the connection's phase, its body
/// watched until it arrives whole, and the peer's address told to the handlers.
fn counted(
    router: Router,
    peer: SocketAddr,
    connection: Arc<Connection>,
) -> impl hyper::service::Service<
    hyper::Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>>
             + Send
             + 'static,
> + Clone {
    hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let mut router = router.clone();
        let in_flight = InFlight::start(connection.clone(), request.body().is_end_stream());
        let answered = Answered(in_flight.clone());
        async move {
            let mut request = request.map(|body| {
                axum::body::Body::new(BodyRead {
                    inner: body,
                    in_flight,
                })
            });
            // Who is at the other end of the socket, for `/v1/forward-auth`.
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let response = router.call(request).await;
            drop(answered);
            response
        }
    })
}

async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    protocol: Protocol,
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
    match protocol {
        Protocol::Http1(router) => {
            // No timer: hyper's own header timeout would also cut idle keep-alive connections
            // at the head's bound; the phases above keep the two apart.
            let serving = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(io, counted(router, peer, connection.clone()));
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
        Protocol::Grpc(router) => {
            let serving = http2::Builder::new(TokioExecutor::new())
                .serve_connection(io, counted(router, peer, connection.clone()));
            tokio::pin!(serving);
            let mut stopping = false;
            // Set once the connection is told to go: dropped if still there then.
            let mut going: Option<Instant> = None;
            loop {
                let grace = async {
                    match going {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    served = serving.as_mut() => {
                        if let Err(error) = served {
                            tracing::debug!(%error, "gRPC connection ended with an error");
                        }
                        return;
                    }
                    () = connection.close.notified() => {
                        // Idle: a GOAWAY lets the client open another connection before its
                        // next call rather than send it into a closing one. Anything else (a
                        // stalled head, eviction at the cap) is dropped at once.
                        if going.is_some() || !connection.idle_out.load(Ordering::Relaxed) {
                            return;
                        }
                        serving.as_mut().graceful_shutdown();
                        going = Some(Instant::now() + GOAWAY_GRACE);
                    }
                    () = grace => return,
                    _ = stop.wait_for(|stop| *stop), if !stopping => {
                        stopping = true;
                        serving.as_mut().graceful_shutdown();
                    }
                }
            }
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
        let read = buf.filled().len().saturating_sub(before);
        if matches!(polled, Poll::Ready(Ok(()))) && read > 0 {
            self.connection.received(read);
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
    in_flight: Arc<InFlight>,
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
            self.in_flight.body_read();
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

    fn connection(phase: Phase, http1: bool) -> Arc<Connection> {
        let connection = Connection::new(http1);
        connection.lock().phase = phase;
        Arc::new(connection)
    }

    async fn closed(connection: &Connection) -> bool {
        tokio::time::timeout(Duration::from_millis(1), connection.close.notified())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_or_half_sent_connection_goes_first_and_busy_ones_never() {
        let registry = Registry::new(bounds());
        let start = Instant::now();
        let busy = connection(Phase::Busy, true);
        let idle = connection(Phase::Idle { since: start }, false);
        let head = connection(
            Phase::Head {
                since: start + Duration::from_secs(1),
            },
            true,
        );
        registry.insert(busy.clone());
        let head_id = registry.insert(head.clone());
        let idle_id = registry.insert(idle.clone());
        assert!(registry.evict_oldest());
        assert!(closed(&idle).await && !closed(&head).await && !closed(&busy).await);
        registry.remove(idle_id);
        assert!(registry.evict_oldest());
        assert!(closed(&head).await);
        registry.remove(head_id);
        assert!(
            !registry.evict_oldest(),
            "a busy connection is never closed"
        );
        assert!(!closed(&busy).await);
    }

    #[tokio::test(start_paused = true)]
    async fn heads_and_bodies_get_the_read_timeout_and_idle_ones_the_idle_timeout() {
        let registry = Registry::new(bounds());
        let start = Instant::now();
        let head = connection(Phase::Head { since: start }, false);
        let body = connection(Phase::Body { since: start }, true);
        let idle = connection(Phase::Idle { since: start }, false);
        let busy = connection(Phase::Busy, true);
        for connection in [&head, &body, &idle, &busy] {
            registry.insert(Arc::clone(connection));
        }
        tokio::time::advance(Duration::from_secs(9)).await;
        registry.sweep();
        assert!(!closed(&head).await && !closed(&body).await && !closed(&idle).await);
        tokio::time::advance(Duration::from_secs(2)).await;
        registry.sweep();
        assert!(closed(&head).await && closed(&body).await && !closed(&idle).await);
        assert!(!head.idle_out.load(Ordering::Relaxed));
        tokio::time::advance(Duration::from_secs(110)).await;
        registry.sweep();
        assert!(closed(&idle).await && !closed(&busy).await);
        assert!(
            idle.idle_out.load(Ordering::Relaxed),
            "told to go, not dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_start_a_head_only_on_an_idle_connection_and_a_whole_body_makes_it_busy() {
        let idle = connection(
            Phase::Idle {
                since: Instant::now(),
            },
            true,
        );
        idle.received(10);
        assert!(matches!(idle.phase(), Phase::Head { .. }));
        let http1 = Arc::new(Connection::new(true));
        let request = InFlight::start(http1.clone(), false);
        assert!(matches!(http1.phase(), Phase::Body { .. }));
        http1.received(10);
        assert!(matches!(http1.phase(), Phase::Body { .. }));
        request.body_read();
        request.body_read();
        assert_eq!(http1.phase(), Phase::Busy);
        drop(Answered(request));
        assert!(matches!(http1.phase(), Phase::Idle { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_leaves_its_head_with_the_preface_and_is_busy_while_any_request_runs()
     {
        let http2 = Arc::new(Connection::new(false));
        http2.received(10);
        assert!(
            matches!(http2.phase(), Phase::Head { .. }),
            "half a preface"
        );
        http2.received(20);
        assert!(matches!(http2.phase(), Phase::Idle { .. }));
        // Frames on an idle connection start nothing.
        http2.received(9);
        assert!(matches!(http2.phase(), Phase::Idle { .. }));
        let started = Instant::now();
        let stalled = InFlight::start(http2.clone(), false);
        assert_eq!(http2.phase(), Phase::Body { since: started });
        tokio::time::advance(Duration::from_secs(1)).await;
        let running = InFlight::start(http2.clone(), true);
        assert_eq!(http2.phase(), Phase::Busy);
        drop(Answered(running));
        // Back to the oldest half-sent body: its time keeps running.
        assert_eq!(http2.phase(), Phase::Body { since: started });
        drop(Answered(stalled));
        assert!(matches!(http2.phase(), Phase::Idle { .. }));
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
