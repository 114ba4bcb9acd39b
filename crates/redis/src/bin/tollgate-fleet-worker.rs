//! One process of a fleet sharing a limit through Redis, for the fleet tests and for trying
//! Tollgate out by hand: `cargo run -p tollgate-redis --bin tollgate-fleet-worker -- \
//!   redis://127.0.0.1:6379/ demo vendor 20 100 50 5000`.
//!
//! Arguments: URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS ACQUIRERS DURATION_MS \[ALGORITHM\].
//! LIMIT_NAME may name several limits, comma-separated, each with the same policy; the
//! acquirers take turns over them. Prints one line per grant, `grant <decided_at_us> <units>
//! <limit>`, on the store's clock, then `done <grants> <errors>`. Store errors (Redis
//! restarting, a failover) are printed and waited out.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Limit, Limiter, LimiterConfig, PermitSecret, Policy, Request, Reserve};
use tollgate_redis::{RedisStore, RedisStoreConfig};

fn argument<T: std::str::FromStr>(args: &[String], index: usize, name: &str) -> T {
    match args.get(index).map(|text| text.parse()) {
        Some(Ok(value)) => value,
        _ => {
            eprintln!(
                "usage: tollgate-fleet-worker URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS ACQUIRERS DURATION_MS \
                 [sliding|fixed]; bad or missing {name}"
            );
            std::process::exit(2);
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            std::process::exit(1);
        }
    }
}

async fn run() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url: String = argument(&args, 0, "URL");
    let namespace: String = argument(&args, 1, "NAMESPACE");
    let name: String = argument(&args, 2, "LIMIT_NAME");
    let limit: u64 = argument(&args, 3, "LIMIT");
    let period_ms: u64 = argument(&args, 4, "PERIOD_MS");
    let acquirers: u64 = argument(&args, 5, "ACQUIRERS");
    let duration_ms: u64 = argument(&args, 6, "DURATION_MS");
    let algorithm = match args.get(7).map(String::as_str) {
        None | Some("sliding") => Algorithm::Sliding,
        Some("fixed") => Algorithm::Fixed,
        Some(other) => {
            eprintln!("unknown algorithm {other}");
            std::process::exit(2);
        }
    };
    let store = loop {
        match RedisStore::connect(RedisStoreConfig {
            url: url.clone(),
            namespace: namespace.clone(),
            fail_open: false,
            allow_eviction: false,
            timeout: Duration::from_secs(2),
            keys_per_limit_max: 100_000,
        })
        .await
        {
            Ok(store) => break store,
            Err(error) => {
                eprintln!("connect: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let limiter = Limiter::new(
        Arc::new(store),
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    let policy = match Policy::rate(limit, period_ms * 1_000, 0, algorithm, Reserve::default()) {
        Ok(policy) => policy,
        Err(error) => {
            eprintln!("policy: {error}");
            std::process::exit(2);
        }
    };
    let names: Vec<String> = name.split(',').map(str::to_owned).collect();
    for name in &names {
        limiter.set_limit(Limit::new(name, policy, None).unwrap_or_else(|error| {
            eprintln!("limit: {error}");
            std::process::exit(2);
        }));
    }
    let end = Instant::now() + Duration::from_millis(duration_ms);
    let grants = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for acquirer in 0..acquirers {
        let limiter = limiter.clone();
        let name = names[acquirer as usize % names.len()].clone();
        let grants = grants.clone();
        let errors = errors.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let request = Request::new(&name).wait(Duration::from_millis(500));
                match limiter.acquire(&request).await {
                    Ok(outcome) => {
                        if let Some(permit) = outcome.granted() {
                            grants.fetch_add(1, Ordering::Relaxed);
                            let line = format!("grant {} 1 {name}\n", permit.decided_at_us());
                            let _ = std::io::stdout().lock().write_all(line.as_bytes());
                        }
                    }
                    Err(error) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let line = format!("error {error}\n");
                        let _ = std::io::stdout().lock().write_all(line.as_bytes());
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    println!(
        "done {} {}",
        grants.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed)
    );
}
