//! The service both throughput benchmarks measure (the in-process `benches/overhead.rs` and
//! the loopback `examples/bench_server.rs`): one trivial handler, bare or behind a layer, so
//! the two measure the same rules and the same modes.

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use std::time::Duration;

use tollgate::{Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, PermitSecret, TscClock};
use tollgate_rules::{RawRule, Rule, Validate};
use tollgate_tower::{
    Identity, OnStoreError, ThrottleConfig, ThrottleLayer, ThrottleRules, TrustedProxies,
    Unidentified,
};

fn rule(name: &str, json: &str) -> Rule {
    let raw: RawRule = serde_json::from_str(json).expect("bench rule parses");
    raw.validate(name).expect("bench rule is valid")
}

/// One rule on every path counted per client address, under `algorithm`; with `chain`, the
/// throttle-table scenario's chain (per-user concurrency, per-user frequency, endpoint rule).
/// Limits no run reaches: every request is allowed, so the figures are an allowed request's cost.
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
    // The time-stamp counter, the clock tower_governor reads by default, so both layers pay
    // for the same clock.
    let store = MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000_000,
            keys_per_limit_max: 1_000_000,
        },
        Arc::new(TscClock::new()),
    );
    let limiter = Limiter::new(
        Arc::new(store),
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    ThrottleLayer::new(
        limiter,
        ThrottleRules::fixed(rules).expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::peer(TrustedProxies::none()),
            unidentified: Unidentified::Reject,
            headers_on_allowed,
            on_store_error: OnStoreError::FailClosed,
        },
    )
}

/// How a mode's service learns its client's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// It does not need to: `into_make_service` (`none`).
    Bare,
    /// From the `ConnectInfo<SocketAddr>` in every request, which both Tollgate and
    /// `tower_governor` read.
    Socket,
}

/// How `mode` is served: with the `SocketAddr` the layers read; `none` bare, or with
/// `SocketAddr` under `PEER=socket` (what connection info alone costs).
pub fn serving(mode: &str) -> Serving {
    let peer = std::env::var("PEER").unwrap_or_default();
    if mode == "none" && peer != "socket" {
        Serving::Bare
    } else {
        Serving::Socket
    }
}

/// Modes `bench_app` knows, for error messages.
pub const MODES: &str =
    "none, tollgate, tollgate-gcra, tollgate-chain, tollgate-headers or governor";

/// The trivial handler, behind `tower_governor` keyed by client address (`governor`), and the
/// Tollgate layer for it, if the mode has one (`tollgate`; `tollgate-gcra`: the same rule
/// under governor's algorithm; `tollgate-chain`; `tollgate-headers`: the chain with RateLimit
/// fields on allowed answers), none of them ever refusing. `headers_on_allowed` turns the
/// fields on for the other Tollgate modes too. `None` for an unknown mode.
pub fn bench_app(mode: &str, headers_on_allowed: bool) -> Option<(Router, Option<ThrottleLayer>)> {
    let handler = Router::new().route("/", get(|| async { "ok" }));
    let throttle = |chain, headers, algorithm| Some(tollgate_layer(chain, headers, algorithm));
    Some(match mode {
        "none" => (handler, None),
        "tollgate" => (handler, throttle(false, headers_on_allowed, "fixed")),
        "tollgate-gcra" => (handler, throttle(false, headers_on_allowed, "gcra")),
        "tollgate-chain" => (handler, throttle(true, headers_on_allowed, "fixed")),
        "tollgate-headers" => (handler, throttle(true, true, "fixed")),
        "governor" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .expect("valid governor configuration");
            let layer = tower_governor::GovernorLayer::new(Arc::new(config));
            (handler.layer(layer), None)
        }
        _ => return None,
    })
}
