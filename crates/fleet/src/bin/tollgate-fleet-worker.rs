//! One process of a fleet sharing a limit through Redis, for the fleet tests and for trying
//! Tollgate out by hand: `cargo run -p tollgate-fleet --bin tollgate-fleet-worker -- \
//!   redis://127.0.0.1:6379/ demo vendor 20 100 50 5000`.
//!
//! Three modes:
//!
//! - `URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS ACQUIRERS DURATION_MS [ALGORITHM]`: ACQUIRERS
//!   tasks acquire (waiting up to 500 ms each time) until DURATION_MS has passed. LIMIT_NAME may
//!   name several limits, comma-separated, each with the same policy; the acquirers take turns
//!   over them. Prints one line per grant, `grant <decided_at_us> <units> <limit>`, on the
//!   store's clock, then `done <grants> <errors>`. Store errors (Redis restarting, a failover)
//!   are printed and waited out.
//! - `--steps URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS [ALGORITHM]`, LIMIT_NAME one limit:
//!   prints `ready` once connected, then for each line read from standard input, `take N` or
//!   `burst N`, asks N times without waiting: `take` one after another, `burst` all at once
//!   (polled together, so all but the first calls on the slot wait and the store sends them in
//!   batches). It prints a `grant` line (as above) per grant and `error ...` per failure, then
//!   `taken <grants> <batched>`, `batched` the step's acquires the store decided in a call with
//!   others (`RedisStore::batched_acquires`). It ends at the end of its input. This lets a test
//!   bracket every decision between two readings of a clock of its own: the moment it sent the
//!   line and the moment it read `taken`.
//! - `--priority URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS ALGORITHM PRIORITY MODE VENDOR_ADDR
//!   DURATION_MS`, LIMIT_NAME one limit: one side of a vendor's quota, asking at PRIORITY
//!   (`low`, `normal` or `high`) until DURATION_MS has passed. MODE `loops:N` runs N loops, each
//!   asking again as soon as it is answered and waiting up to 30 s; `rate:R` starts R requests
//!   a second, each on its own schedule and waiting up to 5 s. After every grant it calls the
//!   vendor at VENDOR_ADDR (a TCP line `library PRIORITY START_US GRANTED_US`, answered `ok`):
//!   the wall clock when the request started and when its grant came back, in microseconds
//!   since the epoch, so the vendor can time the wait on its own clock. Prints `ready` once
//!   connected, `denied START_US` per request not granted within its wait, `error ...` per
//!   failure, then, once every request it started is answered, `done <grants> <denials>
//!   <errors>`.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tollgate::{
    Algorithm, Limit, Limiter, LimiterConfig, Outcome, PermitSecret, Policy, Priority, Request,
    Reserve,
};
use tollgate_redis::{RedisStore, RedisStoreConfig};

const USAGE: &str = "usage: tollgate-fleet-worker URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS \
                     ACQUIRERS DURATION_MS [sliding|fixed|gcra]\n   \
                     or: tollgate-fleet-worker --steps URL NAMESPACE LIMIT_NAME LIMIT PERIOD_MS \
                     [sliding|fixed|gcra]\n   \
                     or: tollgate-fleet-worker --priority URL NAMESPACE LIMIT_NAME LIMIT \
                     PERIOD_MS sliding|fixed|gcra low|normal|high loops:N|rate:R VENDOR_ADDR \
                     DURATION_MS";

fn argument<T: std::str::FromStr>(args: &[String], index: usize, name: &str) -> T {
    match args.get(index).map(|text| text.parse()) {
        Some(Ok(value)) => value,
        _ => {
            eprintln!("{USAGE}\nbad or missing {name}");
            std::process::exit(2);
        }
    }
}

