//! The server the throughput benchmark drives with a load generator on loopback: one trivial
//! handler, bare, behind the Tollgate layer, or behind `tower_governor`, so that the cost of
//! each layer per allowed request can be read off side by side.
//!
//! `cargo run --profile bench -p tollgate-tower --example bench_server -- MODE PORT`, with MODE:
//! - `none`: the handler alone;
//! - `tollgate`: one rule on every path, counted per client address, never refusing;
//! - `tollgate-gcra`: the same rule under GCRA, `tower_governor`'s algorithm;
//! - `tollgate-chain`: the throttle-table scenario's chain (per-user concurrency, per-user
//!   frequency, endpoint rule), none refusing;
//! - `tollgate-headers`: the chain with the RateLimit fields on allowed answers;
//! - `governor`: `tower_governor` keyed by client address, never refusing.
//!
//! The Tollgate modes and `governor` are served with the `SocketAddr` connection info they
//! read, `none` bare (with `SocketAddr` too under `PEER=socket`).
//! `WORKERS=N` sets the runtime's worker threads. `HEADERS=1` sends the RateLimit fields on
//! allowed responses (off by default, as `tower_governor` sends none unless asked). See
//! docs/inbound.md for the figures.

use std::net::SocketAddr;

#[path = "../benches/support/layer.rs"]
mod layer;
use layer::{MODES, Serving, bench_app, serving};

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "none".to_owned());
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(7080);
    let headers_on_allowed = std::env::var("HEADERS").is_ok_and(|value| value == "1");
    let Some((app, throttle)) = bench_app(&mode, headers_on_allowed) else {
        eprintln!("unknown mode {mode:?}: {MODES}");
        std::process::exit(2);
    };
    // WORKERS pins the runtime's size, so the load generator can have the other cores.
    let workers = std::env::var("WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let listener = tokio::net::TcpListener::bind(address).await.expect("bind");
        eprintln!("{mode} listening on {address}");
        let app = match throttle {
            Some(throttle) => app.layer(throttle),
            None => app,
        };
        match serving(&mode) {
            Serving::Socket => {
                let service = app.into_make_service_with_connect_info::<SocketAddr>();
                axum::serve(listener, service).await
            }
            Serving::Bare => axum::serve(listener, app.into_make_service()).await,
        }
        .expect("serve");
    });
}
