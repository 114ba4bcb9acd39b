//! One process of a fleet sharing a limit through Redis, for the fleet tests and for trying
//! Tollgate out by hand: `cargo run -p tollgate-fleet --bin tollgate-fleet-worker -- \
//!   redis://127.0.0.1:6379/ demo vendor 20 100 50 5000`.
//!
//! Two modes:
//!
//! - `URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS ACQUIRERS DURATION_MS [ALGORITHM]`: ACQUIRERS
//!   tasks acquire (waiting up to 500 ms each time) until DURATION_MS has passed. LIMIT_NAME may
//!   name several limits, comma-separated, each with the same policy; the acquirers take turns
//!   over them. Prints one line per grant, `grant <decided_at_us> <units> <limit>`, on the
//!   store's clock, then `done <grants> <errors>`. Store errors (Redis restarting, a failover)
//!   are printed and waited out.
//! - `--steps URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS [ALGORITHM]`, LIMIT_NAME one limit:
//!   prints `ready` once connected, then for each line `take N` read from standard input asks
//!   N times, one after another and without waiting, printing a `grant` line (as above) per
//!   grant and `error ...` per failure, then `taken <grants>`. It ends at the end of its input.
//!   This lets a test bracket every decision between two readings of a clock of its own: the
//!   moment it sent the line and the moment it read `taken`.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Limit, Limiter, LimiterConfig, PermitSecret, Policy, Request, Reserve};
use tollgate_redis::{RedisStore, RedisStoreConfig};

const USAGE: &str = "usage: tollgate-fleet-worker URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS \
                     ACQUIRERS DURATION_MS [sliding|fixed]\n   \
                     or: tollgate-fleet-worker --steps URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS \
                     [sliding|fixed]";

fn argument<T: std::str::FromStr>(args: &[String], index: usize, name: &str) -> T {
    match args.get(index).map(|text| text.parse()) {
        Some(Ok(value)) => value,
        _ => {
            eprintln!("{USAGE}\nbad or missing {name}");
            std::process::exit(2);
        }
    }
}

fn algorithm(args: &[String], index: usize) -> Algorithm {
    match args.get(index).map(String::as_str) {
        None | Some("sliding") => Algorithm::Sliding,
        Some("fixed") => Algorithm::Fixed,
        Some(other) => {
            eprintln!("{USAGE}\nunknown algorithm {other}");
            std::process::exit(2);
        }
    }
}

/// What both modes share: where to connect and the limits to set.
struct Shared {
    url: String,
    namespace: String,
    names: Vec<String>,
    limit: u64,
    period_ms: u64,
    algorithm: Algorithm,
}

impl Shared {
    /// The five arguments both modes start with, then the algorithm at `algorithm_at`.
    fn parse(args: &[String], algorithm_at: usize) -> Shared {
        let name: String = argument(args, 2, "LIMIT_NAME");
        Shared {
            url: argument(args, 0, "URL"),
            namespace: argument(args, 1, "NAMESPACE"),
            names: name.split(',').map(str::to_owned).collect(),
            limit: argument(args, 3, "LIMIT"),
            period_ms: argument(args, 4, "PERIOD_MS"),
            algorithm: algorithm(args, algorithm_at),
        }
    }

    /// A limiter on Redis with every limit set, retrying the connection until Redis answers.
    async fn limiter(&self) -> Limiter {
        let store = loop {
            match RedisStore::connect(RedisStoreConfig {
                url: self.url.clone(),
                namespace: self.namespace.clone(),
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
        let policy = match Policy::rate(
            self.limit,
            self.period_ms * 1_000,
            0,
            self.algorithm,
            Reserve::default(),
        ) {
            Ok(policy) => policy,
            Err(error) => {
                eprintln!("policy: {error}");
                std::process::exit(2);
            }
        };
        for name in &self.names {
            limiter.set_limit(Limit::new(name, policy, None).unwrap_or_else(|error| {
                eprintln!("limit: {error}");
                std::process::exit(2);
            }));
        }
        limiter
    }
}

fn print_line(line: &str) {
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            std::process::exit(1);
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((flag, rest)) if flag == "--steps" => steps(&runtime, &Shared::parse(rest, 5)),
        _ => runtime.block_on(run(&args)),
    }
}

/// The `--steps` mode: one `take N` line at a time, read on this thread while the runtime's
/// own threads keep the store's connections going.
fn steps(runtime: &tokio::runtime::Runtime, shared: &Shared) {
    let limiter = runtime.block_on(shared.limiter());
    print_line("ready\n");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let count = match line.strip_prefix("take ").map(|count| count.trim().parse()) {
            Some(Ok(count)) => count,
            _ => {
                eprintln!("expected `take N`, read {line:?}");
                std::process::exit(2);
            }
        };
        let granted = runtime.block_on(take(&limiter, &shared.names[0], count));
        print_line(&format!("taken {granted}\n"));
    }
}

/// Ask `count` times for one unit of `name`, without waiting; the grants.
async fn take(limiter: &Limiter, name: &str, count: u64) -> u64 {
    let mut granted = 0;
    for _ in 0..count {
        match limiter.try_acquire(&Request::new(name)).await {
            Ok(outcome) => {
                if let Some(permit) = outcome.granted() {
                    granted += 1;
                    print_line(&format!("grant {} 1 {name}\n", permit.decided_at_us()));
                }
            }
            Err(error) => print_line(&format!("error {error}\n")),
        }
    }
    granted
}

async fn run(args: &[String]) {
    let shared = Shared::parse(args, 7);
    let acquirers: u64 = argument(args, 5, "ACQUIRERS");
    let duration_ms: u64 = argument(args, 6, "DURATION_MS");
    let limiter = shared.limiter().await;
    let end = Instant::now() + Duration::from_millis(duration_ms);
    let grants = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for acquirer in 0..acquirers {
        let limiter = limiter.clone();
        let name = shared.names[acquirer as usize % shared.names.len()].clone();
        let grants = grants.clone();
        let errors = errors.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let request = Request::new(&name).wait(Duration::from_millis(500));
                match limiter.acquire(&request).await {
                    Ok(outcome) => {
                        if let Some(permit) = outcome.granted() {
                            grants.fetch_add(1, Ordering::Relaxed);
                            print_line(&format!("grant {} 1 {name}\n", permit.decided_at_us()));
                        }
                    }
                    Err(error) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        print_line(&format!("error {error}\n"));
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
