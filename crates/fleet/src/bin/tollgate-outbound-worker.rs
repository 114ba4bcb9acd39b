//! One process of a fleet saturating a vendor through a Tollgate server: CALLERS tasks, each
//! calling the vendor again as soon as its call ends, every call through one `Gate` on the
//! server's limit (`RemoteQuota`), for SECONDS. For the tests that judge a fleet at a mock
//! vendor counting on its own clock (`tests/judged.rs`), and for trying the learning by hand.
//!
//! Arguments: SERVER_URL TOKEN LIMIT VENDOR_URL CALLERS SECONDS LEARN (`true` or `false`).
//! Prints `ready` once connected, waits for a line on stdin (so that every process of a fleet
//! starts together), then runs and prints
//! `stats <sent> <ok> <rate_limited_answers> <retried> <held_for_pause> <lessons> <errors>`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_dispatch::{Classifier, Gate, GateConfig, HostLimits, Priority, Quota, RemoteQuota};

fn argument<T: std::str::FromStr>(args: &[String], index: usize, name: &str) -> T {
    match args.get(index).map(|text| text.parse()) {
        Some(Ok(value)) => value,
        _ => {
            eprintln!(
                "usage: tollgate-outbound-worker SERVER_URL TOKEN LIMIT VENDOR_URL CALLERS \
                 SECONDS LEARN; bad or missing {name}"
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
    let server: String = argument(&args, 0, "SERVER_URL");
    let token: String = argument(&args, 1, "TOKEN");
    let limit: String = argument(&args, 2, "LIMIT");
    let vendor: String = argument(&args, 3, "VENDOR_URL");
    let callers: u32 = argument(&args, 4, "CALLERS");
    let seconds: f64 = argument(&args, 5, "SECONDS");
    let learn: bool = argument(&args, 6, "LEARN");

    let quota = RemoteQuota::new(
        &server,
        Some(token),
        HostLimits {
            rate: Some(limit),
            concurrency: None,
        },
        Duration::from_secs(10),
    )
    .unwrap_or_else(|error| fail("quota", error));
    // The documented starting values, with the vendor's waits honoured as they come and
    // retries enough for a saturated minute.
    let mut config = GateConfig::conservative();
    config.retries_max = 50;
    config.learn = learn;
    let gate = Gate::new(Quota::remote(quota), Classifier::new(), config)
        .unwrap_or_else(|error| fail("gate", error));
    let client = reqwest::Client::new();
    println!("ready");
    let mut line = String::new();
    if let Err(error) = std::io::stdin().read_line(&mut line) {
        fail("stdin", error);
    }

    let ok = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let until = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (gate, client, vendor) = (gate.clone(), client.clone(), vendor.clone());
        let (ok, limited, errors) = (ok.clone(), limited.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < until {
                let answer = tokio::time::timeout_at(
                    until,
                    gate.call(Priority::Normal, || client.get(&vendor).send()),
                )
                .await;
                match answer {
                    Err(_) => break,
                    Ok(Ok(Ok(response))) if response.status().is_success() => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Ok(Ok(_))) => {
                        limited.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let stats = gate.stats();
    println!(
        "stats {} {} {} {} {} {} {}",
        stats.sent,
        ok.load(Ordering::Relaxed),
        stats.rate_limited,
        stats.retried,
        stats.held_for_pause,
        stats.lessons,
        errors.load(Ordering::Relaxed)
    );
    std::process::exit(0);
}
