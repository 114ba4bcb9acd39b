//! Serving a throttled service one connection at a time: the make-service that hands each
//! connection its own [`Throttle`], which knows the connection's peer.
//!
//! Under [`Identity::Peer`](crate::Identity::Peer) the layer needs the client's address. axum's
//! `into_make_service_with_connect_info` carries it in every request's extensions: a map
//! allocated, filled and freed per request, about as much work as the whole decision. A
//! throttle made for its connection holds the peer itself, so its requests carry nothing and
//! the layer looks nothing up. The peer is a [`PeerAddr`]: the connection's key, written once,
//! and its handles on that key.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::task::{Context, Poll};

use axum::serve::{IncomingStream, Listener};
use tower_service::Service;

use crate::PeerAddr;
use crate::layer::Throttle;

impl<S: Clone> Throttle<S> {
    /// This service for one connection from `peer`: its requests are counted under that peer
    /// (for rules counted per user under [`Identity::Peer`](crate::Identity::Peer)), with no
    /// connection info to look up. For a server with its own accept loop; `axum::serve` takes
    /// [`Throttle::into_make_service_with_peer`].
    pub fn for_connection(&self, peer: SocketAddr) -> Throttle<S> {
        self.with_peer(PeerAddr::new(peer))
    }

    /// A make-service for `axum::serve` that gives each connection [`Throttle::for_connection`].
    /// Put the layer around the whole router (`layer.layer(router)`) to serve it this way;
    /// handlers that read `ConnectInfo` themselves still need
    /// `into_make_service_with_connect_info`, which the layer reads too.
    pub fn into_make_service_with_peer(self) -> IntoMakeServiceWithPeer<S> {
        IntoMakeServiceWithPeer { throttle: self }
    }
}

/// Makes a [`Throttle`] for each connection a listener accepts, holding its peer (see
/// [`Throttle::into_make_service_with_peer`]).
#[derive(Clone, Debug)]
pub struct IntoMakeServiceWithPeer<S> {
    throttle: Throttle<S>,
}

impl<L, S> Service<IncomingStream<'_, L>> for IntoMakeServiceWithPeer<S>
where
    L: Listener<Addr = SocketAddr>,
    S: Clone,
{
    type Response = Throttle<S>;
    type Error = Infallible;
    type Future = Ready<Result<Throttle<S>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, stream: IncomingStream<'_, L>) -> Self::Future {
        ready(Ok(self.throttle.for_connection(*stream.remote_addr())))
    }
}
