//! One process of a fleet calling one vendor through a dispatcher, for the multi-process tests
//! and for trying the dispatcher by hand.
//!
//! Arguments: VENDOR_URL STORE NAMESPACE PROCESS CALLERS RATE PERIOD_MS CONCURRENCY DEADLINE_MS.
//! STORE is `memory` (this process alone) or a `redis://` URL (the fleet shares the quota and
//! its pauses). Each caller submits one job, a GET of VENDOR_URL with an `x-process: PROCESS`
//! header. Prints `done <status>` or `error <message>` per job, then
//! `stats <sent> <rate_limited> <retried> <held_for_pause> <refused_stale>`. Jobs not finished
//! by DEADLINE_MS are abandoned (`unfinished <n>`).

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Algorithm, Limit, Limiter, LimiterConfig, PermitSecret, Policy, Reserve};
use tollgate_dispatch::{
    Classifier, DispatchRuntime, Dispatcher, DispatcherConfig, Gate, GateConfig, HostLimits,
    Priority, Quota,
};
use tollgate_redis::{RedisStore, RedisStoreConfig};

fn argument<T: std::str::FromStr>(args: &[String], index: usize, name: &str) -> T {
    match args.get(index).map(|text| text.parse()) {
        Some(Ok(value)) => value,
        _ => {
            eprintln!(
                "usage: tollgate-dispatch-worker VENDOR_URL STORE NAMESPACE PROCESS CALLERS RATE \
                 PERIOD_MS CONCURRENCY DEADLINE_MS; bad or missing {name}"
            );
            std::process::exit(2);
        }
    }
}

fn fail(what: &str, error: impl std::fmt::Display) -> ! {
    eprintln!("{what}: {error}");
    std::process::exit(1);
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|error| fail("runtime", error));
    runtime.block_on(run());
}

async fn run() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let vendor_url: String = argument(&args, 0, "VENDOR_URL");
    let store_url: String = argument(&args, 1, "STORE");
    let namespace: String = argument(&args, 2, "NAMESPACE");
    let process: String = argument(&args, 3, "PROCESS");
    let callers: u32 = argument(&args, 4, "CALLERS");
    let rate: u64 = argument(&args, 5, "RATE");
    let period_ms: u64 = argument(&args, 6, "PERIOD_MS");
    let concurrency: u64 = argument(&args, 7, "CONCURRENCY");
    let deadline_ms: u64 = argument(&args, 8, "DEADLINE_MS");

    let store: Arc<dyn tollgate::store::Store> = if store_url == "memory" {
        Limiter::in_memory().store().clone()
    } else {
        let store = RedisStore::connect(RedisStoreConfig {
            url: store_url,
            namespace,
            fail_open: false,
            allow_eviction: false,
            module: tollgate_redis::Module::Auto,
            timeout: Duration::from_secs(5),
            keys_per_limit_max: 100_000,
        })
        .await
        .unwrap_or_else(|error| fail("redis", error));
        Arc::new(store)
    };
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    let rate_policy = Policy::rate(
        rate,
        period_ms * 1_000,
        0,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .unwrap_or_else(|error| fail("rate policy", error));
    let lease_policy = Policy::concurrency(concurrency, 5_000_000, Reserve::default())
        .unwrap_or_else(|error| fail("concurrency policy", error));
    for limit in [
        Limit::new("vendor", rate_policy, None),
        Limit::new("vendor-inflight", lease_policy, None),
    ] {
        limiter.set_limit(limit.unwrap_or_else(|error| fail("limit", error)));
    }
    let quota = Quota::limiter(
        limiter,
        HostLimits {
            rate: Some("vendor".into()),
            concurrency: Some("vendor-inflight".into()),
        },
    )
    .unwrap_or_else(|error| fail("quota", error));
    let config = GateConfig {
        wait_ms_max: 60_000,
        retries_max: 50,
        backoff_ms: 50,
        backoff_ms_max: 1_000,
        retry_after_ms_default: 1_000,
        retry_after_ms_max: 30_000,
        resume_jitter_ms_max: 200,
        lease_margin_ms: 1_000,
        // What this fleet's tests measure is the pause protocol alone.
        learn: false,
    };
    let gate =
        Gate::new(quota, Classifier::new(), config).unwrap_or_else(|error| fail("gate", error));
    let client = reqwest::Client::new();
    let dispatcher: Dispatcher<reqwest::Client, ()> = Dispatcher::start(
        gate,
        DispatcherConfig {
            queued_max: 10_000,
            connections_max: 64,
        },
        move |_: &()| {
            let client = client.clone();
            async move { Ok(client) }
        },
        DispatchRuntime::Current,
    )
    .unwrap_or_else(|error| fail("dispatcher", error));

    let mut jobs = Vec::new();
    for _ in 0..callers {
        let vendor_url = vendor_url.clone();
        let process = process.clone();
        let dispatcher = dispatcher.clone();
        jobs.push(tokio::spawn(async move {
            dispatcher
                .run((), Priority::Normal, move |client: reqwest::Client| {
                    client.get(&vendor_url).header("x-process", &process).send()
                })
                .await
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(deadline_ms);
    let mut unfinished = 0;
    let mut lines = String::new();
    for job in jobs {
        match tokio::time::timeout_at(deadline, job).await {
            Ok(Ok(Ok(Ok(response)))) => {
                lines.push_str(&format!("done {}\n", response.status().as_u16()))
            }
            Ok(Ok(Ok(Err(error)))) => lines.push_str(&format!("error vendor {error}\n")),
            Ok(Ok(Err(error))) => lines.push_str(&format!("error dispatch {error}\n")),
            Ok(Err(error)) => lines.push_str(&format!("error task {error}\n")),
            Err(_) => unfinished += 1,
        }
    }
    let stats = dispatcher.gate().stats();
    print!(
        "{lines}unfinished {unfinished}\nstats {} {} {} {} {}\n",
        stats.sent, stats.rate_limited, stats.retried, stats.held_for_pause, stats.refused_stale
    );
    // Jobs abandoned at the deadline would keep the runtime busy; leave at once.
    std::process::exit(0);
}
