//! Throughput and quota utilisation of the dispatcher against a local vendor on loopback.
//!
//! 1. Overhead: jobs/s to a no-op vendor with no binding limit, through plain reqwest and
//!    through the dispatcher (memory limiter, rate limit far above what is reached, the same
//!    number of callers and connections), in the same run.
//! 2. Binding quota: the vendor allows LIMIT calls per fixed one-second window and answers
//!    429 beyond; the dispatcher's quota is the same LIMIT per second, sliding. Reports the
//!    utilisation (calls the vendor accepted / calls it would have accepted over the run) and
//!    the 429 count.
//!
//! `cargo bench -p tollgate-dispatch --bench dispatch`; `DISPATCH_BENCH_SECONDS` (default 5)
//! sets each run's length.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use tollgate::{Algorithm, Limit, Limiter, Policy, Reserve};
use tollgate_dispatch::{
    Classifier, DispatchRuntime, Dispatcher, DispatcherConfig, Gate, GateConfig, HostLimits,
    Priority, Quota,
};

const CALLERS: usize = 32;

struct Counting {
    /// Calls per fixed window allowed; u64::MAX for none.
    limit: u64,
    started: Instant,
    window: AtomicU64,
    in_window: AtomicU64,
    ok: AtomicU64,
    limited: AtomicU64,
    lock: std::sync::Mutex<()>,
    /// Calls accepted in each window, by window number.
    per_window: std::sync::Mutex<Vec<u64>>,
}

async fn start_vendor(limit: u64) -> (String, Arc<Counting>) {
    let counting = Arc::new(Counting {
        limit,
        started: Instant::now(),
        window: AtomicU64::new(0),
        in_window: AtomicU64::new(0),
        ok: AtomicU64::new(0),
        limited: AtomicU64::new(0),
        lock: std::sync::Mutex::new(()),
        per_window: std::sync::Mutex::new(Vec::new()),
    });
    let state = counting.clone();
    let router = axum::Router::new().route(
        "/call",
        axum::routing::get(move || {
            let state = state.clone();
            async move {
                if state.limit == u64::MAX {
                    state.ok.fetch_add(1, Ordering::Relaxed);
                    return StatusCode::OK;
                }
                let _guard = state.lock.lock().unwrap_or_else(|p| p.into_inner());
                let window = state.started.elapsed().as_secs();
                if state.window.load(Ordering::Relaxed) != window {
                    state.window.store(window, Ordering::Relaxed);
                    state.in_window.store(0, Ordering::Relaxed);
                }
                if state.in_window.load(Ordering::Relaxed) >= state.limit {
                    state.limited.fetch_add(1, Ordering::Relaxed);
                    return StatusCode::TOO_MANY_REQUESTS;
                }
                state.in_window.fetch_add(1, Ordering::Relaxed);
                state.ok.fetch_add(1, Ordering::Relaxed);
                let mut per_window = state.per_window.lock().unwrap_or_else(|p| p.into_inner());
                let index = window as usize;
                if per_window.len() <= index {
                    per_window.resize(index + 1, 0);
                }
                per_window[index] += 1;
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{address}/call"), counting)
}

fn dispatcher(limit: u64) -> Dispatcher<reqwest::Client, ()> {
    let limiter = Limiter::in_memory();
    let policy =
        Policy::rate(limit, 1_000_000, 0, Algorithm::Sliding, Reserve::default()).expect("policy");
    limiter.set_limit(Limit::new("vendor", policy, None).expect("limit"));
    let quota = Quota::limiter(
        limiter,
        HostLimits {
            rate: Some("vendor".into()),
            concurrency: None,
        },
    )
    .expect("quota");
    let gate = Gate::new(quota, Classifier::new(), GateConfig::conservative()).expect("gate");
    let client = reqwest::Client::new();
    Dispatcher::start(
        gate,
        DispatcherConfig {
            queued_max: 100_000,
            connections_max: CALLERS as u32,
        },
        move |_: &()| {
            let client = client.clone();
            async move { Ok(client) }
        },
        DispatchRuntime::Current,
    )
    .expect("dispatcher")
}

/// CALLERS loops calling `one` until `run_for` ends; returns calls per second.
async fn drive<F, Fut>(run_for: Duration, one: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (stop, done, one) = (stop.clone(), done.clone(), one.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if one().await {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

async fn bench() {
    let seconds: u64 = std::env::var("DISPATCH_BENCH_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(5);
    let run_for = Duration::from_secs(seconds);

    let (url, _) = start_vendor(u64::MAX).await;
    let client = reqwest::Client::new();
    let plain = {
        let (client, url) = (client.clone(), url.clone());
        drive(run_for, move || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                client
                    .get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            }
        })
        .await
    };
    let through = {
        let dispatcher = dispatcher(1_000_000_000);
        let url = url.clone();
        drive(run_for, move || {
            let (dispatcher, url) = (dispatcher.clone(), url.clone());
            async move {
                dispatcher
                    .run((), Priority::Normal, move |client: reqwest::Client| {
                        client.get(&url).send()
                    })
                    .await
                    .is_ok_and(|r| r.is_ok_and(|r| r.status() == 200))
            }
        })
        .await
    };
    println!(
        "no binding limit, {CALLERS} callers, {seconds} s each: plain reqwest {plain:.0} jobs/s; \
         through the dispatcher {through:.0} jobs/s ({:.1}% of plain)",
        100.0 * through / plain
    );

    for limit in [100u64, 1_000] {
        let (url, counting) = start_vendor(limit).await;
        let dispatcher = dispatcher(limit);
        // Align the run with the vendor's windows: start just after one begins.
        let into_window = counting.started.elapsed().as_nanos() % 1_000_000_000;
        tokio::time::sleep(Duration::from_nanos(
            (1_000_000_000 - into_window) as u64 + 1_000_000,
        ))
        .await;
        let first_window = counting.started.elapsed().as_secs() as usize;
        let url_inner = url.clone();
        // Whole windows only, so that neither a partial first nor last window skews the figure.
        drive(run_for - Duration::from_millis(20), move || {
            let (dispatcher, url) = (dispatcher.clone(), url_inner.clone());
            async move {
                dispatcher
                    .run((), Priority::Normal, move |client: reqwest::Client| {
                        client.get(&url).send()
                    })
                    .await
                    .is_ok()
            }
        })
        .await;
        let per_window = counting
            .per_window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let windows = seconds as usize;
        let measured = per_window.iter().skip(first_window).take(windows);
        let accepted: u64 = measured.clone().sum();
        let allowed = limit * windows as u64;
        println!(
            "binding quota {limit}/s (vendor: fixed 1 s windows; dispatcher: sliding 1 s), \
             {windows} whole windows: accepted {accepted} of {allowed} allowed, utilisation {:.1}%, \
             per window {:?}, 429s {}",
            100.0 * accepted as f64 / allowed as f64,
            measured.collect::<Vec<_>>(),
            counting.limited.load(Ordering::Relaxed)
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this briefly as a smoke test.
    if std::env::args().any(|arg| arg == "--test" || arg == "--list") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench());
}
