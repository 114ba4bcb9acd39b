//! The service both throughput benchmarks measure (the in-process `benches/overhead.rs` and
//! the loopback `examples/bench_server.rs`): one trivial handler, bare or behind a layer, so
//! the two measure the same rules and the same modes.

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use std::time::Duration;

use tollgate::{Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, PermitSecret, TscClock};
use tollgate_rules::{RawRule, Rule};
use tollgate_tower::{
    Identity, OnStoreError, ThrottleConfig, ThrottleLayer, ThrottleRules, TrustedProxies,
    Unidentified,
};

fn rule(name: &str, json: &str) -> Rule {
    let raw: RawRule = serde_json::from_str(json).expect("bench rule parses");
    raw.validate(name).expect("bench rule is valid")
}

/// One rule on every path counted per client address, under `algorithm`; with `chain`, seed 002's chain
/// (per-user concurrency, per-user frequency, endpoint rule). Limits no run reaches: every
/// request is allowed, so the figures are an allowed request's cost.
pub fn tollgate_layer(chain: bool, headers_on_allowed: bool, algorithm: &str) -> ThrottleLayer {
    // GCRA counts whole microseconds: a million a second is its most.
    let limit = if algorithm == "gcra" {
        1_000_000
    } else {
        1_000_000_000
    };
    let mut rules = vec![rule(
        "user-freq",
        &format!(
            r#"{{"kind":"rate","limit":{limit},"period_ms":1000,"algorithm":"{algorithm}","per":"user",
                "match":{{"method":"*","path":"*"}}}}"#
        ),
    )];
    if chain {
        rules.push(rule(
            "user-conc",
            r#"{"kind":"concurrency","limit":100000,"lease_ttl_ms":60000,"per":"user",
                "match":{"method":"*","path":"*"}}"#,
        ));
        rules.push(rule(
            "root",
            r#"{"kind":"rate","limit":1000000000,"period_ms":1000,"algorithm":"fixed","per":"user",
                "match":{"method":"GET","path":"/"}}"#,
        ));
    }
    // The time-stamp counter, as tower_governor's default clock reads it: `Limiter::in_memory`'s
    // monotonic clock costs about a hundred instructions more per decision.
    let store = MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000_000,
            recover_on_start: false,
        },
        Arc::new(TscClock::new()),
    );
    let limiter = Limiter::new(
        Arc::new(store),
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
        },
    );
    ThrottleLayer::new(
        limiter,
        ThrottleRules::fixed(rules),
        ThrottleConfig {
            identity: Identity::Peer(TrustedProxies::none()),
            unidentified: Unidentified::Reject,
            headers_on_allowed,
            on_store_error: OnStoreError::FailClosed,
        },
    )
}

/// Whether `mode` serves a Tollgate layer that counts per client address, and so is given the
/// client as a `PeerAddr` (its key written once per connection), unless `PEER=socket` asks for
/// the `SocketAddr` every axum server can give (the key then written for each request). The
/// other modes get the `SocketAddr` `tower_governor` reads.
pub fn peer_addr_for(mode: &str) -> bool {
    mode.starts_with("tollgate") && std::env::var("PEER").map_or(true, |peer| peer != "socket")
}

/// Modes `bench_app` knows, for error messages.
pub const MODES: &str =
    "none, tollgate, tollgate-gcra, tollgate-chain, tollgate-headers or governor";

/// The trivial handler bare (`none`), behind the Tollgate layer (`tollgate`, `tollgate-gcra`:
/// the same rule under governor's algorithm, `tollgate-chain`, `tollgate-headers`: the chain
/// with RateLimit fields on allowed answers), or behind
/// `tower_governor` keyed by client address (`governor`), none of them ever refusing.
/// `headers_on_allowed` turns the fields on for the other Tollgate modes too. `None` for an
/// unknown mode.
pub fn bench_app(mode: &str, headers_on_allowed: bool) -> Option<Router> {
    let handler = Router::new().route("/", get(|| async { "ok" }));
    Some(match mode {
        "none" => handler,
        "tollgate" => handler.layer(tollgate_layer(false, headers_on_allowed, "fixed")),
        "tollgate-gcra" => handler.layer(tollgate_layer(false, headers_on_allowed, "gcra")),
        "tollgate-chain" => handler.layer(tollgate_layer(true, headers_on_allowed, "fixed")),
        "tollgate-headers" => handler.layer(tollgate_layer(true, true, "fixed")),
        "governor" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .expect("valid governor configuration");
            handler.layer(tower_governor::GovernorLayer::new(Arc::new(config)))
        }
        _ => return None,
    })
}
