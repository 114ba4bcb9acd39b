//! `ShouldRateLimit` on the memory store: requests of any domain and descriptors (and, when the
//! input carries a valid one, any configuration). A refusal is `INVALID_ARGUMENT` naming its
//! field; an answer has one status per descriptor and an overall code that agrees with them;
//! the store never refuses what the service sends it; and an `OVER_LIMIT` answer counted
//! nothing.

use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate::{ManualClock, MemoryStore, MemoryStoreConfig};
use tollgate_envoy::{Config, ConfigWatch, EnvoyService};

/// 2026-11-24T00:00:30Z, in microseconds.
const START_US: u64 = 1_795_478_430_000_000;

const CONFIG: &str = r#"
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /login
    rate_limit: {name: login, unit: second, requests_per_unit: 2}
  - key: path
    value: /static/*
    rate_limit: {unlimited: true}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: plan
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tenant
    value: big
    descriptors:
      - key: plan
        value: enterprise
        rate_limit: {name: enterprise, unit: day, requests_per_unit: 100, replaces: [{name: login}]}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: assets
    rate_limit: {unlimited: true, replaces: [{name: login}]}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: user
    value: team-*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: any
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1000}
"#;

const WORDS: &[&str] = &[
    "api",
    "remote_address",
    "path",
    "/login",
    "/static/app.js",
    "tenant",
    "big",
    "plan",
    "free",
    "enterprise",
    "shadow",
    "assets",
    "closed",
    "user",
    "team-a",
    "team-",
    "any",
    "",
    "*",
    "10.0.0.1",
    "\n",
];

#[derive(Arbitrary, Debug)]
enum Text {
    Word(u8),
    /// A word repeated: long keys and values.
    Long(u8, u16),
    Free(String),
}

impl Text {
    fn get(&self) -> String {
        match self {
            Text::Word(index) => WORDS[usize::from(*index) % WORDS.len()].to_owned(),
            Text::Long(index, times) => {
                WORDS[usize::from(*index) % WORDS.len()].repeat(usize::from(*times) % 600)
            }
            Text::Free(text) => text.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Ask {
    domain: Text,
    descriptors: Vec<Vec<(Text, Text)>>,
    hits_addend: u32,
    advance_ms: u32,
}

#[derive(Arbitrary, Debug)]
struct Input {
    config: Option<String>,
    asks: Vec<Ask>,
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

fn counters(store: &MemoryStore) -> Vec<tollgate::SavedCounter> {
    let mut counters = store.snapshot().counters;
    counters.sort_by(|a, b| (&a.limit, &a.key).cmp(&(&b.limit, &b.key)));
    counters
}

/// One input of the target, as libFuzzer hands it over, read into `Input` as
/// `libfuzzer_sys::fuzz_target!` reads a typed input (too short or unreadable: no run).
pub fn run_input(bytes: &[u8]) {
    if bytes.len() < <Input as Arbitrary>::size_hint(0).0 {
        return;
    }
    let Ok(input) = <Input as Arbitrary>::arbitrary_take_rest(arbitrary::Unstructured::new(bytes))
    else {
        return;
    };
    let config = input
        .config
        .as_deref()
        .and_then(|text| Config::parse([("fuzz.yaml", text)]).ok())
        .unwrap_or_else(|| Config::parse([("api.yaml", CONFIG)]).expect("the base configuration"));
    let clock = Arc::new(ManualClock::new(START_US));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 10_000,
            keys_per_limit_max: 10_000,
        },
        clock.clone(),
    ));
    let watch = ConfigWatch::fixed(config);
    let service = EnvoyService::new(store.clone(), watch.clone(), false);
    for ask in input.asks.iter().take(8) {
        clock.advance_us(u64::from(ask.advance_ms) * 1_000);
        let request = RateLimitRequest {
            domain: ask.domain.get(),
            descriptors: ask
                .descriptors
                .iter()
                .take(16)
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .take(8)
                        .map(|(key, value)| Entry {
                            key: key.get(),
                            value: value.get(),
                        })
                        .collect(),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: ask.hits_addend,
        };
        let before = counters(&store);
        let failures = watch
            .stats()
            .store_failures
            .load(std::sync::atomic::Ordering::Relaxed);
        let response = match runtime().block_on(service.decide(&request)) {
            Ok(response) => response,
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                let message = status.message();
                assert!(
                    message.starts_with("domain") || message.starts_with("descriptors"),
                    "{message}"
                );
                assert_eq!(counters(&store), before, "a refused request counted");
                continue;
            }
        };
        assert_eq!(
            watch
                .stats()
                .store_failures
                .load(std::sync::atomic::Ordering::Relaxed),
            failures,
            "the memory store refused what the service sent it: {request:?}"
        );
        assert_eq!(response.statuses.len(), request.descriptors.len());
        let over: Vec<bool> = response
            .statuses
            .iter()
            .map(|status| status.code == Code::OverLimit as i32)
            .collect();
        for (status, over) in response.statuses.iter().zip(&over) {
            assert!(!over || status.current_limit.is_some(), "{status:?}");
            assert!(status.code == Code::Ok as i32 || *over, "{status:?}");
        }
        if response.overall_code == Code::OverLimit as i32 {
            assert!(over.contains(&true), "OVER_LIMIT with every descriptor OK");
            assert_eq!(counters(&store), before, "an OVER_LIMIT answer counted");
        } else {
            assert_eq!(response.overall_code, Code::Ok as i32);
            assert!(!over.contains(&true), "OK with a descriptor OVER_LIMIT");
        }
    }
}