/// The algorithm named at `index` (sliding when none is); GCRA's burst is `limit`, the rules'
/// default.
fn algorithm(args: &[String], index: usize, limit: u64) -> Algorithm {
    match args.get(index).map(String::as_str) {
        None | Some("sliding") => Algorithm::Sliding,
        Some("fixed") => Algorithm::Fixed,
        Some("gcra") => Algorithm::Gcra { burst: limit },
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
    /// The five arguments every mode starts with, then the algorithm at `algorithm_at`.
    fn parse(args: &[String], algorithm_at: usize) -> Shared {
        let name: String = argument(args, 2, "LIMIT_NAME");
        let limit = argument(args, 3, "LIMIT");
        Shared {
            url: argument(args, 0, "URL"),
            namespace: argument(args, 1, "NAMESPACE"),
            names: name.split(',').map(str::to_owned).collect(),
            limit,
            period_ms: argument(args, 4, "PERIOD_MS"),
            algorithm: algorithm(args, algorithm_at, limit),
        }
    }

    /// A limiter on Redis with every limit set, retrying the connection until Redis answers.
    async fn limiter(&self) -> Limiter {
        self.limiter_and_store().await.0
    }

    /// `limiter`, and the store it asks (whose counts a step reports).
    async fn limiter_and_store(&self) -> (Limiter, Arc<RedisStore>) {
        let store = loop {
            match RedisStore::connect(RedisStoreConfig {
                url: self.url.clone(),
                namespace: self.namespace.clone(),
                fail_open: false,
                allow_eviction: false,
                module: tollgate_redis::Module::Auto,
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
        let store = Arc::new(store);
        let limiter = Limiter::new(
            store.clone(),
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
        (limiter, store)
    }
}

fn print_line(line: &str) {
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let steps_mode = args.first().is_some_and(|flag| flag == "--steps");
    // A stepped worker runs everything on this one thread, so a burst's asks all reach the
    // store before its connection sends the first: whatever the machine's load, the store
    // finds the first calls in flight and batches the rest.
    let runtime = if steps_mode {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            std::process::exit(1);
        }
    };
    match args.split_first() {
        Some((_, rest)) if steps_mode => steps(&runtime, &Shared::parse(rest, 5)),
        Some((flag, rest)) if flag == "--priority" => runtime.block_on(priority(rest)),
        _ => runtime.block_on(run(&args)),
    }
}

/// The `--steps` mode: one `take N` or `burst N` line at a time, read on this thread, which
/// runs the store's connections only while a step is being answered.
fn steps(runtime: &tokio::runtime::Runtime, shared: &Shared) {
    let (limiter, store) = runtime.block_on(shared.limiter_and_store());
    print_line("ready\n");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let step = line.split_once(' ').and_then(|(verb, count)| {
            let count: u64 = count.trim().parse().ok()?;
            matches!(verb, "take" | "burst").then_some((verb == "burst", count))
        });
        let Some((at_once, count)) = step else {
            eprintln!("expected `take N` or `burst N`, read {line:?}");
            std::process::exit(2);
        };
        let batched_before = store.batched_acquires();
        let granted = if at_once {
            runtime.block_on(burst(&limiter, &shared.names[0], count))
        } else {
            runtime.block_on(take(&limiter, &shared.names[0], count))
        };
        let batched = store.batched_acquires() - batched_before;
        print_line(&format!("taken {granted} {batched}\n"));
    }
}

/// Print one answer's line; whether it was a grant.
fn print_answer(name: &str, answer: tollgate::Result<Outcome>) -> bool {
    match answer {
        Ok(outcome) => match outcome.granted() {
            Some(permit) => {
                print_line(&format!("grant {} 1 {name}\n", permit.decided_at_us()));
                true
            }
            None => false,
        },
        Err(error) => {
            print_line(&format!("error {error}\n"));
            false
        }
    }
}

/// Ask `count` times for one unit of `name`, without waiting; the grants.
async fn take(limiter: &Limiter, name: &str, count: u64) -> u64 {
    let mut granted = 0;
    for _ in 0..count {
        let answer = limiter.try_acquire(&Request::new(name)).await;
        granted += u64::from(print_answer(name, answer));
    }
    granted
}

/// Ask `count` times for one unit of `name` at once, without waiting; the grants. The asks are
/// polled together in this task: on a runtime of one thread, each reaches the store in the
/// first pass, before any call is sent, so the store finds its slot busy with the first calls
/// and batches the rest.
async fn burst(limiter: &Limiter, name: &str, count: u64) -> u64 {
    let request = Request::new(name);
    let asks = (0..count).map(|_| limiter.try_acquire(&request));
    let answers = futures_util::future::join_all(asks).await;
    answers
        .into_iter()
        .map(|answer| u64::from(print_answer(name, answer)))
        .sum()
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

/// How a `--priority` worker asks: loops that ask again as soon as they are answered, or
/// requests started at a steady rate.
enum Mode {
    Loops(u64),
    Rate(u64),
}

impl Mode {
    /// How long one request of the mode waits: a bulk loop has all the time it needs, an
    /// interactive request gives up after a few seconds.
    fn wait(&self) -> Duration {
        match self {
            Mode::Loops(_) => Duration::from_secs(30),
            Mode::Rate(_) => Duration::from_secs(5),
        }
    }
}

fn mode(args: &[String], index: usize) -> Mode {
    let text: String = argument(args, index, "MODE");
    let parsed = match text.split_once(':') {
        Some(("loops", count)) => count.parse().ok().map(Mode::Loops),
        Some(("rate", per_second)) => per_second.parse().ok().map(Mode::Rate),
        _ => None,
    };
    match parsed {
        Some(Mode::Loops(0) | Mode::Rate(0 | 1_001..)) | None => {
            eprintln!("{USAGE}\nbad MODE {text:?}: loops:N or rate:R, N above 0, R 1 to 1000");
            std::process::exit(2);
        }
        Some(mode) => mode,
    }
}

/// The wall clock, in microseconds since the epoch: the clock the vendor stamps arrivals with.
fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// What a `--priority` worker's requests share.
struct Asker {
    limiter: Limiter,
    name: String,
    priority: Priority,
    wait: Duration,
    vendor: String,
    grants: AtomicU64,
    denials: AtomicU64,
    errors: AtomicU64,
}

impl Asker {
    /// One request: acquire, waiting up to the mode's wait, then on a grant call the vendor.
    async fn ask(&self) {
        let start_us = wall_clock_us();
        let request = Request::new(&self.name)
            .priority(self.priority)
            .wait(self.wait)
            .refundable(false);
        let failure = match self.limiter.acquire(&request).await {
            Ok(Outcome::Granted(_)) => {
                let granted_us = wall_clock_us();
                match self.call_vendor(start_us, granted_us).await {
                    Ok(()) => {
                        self.grants.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Err(error) => format!("vendor: {error}"),
                }
            }
            Ok(Outcome::Denied(_)) => {
                self.denials.fetch_add(1, Ordering::Relaxed);
                print_line(&format!("denied {start_us}\n"));
                return;
            }
            Err(error) => error.to_string(),
        };
        self.errors.fetch_add(1, Ordering::Relaxed);
        print_line(&format!("error {failure}\n"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    async fn call_vendor(&self, start_us: u64, granted_us: u64) -> std::io::Result<()> {
        let mut stream = tokio::net::TcpStream::connect(&self.vendor).await?;
        let line = format!(
            "library {} {start_us} {granted_us}\n",
            self.priority.as_str()
        );
        stream.write_all(line.as_bytes()).await?;
        let mut answer = String::new();
        tokio::io::BufReader::new(stream)
            .read_line(&mut answer)
            .await?;
        if answer.trim_end() == "ok" {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("answered {answer:?}")))
        }
    }
}

/// The `--priority` mode (see the module's docs).
async fn priority(args: &[String]) {
    let shared = Shared::parse(args, 5);
    let priority = match args.get(6).map(|text| Priority::parse(text)) {
        Some(Some(priority)) => priority,
        _ => {
            eprintln!("{USAGE}\nbad or missing PRIORITY");
            std::process::exit(2);
        }
    };
    let mode = mode(args, 7);
    let vendor: String = argument(args, 8, "VENDOR_ADDR");
    let duration_ms: u64 = argument(args, 9, "DURATION_MS");
    let asker = Arc::new(Asker {
        limiter: shared.limiter().await,
        name: shared.names[0].clone(),
        priority,
        wait: mode.wait(),
        vendor,
        grants: AtomicU64::new(0),
        denials: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    print_line("ready\n");
    let started = tokio::time::Instant::now();
    let end = started + Duration::from_millis(duration_ms);
    let mut tasks = Vec::new();
    match mode {
        Mode::Loops(loops) => {
            for _ in 0..loops {
                let asker = asker.clone();
                tasks.push(tokio::spawn(async move {
                    // A request still waiting at the end is dropped, which leaves the queue.
                    let _ = tokio::time::timeout_at(end, async {
                        loop {
                            asker.ask().await;
                        }
                    })
                    .await;
                }));
            }
        }
        Mode::Rate(per_second) => {
            let every = Duration::from_micros(1_000_000 / per_second);
            let mut at = started;
            while at < end {
                tokio::time::sleep_until(at).await;
                let asker = asker.clone();
                tasks.push(tokio::spawn(async move { asker.ask().await }));
                at += every;
            }
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    print_line(&format!(
        "done {} {} {}\n",
        asker.grants.load(Ordering::Relaxed),
        asker.denials.load(Ordering::Relaxed),
        asker.errors.load(Ordering::Relaxed)
    ));
}
