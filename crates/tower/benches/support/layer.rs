//! The Tollgate layer both throughput benchmarks put in front of their trivial handler (the
//! in-process `benches/overhead.rs` and the loopback `examples/bench_server.rs`), so the two
//! measure the same rules.

use tollgate::Limiter;
use tollgate_rules::{RawRule, Rule};
use tollgate_tower::{
    Identity, OnStoreError, ThrottleConfig, ThrottleLayer, ThrottleRules, TrustedProxies,
    Unidentified,
};

fn rule(name: &str, json: &str) -> Rule {
    let raw: RawRule = serde_json::from_str(json).expect("bench rule parses");
    raw.validate(name).expect("bench rule is valid")
}

/// One rule on every path counted per client address; with `chain`, seed 002's chain
/// (per-user concurrency, per-user frequency, endpoint rule). Limits no run reaches: every
/// request is allowed, so the figures are an allowed request's cost.
pub fn tollgate_layer(chain: bool, headers_on_allowed: bool) -> ThrottleLayer {
    let mut rules = vec![rule(
        "user-freq",
        r#"{"kind":"rate","limit":1000000000,"period_ms":1000,"algorithm":"fixed","per":"user",
            "match":{"method":"*","path":"*"}}"#,
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
    ThrottleLayer::new(
        Limiter::in_memory(),
        ThrottleRules::fixed(rules),
        ThrottleConfig {
            identity: Identity::Peer(TrustedProxies::none()),
            unidentified: Unidentified::Reject,
            headers_on_allowed,
            on_store_error: OnStoreError::FailClosed,
        },
    )
}
