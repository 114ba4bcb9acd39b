//! The service in front of the router: it owns which requests skip it. `POST /v1/acquire` and
//! `POST /v1/permits/{permit}/commit`, the pair every caller makes for every call, go straight
//! to their handlers; everything else (and those paths with any other method) goes through the
//! router as before.
//!
//! Why: for every request the router matches the path, records the matched route and the route
//! parameters in the request's extensions (allocating the map they live in), and clones the
//! route's boxed service. For the two busiest endpoints that is a tenth of the server's own
//! instructions. The handlers are the router's own, so the answers are identical; the commit
//! handler reads the permit id from the URI (`PermitInPath`), not from route parameters, so it
//! answers the same through either way.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::Request;
use axum::handler::Handler;
use axum::http::Method;
use axum::response::Response;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::api;
use crate::extract::permit_segment;
use crate::state::AppState;

/// The router, with the acquire and commit endpoints dispatched ahead of it.
#[derive(Clone)]
pub(crate) struct Endpoints {
    router: Router,
    state: AppState,
}

impl Endpoints {
    pub(crate) fn new(router: Router, state: AppState) -> Endpoints {
        Endpoints { router, state }
    }
}

type HandlerFuture = Pin<Box<dyn Future<Output = Response> + Send>>;

impl Service<Request> for Endpoints {
    type Response = Response;
    type Error = Infallible;
    type Future = EndpointFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<Request>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: Request) -> EndpointFuture {
        if request.method() == Method::POST {
            let path = request.uri().path();
            if path == "/v1/acquire" {
                let future = Handler::call(api::acquire, request, self.state.clone());
                return EndpointFuture::Handler { future };
            }
            if permit_segment(path, "commit").is_some() {
                let future = Handler::call(api::commit, request, self.state.clone());
                return EndpointFuture::Handler { future };
            }
        }
        EndpointFuture::Router {
            future: self.router.call(request),
        }
    }
}

pin_project! {
    /// A handler's answer, or the router's.
    #[project = EndpointProj]
    pub(crate) enum EndpointFuture {
        Handler { future: HandlerFuture },
        Router {
            #[pin]
            future: <Router as Service<Request>>::Future,
        },
    }
}

impl Future for EndpointFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            EndpointProj::Handler { future } => future.as_mut().poll(cx).map(Ok),
            EndpointProj::Router { future } => future.poll(cx),
        }
    }
}
