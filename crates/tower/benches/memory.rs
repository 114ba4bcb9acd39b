//! The endpoint throttle table's worry (docs/inbound.md, *The rules*), measured: M users x N
//! endpoints through the layer. Drives USERS distinct users over ENDPOINTS per-user endpoint
//! rules in-process (`Service::call`), then reports the counters tracked, the process's
//! resident memory per tracked counter, and what is left once every counter has gone idle and
//! been swept.
//!
//! Run: `cargo bench -p tollgate-tower --bench memory` (env `USERS` overrides 1,000,000).
//!
//! The clock is a manual one so that "idle" is exact: the sweep runs one period later.
//! Resident memory comes from /proc/self/statm; freed heap is not necessarily returned to the
//! operating system by the allocator, so the tracked-counter figure is the one that shows state
//! coming back, and the RSS after the sweep is an upper bound.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use tollgate::{Limiter, LimiterConfig, ManualClock, MemoryStore, MemoryStoreConfig, PermitSecret};
use tollgate_rules::{RawRule, Rule, Validate};
use tollgate_tower::{
    Identity, OnStoreError, ThrottleConfig, ThrottleLayer, ThrottleRules, Unidentified,
};
use tower::{Layer, Service};

const ENDPOINTS: usize = 20;
const USERS_DEFAULT: usize = 1_000_000;
const PERIOD_MS: u64 = 60_000;
const PAGE_BYTES: u64 = 4096;

fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|text| text.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * PAGE_BYTES)
}

fn endpoint_rule(index: usize) -> Rule {
    let json = format!(
        r#"{{"kind":"rate","limit":10,"period_ms":{PERIOD_MS},"algorithm":"fixed","per":"user",
            "match":{{"method":"GET","path":"/api/e{index}/#"}}}}"#
    );
    let raw: RawRule = serde_json::from_str(&json).expect("bench rule parses");
    raw.validate(&format!("endpoint-{index}"))
        .expect("bench rule is valid")
}

fn main() {
    let users: usize = std::env::var("USERS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(USERS_DEFAULT);
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: (users * ENDPOINTS + 1_000) as u64,
            keys_per_limit_max: (users * ENDPOINTS + 1_000) as u64,
        },
        clock.clone(),
    ));
    let limiter = Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max: Duration::from_secs(1),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    let layer = ThrottleLayer::new(
        limiter,
        ThrottleRules::fixed((0..ENDPOINTS).map(endpoint_rule))
            .expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::Header(http::HeaderName::from_static("x-user")),
            unidentified: Unidentified::Reject,
            headers_on_allowed: true,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let handler = tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let mut service = layer.layer(handler);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");

    let paths: Vec<String> = (0..ENDPOINTS).map(|e| format!("/api/e{e}/12345")).collect();
    let resident_before = resident_bytes();
    let started = Instant::now();
    let mut refused = 0u64;
    runtime.block_on(async {
        for user in 0..users {
            let user = format!("user-{user:07}");
            for path in &paths {
                let request = Request::get(path.as_str())
                    .header("x-user", user.as_str())
                    .body(())
                    .expect("valid request");
                let response = service.call(request).await.expect("infallible");
                if !response.status().is_success() {
                    refused += 1;
                }
            }
        }
    });
    let elapsed = started.elapsed();
    let requests = (users * ENDPOINTS) as u64;
    let tracked = store.len() as u64;
    let resident_loaded = resident_bytes();
    let grown = resident_loaded.saturating_sub(resident_before);
    println!("users x endpoints:        {users} x {ENDPOINTS} = {requests} requests");
    println!(
        "time:                     {:.1} s, {:.0} ns per request (one thread, in-process)",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / requests as f64
    );
    println!("refused:                  {refused}");
    println!("tracked counters:         {tracked}");
    println!(
        "resident memory:          {:.1} MiB before, {:.1} MiB loaded (+{:.1} MiB)",
        mib(resident_before),
        mib(resident_loaded),
        mib(grown)
    );
    println!(
        "bytes per tracked counter: {:.0}",
        grown as f64 / tracked.max(1) as f64
    );

    // Every counter is idle one period after its last use.
    clock.advance_us(PERIOD_MS * 1_000 + 1);
    let started = Instant::now();
    let swept = store.sweep(usize::MAX);
    let sweep_time = started.elapsed();
    let resident_swept = resident_bytes();
    println!(
        "after one idle period:    swept {swept} counters in {:.2} s; {} tracked",
        sweep_time.as_secs_f64(),
        store.len()
    );
    println!(
        "resident memory:          {:.1} MiB after the sweep (the store's maps shrink as they \
         empty; freed heap may still stay with the allocator)",
        mib(resident_swept)
    );
    assert_eq!(store.len(), 0, "every idle counter is gone");
    assert_eq!(
        refused, 0,
        "each user made one call per endpoint, well inside the limits"
    );

    // The same users again: the memory is reused, not grown.
    runtime.block_on(async {
        for user in 0..users {
            let user = format!("user-{user:07}");
            let request = Request::get(paths[0].as_str())
                .header("x-user", user.as_str())
                .body(())
                .expect("valid request");
            let _ = service.call(request).await;
        }
    });
    println!(
        "reuse:                    {} users again on one endpoint: {} tracked, {:.1} MiB resident",
        users,
        store.len(),
        mib(resident_bytes())
    );
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
