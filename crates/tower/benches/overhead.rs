//! The layer's own cost per allowed request, in-process and repeatable: N requests driven
//! through an axum router (`Service::call`, body read to the end) bare, behind the Tollgate
//! layer, or behind `tower_governor`, with the same handler and modes as the loopback
//! benchmark (`examples/bench_server.rs`). No socket, no load generator: what differs between
//! modes is the middleware alone.
//!
//! Run: `cargo bench -p tollgate-tower --bench overhead -- MODE N` (MODE: none, tollgate,
//! tollgate-gcra, tollgate-chain, tollgate-headers, governor; N requests, default 200,000).
//! It prints the time per request. For a figure independent of machine noise, run the built
//! binary under `valgrind --tool=callgrind` at two values of N and divide the difference in
//! instructions by the difference in N (docs/inbound.md, "Overhead").

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};

#[path = "support/layer.rs"]
mod layer;
use layer::{MODES, Serving, bench_app, serving};

const REQUESTS_DEFAULT: u64 = 200_000;
/// Distinct client addresses the requests rotate over, so per-client counters are reused as
/// they are on a server with keep-alive clients.
const CLIENTS: u64 = 32;

/// A request with the client's connection info as a server gives it to every request of a
/// connection, if the service needs it.
fn request(peer: Option<SocketAddr>) -> Request<Body> {
    let mut request = Request::get("/")
        .body(Body::empty())
        .expect("valid request");
    if let Some(address) = peer {
        request.extensions_mut().insert(ConnectInfo(address));
    }
    request
}

/// `requests` requests, rotating over the clients: client `c` is served by `services[c]` with
/// `peers[c]` in its requests.
async fn drive<S>(
    mut services: Vec<S>,
    peers: Vec<Option<SocketAddr>>,
    requests: u64,
) -> Result<u64, Infallible>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let mut not_ok = 0;
    for index in 0..requests {
        let client = (index % CLIENTS) as usize;
        let ready = ServiceExt::<Request<Body>>::ready(&mut services[client]).await?;
        let response = ready.call(request(peers[client])).await?;
        if !response.status().is_success() {
            not_ok += 1;
        }
        let body = response.into_body().collect().await;
        if body.is_err() {
            not_ok += 1;
        }
    }
    Ok(not_ok)
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let mode = args.first().map_or("tollgate", String::as_str).to_owned();
    let requests = args
        .get(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(REQUESTS_DEFAULT);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (app, throttle) = bench_app(&mode, false).unwrap_or_else(|| {
        eprintln!("unknown mode {mode:?}: {MODES}");
        std::process::exit(2);
    });
    // What `axum::serve` does through `into_make_service`: handlers become routes once, not on
    // every request, so each mode pays what it pays when served.
    let app: Router = app.with_state(());
    let addresses: Vec<SocketAddr> = (0..CLIENTS)
        .map(|client| SocketAddr::from(([127, 0, 0, 1], 40_000 + client as u16)))
        .collect();
    let peers = addresses
        .iter()
        .map(|&address| (serving(&mode) == Serving::Socket).then_some(address))
        .collect();
    let app = match throttle {
        Some(throttle) => app.layer(throttle),
        None => app,
    };
    let services = vec![app; CLIENTS as usize];
    let started = Instant::now();
    let driven = runtime.block_on(drive(services, peers, requests));
    let not_ok = driven.unwrap_or_else(|never| match never {});
    let elapsed = started.elapsed();
    let per_request = elapsed.as_nanos() / u128::from(requests.max(1));
    println!("{mode}: {requests} requests, {per_request} ns per request, {not_ok} not ok");
    if not_ok > 0 {
        std::process::exit(1);
    }
}
