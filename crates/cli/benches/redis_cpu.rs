//! Redis CPU per decision, from `INFO commandstats` (`usec_per_call`): Tollgate's decisions
//! through the library (`RedisStore` under a `Limiter`) and through the server (`tollgate serve
//! --store redis://...` over HTTP), beside two peers measured in the same run on the same Redis:
//! redis-cell's `CL.THROTTLE` (when the module is loaded) and a rate-limiter-flexible style
//! `INCR` + `PEXPIRE` script called by `EVALSHA`.
//!
//! Every case spreads its decisions over 10,000 keys, 32 at a time, at 100 per second per key,
//! which the load never reaches: every decision is a grant. Before each case one decision per
//! key is made untimed, then `CONFIG RESETSTAT`; after the case's decisions `INFO commandstats`
//! gives the calls and the microseconds Redis spent in them (the commands a script or module
//! runs inside are part of its call's time). Beside it, `INFO cpu` before and after gives the
//! CPU time Redis's main thread used (`cpu/decision`): all it did for the case (reading the
//! requests and writing the replies too), and never the time it lost its core mid-command,
//! which a command's `usec` counts and which grows with the load on the machine. Cases:
//!
//! - GCRA (100 per second, burst 100), `Request::refundable(false)` / `POST /v1/check`;
//! - fixed window (100 per second), the same;
//! - sliding window (100 per second) with a refundable permit: acquire, then commit it with
//!   `used` = cost; both calls count, so a decision is two `FCALL`s;
//! - through the library only: GCRA at high priority on keys where a low-priority request of
//!   another process waits (one place in each key's queue across the fleet): what reading the
//!   queue costs while waiters exist.
//!
//! Through the library the rows above send one call per acquire (the store's batching off).
//! Then each case again at 64 in flight, with batching off and on (acquires that arrive while
//! their slot's calls are in flight go together in the next call; the batched GCRA and fixed
//! rows' target is `CL.THROTTLE`'s time), and GCRA at one in flight with batching off and on:
//! decisions/s is then one over a decision's latency, which batching must not lengthen.
//!
//! `BENCH_LONE=1` runs `CL.THROTTLE` and one decision in flight alone: GCRA and sliding with
//! its commit through the library (batching off, then on as the server has it), through the
//! server, then through the library at the server's pace (each decision followed by a wait
//! that makes it last as long as one through the server did), so that Redis waits as long
//! between calls, and each key comes back as late, on both paths. Every row also lists the
//! commands Redis ran per decision, those a script runs included (`INSIDE`): one path sending
//! more than the other for the same case shows there.
//!
//! `BENCH_MODULE=1` runs `CL.THROTTLE` and the direct rows alone, on a Redis with
//! `tollgate-redis-module` loaded: one counter's acquire as the store packs it on one Redis
//! (its key budget in the call), built by the bench and sent as one call, no store between,
//! decided by the function library (`FCALL`) and by the module (`TOLLGATE.ACQUIRE`, the same
//! keys and numbers): GCRA (a final grant), sliding (a grant recorded as a reservation) alone,
//! and sliding with the reservation's commit (`FCALL`, or `TOLLGATE.COMMIT` on the module's
//! row); then GCRA acquires in batches of 64, packed as the store packs a batch. The module's
//! GCRA row's target is 2x `CL.THROTTLE`, its sliding + commit row's 4x, its batched row's
//! 1.5x. `per core/s` is one over the CPU time Redis's main thread used per decision: what one
//! Redis core could decide.
//!
//! And the floor, beside the peers: a registered function that does the I/O of one of
//! Tollgate's decisions and decides nothing (`FLOOR_LIBRARY`'s `floor_io`), and one that returns
//! 1 (`floor_one`): what any scripted decision of Tollgate's shape costs Redis at the least; and
//! `floor_batch`, the I/O of 64 decisions in one call (the clock and the generation read once,
//! every counter's keys in one `MGET`): what a decision costs at the least when decisions in
//! flight go to Redis together.
//!
//! `scripts/bench-redis-cpu` builds redis-cell, starts a private Redis with it and runs this
//! with `BENCH_REDIS_PORT` set. The bench resets that Redis's statistics: never point it at a
//! Redis other work uses. `BENCH_DECISIONS` (default 50,000) decisions per case over
//! `BENCH_KEYS` keys (default 10,000); `BENCH_ROUNDS` (default 1, the script's 3) repeats the
//! whole table, then prints each row at its lowest over the rounds. With `BENCH_CALLGRIND_PID`
//! and `BENCH_CALLGRIND_DIR` (the script's `BENCH_CALLGRIND=1`: Redis under callgrind) each
//! case also counts the instructions Redis executed for its measured decisions. Each Tollgate
//! row is also set against its target: a GCRA or fixed-window decision at most 3x
//! `CL.THROTTLE`'s Redis time, a sliding-window decision with a refundable permit at most 6x, a
//! batched GCRA or fixed-window decision at 64 in flight at most 1x. Without `--bench` (under
//! `cargo test --all-targets`) it does nothing.

// Shared with the other benches; this one uses part of it.
#[allow(dead_code)]
mod common;

use std::collections::HashMap;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::Method;
use redis::aio::MultiplexedConnection;
use tollgate::store::CounterId;
use tollgate::{
    Algorithm, Limit, Limiter, LimiterConfig, PermitSecret, Policy, Priority, Request, Reserve,
};
use tollgate_cli::client::Client;
use tollgate_redis::{RedisStore, RedisStoreConfig, queue};

use common::Process;

/// Keys each case spreads its decisions over: `BENCH_KEYS`, 10,000 unless told.
fn key_count() -> usize {
    static KEYS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *KEYS.get_or_init(|| env_number("BENCH_KEYS", 10_000).max(1) as usize)
}
/// Decisions in flight at once: enough to keep Redis busy.
const CALLERS: usize = 32;
/// Decisions in flight at once in the batched rows.
const BATCHED: usize = 64;
const TIMEOUT: Duration = Duration::from_secs(10);
const ADMIN_TOKEN: &str = "bench";
/// Every policy: 100 units per second per key.
const LIMIT: u64 = 100;
const PERIOD_MS: u64 = 1000;
/// The peer script: count in a window that starts at the key's first call.
const INCR_PEXPIRE: &str = "local current = redis.call('INCR', KEYS[1])\n\
    if current == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end\n\
    return current";

/// What one case cost Redis.
#[derive(Clone, Copy, Debug)]
struct Figures {
    decisions: u64,
    calls: u64,
    usec: u64,
    /// CPU time Redis's main thread used meanwhile (`INFO cpu`), in microseconds.
    cpu_us: f64,
    /// Instructions Redis executed meanwhile, when it runs under callgrind.
    instructions: Option<u64>,
    elapsed: Duration,
    /// Every command Redis ran meanwhile, those run inside a script or module included (the
    /// bench's own `INFO` and `CONFIG` left out), in `INSIDE`'s order, the rest last.
    commands: [u64; INSIDE.len() + 1],
}

/// The commands counted apart in `Figures::commands`: what a decision of the store runs inside
/// its call (a second `GET` and `SET` are a key budget's admission).
const INSIDE: [&str; 5] = ["time", "mget", "get", "set", "pexpire"];

impl Figures {
    fn usec_per_call(&self) -> f64 {
        self.usec as f64 / self.calls.max(1) as f64
    }
    fn calls_per_decision(&self) -> f64 {
        self.calls as f64 / self.decisions.max(1) as f64
    }
    fn usec_per_decision(&self) -> f64 {
        self.usec as f64 / self.decisions.max(1) as f64
    }
    fn cpu_per_decision(&self) -> f64 {
        self.cpu_us / self.decisions.max(1) as f64
    }
    fn instructions_per_decision(&self) -> Option<f64> {
        self.instructions
            .map(|count| count as f64 / self.decisions.max(1) as f64)
    }
    /// Decisions one Redis core could make at this CPU time per decision.
    fn per_core_second(&self) -> f64 {
        1e6 / self.cpu_per_decision().max(1e-9)
    }
    fn per_second(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Every command per decision, and each of `INSIDE` then the rest, as `time 1.00, ...`.
    fn commands_per_decision(&self) -> (f64, String) {
        let per = |calls: u64| calls as f64 / self.decisions.max(1) as f64;
        let each = INSIDE
            .iter()
            .chain(&["other"])
            .zip(self.commands)
            .map(|(name, calls)| format!("{name} {:.2}", per(calls)))
            .collect::<Vec<_>>()
            .join(", ");
        (per(self.commands.iter().sum()), each)
    }
}

/// `calls` and `usec` of every command in `INFO commandstats`, by name (`fcall`, `evalsha`,
/// `cl.throttle`, ...).
async fn commandstats(connection: &mut MultiplexedConnection) -> HashMap<String, (u64, u64)> {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO commandstats");
    let mut table = HashMap::new();
    for line in text.lines() {
        let Some((name, fields)) = line
            .trim()
            .strip_prefix("cmdstat_")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        let field = |wanted: &str| {
            fields
                .split(',')
                .find_map(|pair| pair.strip_prefix(wanted)?.strip_prefix('='))
                .and_then(|value| value.parse::<u64>().ok())
                .unwrap_or(0)
        };
        table.insert(name.to_owned(), (field("calls"), field("usec")));
    }
    table
}

/// CPU time Redis's main thread has used (`INFO cpu`, user and system), in microseconds: what
/// it spent, wherever it spent it (reading requests, running commands, writing replies), and
/// unlike a command's `usec` not the time it lost its core mid-command.
async fn main_thread_cpu_us(connection: &mut MultiplexedConnection) -> f64 {
    let text: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(connection)
        .await
        .expect("INFO cpu");
    text.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .filter(|(name, _)| {
            matches!(
                *name,
                "used_cpu_sys_main_thread" | "used_cpu_user_main_thread"
            )
        })
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum::<f64>()
        * 1e6
}

/// The Redis under callgrind that `scripts/bench-redis-cpu` started when `BENCH_CALLGRIND=1`
/// (`BENCH_CALLGRIND_PID`, its dumps in `BENCH_CALLGRIND_DIR`): counting starts and stops
/// around each case's measured decisions, and the count is every instruction Redis executed
/// for them, whatever else the machine did meanwhile.
struct Callgrind {
    pid: String,
    directory: std::path::PathBuf,
}

impl Callgrind {
    fn from_env() -> Option<Callgrind> {
        Some(Callgrind {
            pid: std::env::var("BENCH_CALLGRIND_PID").ok()?,
            directory: std::env::var("BENCH_CALLGRIND_DIR").ok()?.into(),
        })
    }

    fn control(&self, option: &str) {
        let status = Command::new("callgrind_control")
            .args([option, self.pid.as_str()])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("callgrind_control runs");
        assert!(status.success(), "callgrind_control {option} failed");
    }

    fn start(&self) {
        self.control("--instr=on");
        self.control("--zero");
    }

    /// Stop counting; the instructions counted since `start`, from the dump it writes (read
    /// once it is complete: its last line is its totals).
    fn stop(&self) -> u64 {
        let dumps = || {
            std::fs::read_dir(&self.directory)
                .map(|entries| entries.filter_map(|entry| entry.ok()).count())
                .unwrap_or(0)
        };
        let before = dumps();
        self.control("--dump");
        self.control("--instr=off");
        for _ in 0..600 {
            if dumps() > before
                && let Some(count) = self.newest_summary()
            {
                return count;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no complete callgrind dump in {}", self.directory.display());
    }

    fn newest_summary(&self) -> Option<u64> {
        let newest = std::fs::read_dir(&self.directory)
            .ok()?
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
            .max()?
            .1;
        let text = std::fs::read_to_string(newest).ok()?;
        if !text.lines().any(|line| line.starts_with("totals:")) {
            return None;
        }
        text.lines()
            .find_map(|line| line.strip_prefix("summary:"))
            .and_then(|count| count.trim().parse().ok())
    }
}

async fn reset_stats(connection: &mut MultiplexedConnection) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(connection)
        .await
        .expect("CONFIG RESETSTAT");
}

/// `decisions` calls of `one`, `in_flight` at a time, the n-th on key `n % key_count()`.
async fn drive<F, Fut>(decisions: u64, in_flight: usize, one: F) -> Duration
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut callers = Vec::with_capacity(in_flight);
    for _ in 0..in_flight {
        let next = next.clone();
        let one = one.clone();
        callers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= decisions {
                    break;
                }
                one((n % key_count() as u64) as usize).await;
            }
        }));
    }
    for caller in callers {
        caller.await.expect("a caller");
    }
    started.elapsed()
}

/// One decision per key untimed, then `decisions` measured, `CALLERS` at a time: the calls of
/// `commands` and the microseconds Redis spent in them.
async fn measure<F, Fut>(
    stats: &mut MultiplexedConnection,
    commands: &[&str],
    decisions: u64,
    one: F,
) -> Figures
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    measure_in_flight(stats, commands, decisions, CALLERS, one).await
}

/// `measure`, `in_flight` at a time.
async fn measure_in_flight<F, Fut>(
    stats: &mut MultiplexedConnection,
    commands: &[&str],
    decisions: u64,
    in_flight: usize,
    one: F,
) -> Figures
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let warm = key_count() as u64;
    measure_warmed(stats, commands, (warm, decisions), in_flight, one).await
}

/// `measure_in_flight`, `one` run `warm` times first (each key once), then `runs` times measured.
async fn measure_warmed<F, Fut>(
    stats: &mut MultiplexedConnection,
    commands: &[&str],
    (warm, decisions): (u64, u64),
    in_flight: usize,
    one: F,
) -> Figures
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    drive(warm, in_flight, one.clone()).await;
    reset_stats(stats).await;
    let cpu_before = main_thread_cpu_us(stats).await;
    let callgrind = Callgrind::from_env();
    if let Some(callgrind) = &callgrind {
        callgrind.start();
    }
    let elapsed = drive(decisions, in_flight, one).await;
    let instructions = callgrind.as_ref().map(Callgrind::stop);
    let cpu_us = main_thread_cpu_us(stats).await - cpu_before;
    let table = commandstats(stats).await;
    let (calls, usec) = commands
        .iter()
        .filter_map(|command| table.get(*command))
        .fold((0, 0), |(calls, usec), (c, u)| (calls + c, usec + u));
    let mut counted = [0; INSIDE.len() + 1];
    for (name, (calls, _)) in &table {
        if name.starts_with("info") || name.starts_with("config") {
            continue;
        }
        let at = INSIDE.iter().position(|inside| inside == name);
        counted[at.unwrap_or(INSIDE.len())] += calls;
    }
    Figures {
        decisions,
        calls,
        usec,
        cpu_us,
        instructions,
        elapsed,
        commands: counted,
    }
}

/// The script commands Tollgate's store decides with: `FCALL`, or `EVALSHA` where Redis
/// refuses `FUNCTION LOAD`.
const TOLLGATE_COMMANDS: [&str; 3] = ["fcall", "evalsha", "eval"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    Gcra,
    Fixed,
    Sliding,
}

impl Case {
    const ALL: [Case; 3] = [Case::Gcra, Case::Fixed, Case::Sliding];

    fn limit(self) -> &'static str {
        match self {
            Case::Gcra => "bench-gcra",
            Case::Fixed => "bench-fixed",
            Case::Sliding => "bench-sliding",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Case::Gcra => "GCRA, refundable(false)",
            Case::Fixed => "fixed window, refundable(false)",
            Case::Sliding => "sliding, refundable permit + commit",
        }
    }

    /// Tollgate's target, as a multiple of `CL.THROTTLE`'s Redis time per decision.
    fn target(self) -> f64 {
        match self {
            Case::Gcra | Case::Fixed => 3.0,
            Case::Sliding => 6.0,
        }
    }

    fn algorithm(self) -> Algorithm {
        match self {
            Case::Gcra => Algorithm::Gcra { burst: LIMIT },
            Case::Fixed => Algorithm::Fixed,
            Case::Sliding => Algorithm::Sliding,
        }
    }

    fn policy(self) -> Policy {
        Policy::rate(
            LIMIT,
            PERIOD_MS * 1000,
            0,
            self.algorithm(),
            Reserve::default(),
        )
        .expect("a valid policy")
    }

    /// The admin API's body for this case's limit, matched on `GET /bench/<algorithm>`.
    fn rule(self) -> serde_json::Value {
        let algorithm = self.algorithm().name();
        let mut rule = serde_json::json!({"kind":"rate","limit":LIMIT,"period_ms":PERIOD_MS,
            "algorithm":algorithm,"per":"user",
            "match":{"method":"GET","path":format!("/bench/{algorithm}")}});
        if let Algorithm::Gcra { burst } = self.algorithm() {
            rule["burst"] = burst.into();
        }
        rule
    }
}

// ---- Library -------------------------------------------------------------------------------

/// `case` through the library, `in_flight` at a time; its store batches acquires that find a
/// call in flight on their slot when `batching`.
#[allow(clippy::too_many_arguments)]
async fn library_case(
    (limiter, store): (&Limiter, &RedisStore),
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    case: Case,
    decisions: u64,
    in_flight: usize,
    batching: bool,
) -> Figures {
    store.set_batching(batching);
    let limiter = limiter.clone();
    let keys = keys.clone();
    let one = move |k: usize| {
        let limiter = limiter.clone();
        let keys = keys.clone();
        async move {
            let request = Request::new(case.limit()).key(&keys[k]);
            let request = match case {
                Case::Sliding => request,
                Case::Gcra | Case::Fixed => request.refundable(false),
            };
            let permit = limiter
                .try_acquire(&request)
                .await
                .expect("the store answers")
                .granted()
                .expect("a grant: the bench's limits never bind");
            if case == Case::Sliding {
                permit.commit(1).await.expect("the commit is taken");
            }
        }
    };
    let figures = measure_in_flight(stats, &TOLLGATE_COMMANDS, decisions, in_flight, one).await;
    store.set_batching(true);
    figures
}

/// `case` through the library one decision at a time, batching off, each decision (the
/// acquire, and the commit of a sliding one) followed by a busy wait until `interval` has
/// passed since it began: the library at the server's pace, so that Redis waits as long
/// between calls, and its keys come back as often, as through the server.
async fn library_paced_case(
    limiter: &Limiter,
    store: &RedisStore,
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    case: Case,
    decisions: u64,
    interval: Duration,
) -> Figures {
    store.set_batching(false);
    let limiter = limiter.clone();
    let keys = keys.clone();
    let one = move |k: usize| {
        let limiter = limiter.clone();
        let keys = keys.clone();
        async move {
            let began = Instant::now();
            let request = Request::new(case.limit()).key(&keys[k]);
            let request = match case {
                Case::Sliding => request,
                Case::Gcra | Case::Fixed => request.refundable(false),
            };
            let permit = limiter
                .try_acquire(&request)
                .await
                .expect("the store answers")
                .granted()
                .expect("a grant: the bench's limits never bind");
            if case == Case::Sliding {
                permit.commit(1).await.expect("the commit is taken");
            }
            // Asleep for most of the rest (a sleep overshoots by tens of microseconds), then
            // busy to the end.
            let rest = interval.saturating_sub(began.elapsed());
            if rest > PACE_SPIN {
                std::thread::sleep(rest - PACE_SPIN);
            }
            while began.elapsed() < interval {
                std::hint::spin_loop();
            }
        }
    };
    let figures = measure_in_flight(stats, &TOLLGATE_COMMANDS, decisions, 1, one).await;
    store.set_batching(true);
    figures
}

/// The last part of a paced decision's interval spent busy rather than asleep.
const PACE_SPIN: Duration = Duration::from_micros(150);

/// The limit of the case with waiters: GCRA as `Case::Gcra`.
const WAITED: &str = "bench-gcra-waited";

/// GCRA at high priority, `refundable(false)`, on keys where a low-priority request of another
/// process waits: each key's queue holds one place (written here, living an hour), which every
/// decision reads and ranks behind itself. What the queue across the fleet costs while
/// waiters exist and nobody ahead.
async fn library_waited_case(
    limiter: &Limiter,
    store: &RedisStore,
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    decisions: u64,
) -> Figures {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(stats)
        .await
        .expect("Redis's clock");
    let now_us = seconds * 1_000_000 + micros;
    for (k, key) in keys.iter().enumerate() {
        let place = queue::Place {
            rank: queue::Rank {
                priority: 0,
                arrival_us: now_us,
                id: k as u64 + 1,
            },
            cost: 1,
            expires_us: now_us + 3_600_000_000,
        };
        let counter = CounterId {
            limit: WAITED,
            key: Some(key),
        };
        let _: () = redis::cmd("SET")
            .arg(store.queue_key(counter))
            .arg(queue::encode(&[place]))
            .arg("PX")
            .arg(3_600_000)
            .query_async(stats)
            .await
            .expect("a place written");
    }
    let limiter = limiter.clone();
    let keys = keys.clone();
    let one = move |k: usize| {
        let limiter = limiter.clone();
        let keys = keys.clone();
        async move {
            let request = Request::new(WAITED)
                .key(&keys[k])
                .priority(Priority::High)
                .refundable(false);
            let permit = limiter
                .try_acquire(&request)
                .await
                .expect("the store answers")
                .granted();
            assert!(permit.is_some(), "nobody waits ahead of a high request");
        }
    };
    measure(stats, &TOLLGATE_COMMANDS, decisions, one).await
}

async fn library_limiter(url: &str) -> (Limiter, Arc<RedisStore>) {
    let namespace = format!("bench-library-{}", std::process::id());
    let store = RedisStore::connect(RedisStoreConfig {
        url: url.to_owned(),
        namespace,
        fail_open: false,
        allow_eviction: false,
        module: tollgate_redis::Module::Auto,
        timeout: TIMEOUT,
        keys_per_limit_max: 100_000,
    })
    .await
    .expect("connect the store to the bench Redis");
    // A namespace never used: nothing to hold (G6).
    store
        .begin_new_namespace()
        .await
        .expect("declare the namespace new");
    match store.function_library() {
        Some(name) => println!("Tollgate's store decides by FCALL of the library {name}"),
        None => println!("Tollgate's store decides by EVALSHA (FUNCTION LOAD was refused)"),
    }
    let store = Arc::new(store);
    let limiter = Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max: Duration::from_secs(1),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    for case in Case::ALL {
        limiter.set_limit(Limit::new(case.limit(), case.policy(), Some("user")).expect("a limit"));
    }
    limiter.set_limit(Limit::new(WAITED, Case::Gcra.policy(), Some("user")).expect("a limit"));
    (limiter, store)
}

// ---- Server --------------------------------------------------------------------------------

/// `tollgate serve` on the Redis at `url`, with its rules in `directory`: the process and its
/// base URL.
fn start_server(directory: &Path, url: &str, namespace: &str) -> (Process, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--log", "warn"])
        .args(["--store", url, "--redis-namespace", namespace])
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        // One replica: any secret will do; set, so that the server does not warn.
        .env("TOLLGATE_PERMIT_SECRET", "0123456789abcdef0123456789abcdef")
        .current_dir(directory);
    common::start_serving(command)
}

async fn server_limits(base: &str) {
    let admin = Client::new(base, Some(ADMIN_TOKEN.into()), TIMEOUT).expect("a client");
    for case in Case::ALL {
        let path = format!("/v1/limits/{}", case.limit());
        let put = admin
            .send(Method::PUT, &path, Some(&case.rule()))
            .await
            .expect("PUT a limit");
        assert_eq!(put.status, 200, "{}", put.text());
    }
}

async fn server_case(
    base: &str,
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    case: Case,
    decisions: u64,
    in_flight: usize,
) -> Figures {
    // One client: its pool keeps a keep-alive connection per caller.
    let client = Client::new(base, None, TIMEOUT).expect("a client");
    let keys = keys.clone();
    let one = move |k: usize| {
        let client = client.clone();
        let keys = keys.clone();
        async move {
            let key = keys[k].as_str();
            if case != Case::Sliding {
                let path = format!("/bench/{}", case.algorithm().name());
                let body = serde_json::json!({"user":key,"method":"GET","path":path});
                let answer = client
                    .send(Method::POST, "/v1/check", Some(&body))
                    .await
                    .expect("check");
                assert_eq!(answer.status, 200, "{}", answer.text());
                let matched = answer.json.as_ref().map(|json| &json["matched"][0]);
                assert_eq!(
                    matched.and_then(|name| name.as_str()),
                    Some(case.limit()),
                    "{}",
                    answer.text()
                );
                return;
            }
            let body = serde_json::json!({"limits":[case.limit()],"key":key});
            common::acquire_and_commit(&client, &body, &serde_json::json!({"used":1})).await;
        }
    };
    measure_in_flight(stats, &TOLLGATE_COMMANDS, decisions, in_flight, one).await
}

// ---- Peers ---------------------------------------------------------------------------------

/// `CL.THROTTLE key 99 100 1 1`: a burst of 100 (redis-cell's `max_burst` + 1), 100 per
/// second, one unit: Tollgate's GCRA case.
fn throttle(key: &str) -> redis::Cmd {
    let mut command = redis::cmd("CL.THROTTLE");
    command
        .arg(format!("cell:{key}"))
        .arg(LIMIT - 1)
        .arg(LIMIT)
        .arg(PERIOD_MS / 1000)
        .arg(1);
    command
}

async fn cell_loaded(connection: &mut MultiplexedConnection) -> bool {
    throttle("probe")
        .query_async::<Vec<i64>>(connection)
        .await
        .is_ok()
}

async fn cell_case(
    connection: &MultiplexedConnection,
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    decisions: u64,
) -> Figures {
    let connection = connection.clone();
    let keys = keys.clone();
    let one = move |k: usize| {
        let mut connection = connection.clone();
        let keys = keys.clone();
        async move {
            let answer: Vec<i64> = throttle(&keys[k])
                .query_async(&mut connection)
                .await
                .expect("CL.THROTTLE");
            assert_eq!(answer.first(), Some(&0), "CL.THROTTLE limited: {answer:?}");
        }
    };
    measure(stats, &["cl.throttle"], decisions, one).await
}

/// The floor: a function library of two, loaded with `FUNCTION LOAD REPLACE`. `floor_io` does
/// the I/O of one of Tollgate's decisions and no decision: it reads Redis's clock (`TIME`), one
/// key (`GET`, as the generation), three more in one `MGET` (a counter's keys), unpacks 20
/// big-endian doubles from its one argument, writes an 80-byte value packed from ten of them
/// with an expiry (`SET ... PX`), and replies with 9 numbers. `floor_one` returns 1: what a
/// call of a function costs at all.
const FLOOR_LIBRARY: &str = "#!lua name=tollgate_floor
redis.register_function('floor_io', function(keys, args)
  local time = redis.call('TIME')
  local generation = redis.call('GET', keys[1])
  local values = redis.call('MGET', keys[2], keys[3], keys[4])
  local a = { struct.unpack('>dddddddddddddddddddd', args[1]) }
  a[1] = tonumber(time[1])
  redis.call('SET', keys[2], struct.pack('>dddddddddd', a[1], a[2], a[3], a[4], a[5], a[6],
    a[7], a[8], a[9], a[10]), 'PX', 60000)
  return { 0, a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8] }
end)
redis.register_function('floor_one', function(keys, args) return 1 end)
redis.register_function('floor_batch', function(keys, args)
  local time = redis.call('TIME')
  local generation = redis.call('GET', keys[1])
  local values = redis.call('MGET', unpack(keys, 2))
  local reply = { 0, tonumber(time[1]), 0, 0 }
  for i = 1, (#keys - 1) / 3 do
    local a = { struct.unpack('>dddddddddddddddddddd', args[1], (i - 1) * 160 + 1) }
    redis.call('SET', keys[3 * i - 1], struct.pack('>dddddddddd', a[1], a[2], a[3], a[4], a[5],
      a[6], a[7], a[8], a[9], a[10]), 'PX', 60000)
    local at = #reply
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] =
      0, a[1], a[2], a[3], 0
  end
  return reply
end)
";

/// Decisions in one call of `floor_batch`: what a batch of 64 decisions in flight on one Redis
/// would hand it at once.
const FLOOR_BATCH: usize = 64;

/// Which function of the floor library a row calls.
#[derive(Clone, Copy)]
enum Floor {
    Io,
    One,
    /// `FLOOR_BATCH` decisions' I/O in one call: the clock and the generation read once, every
    /// counter's keys in one `MGET`, then a write and five numbers of reply per decision.
    Batch,
}

async fn floor_case(
    connection: &MultiplexedConnection,
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    decisions: u64,
    floor: Floor,
) -> Figures {
    let mut loader = connection.clone();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(FLOOR_LIBRARY)
        .query_async(&mut loader)
        .await
        .expect("FUNCTION LOAD of the floor library");
    let per_call = match floor {
        Floor::Batch => FLOOR_BATCH,
        Floor::Io | Floor::One => 1,
    };
    let numbers: Arc<Vec<u8>> = Arc::new(
        (0..per_call)
            .flat_map(|_| (1..=20u32).flat_map(|n| (f64::from(n) * 1_000.5).to_be_bytes()))
            .collect(),
    );
    let connection = connection.clone();
    let keys = keys.clone();
    let one = move |k: usize| {
        let mut connection = connection.clone();
        let keys = keys.clone();
        let numbers = numbers.clone();
        async move {
            let key = &keys[k];
            let mut command = redis::cmd("FCALL");
            match floor {
                Floor::Io => command
                    .arg("floor_io")
                    .arg(4)
                    .arg("floor:gen")
                    .arg(format!("floor:c:{key}"))
                    .arg(format!("floor:r:{key}"))
                    .arg(format!("floor:q:{key}"))
                    .arg(numbers.as_slice()),
                Floor::One => command.arg("floor_one").arg(0),
                Floor::Batch => {
                    command
                        .arg("floor_batch")
                        .arg(1 + 3 * FLOOR_BATCH)
                        .arg("floor:gen");
                    for i in 0..FLOOR_BATCH {
                        let key = &keys[(k * FLOOR_BATCH + i) % keys.len()];
                        command
                            .arg(format!("floor:c:{key}"))
                            .arg(format!("floor:r:{key}"))
                            .arg(format!("floor:q:{key}"));
                    }
                    command.arg(numbers.as_slice())
                }
            };
            let _: redis::Value = command
                .query_async(&mut connection)
                .await
                .expect("FCALL of the floor library");
        }
    };
    let calls = (decisions / per_call as u64).max(1);
    let mut figures = measure(stats, &["fcall"], calls, one).await;
    figures.decisions = calls * per_call as u64;
    figures
}

async fn incr_case(
    connection: &MultiplexedConnection,
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    decisions: u64,
) -> Figures {
    let mut loader = connection.clone();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(INCR_PEXPIRE)
        .query_async(&mut loader)
        .await
        .expect("SCRIPT LOAD");
    let sha = Arc::new(sha);
    let connection = connection.clone();
    let keys = keys.clone();
    let one = move |k: usize| {
        let mut connection = connection.clone();
        let keys = keys.clone();
        let sha = sha.clone();
        async move {
            let count: u64 = redis::cmd("EVALSHA")
                .arg(sha.as_str())
                .arg(1)
                .arg(format!("incr:{}", keys[k]))
                .arg(PERIOD_MS)
                .query_async(&mut connection)
                .await
                .expect("EVALSHA");
            assert!(count <= LIMIT, "INCR+PEXPIRE over its limit: {count}");
        }
    };
    measure(stats, &["evalsha"], decisions, one).await
}

// ---- The module ----------------------------------------------------------------------------

/// The name the bench loads the store's function library under, for calls it builds itself.
const DIRECT_FUNCTION: &str = "tollgate_bench_direct";
/// The namespace of the direct calls' keys (its generation begun once).
const DIRECT_NAMESPACE: &str = "bench-direct";
/// The protocol's operation codes the direct calls use (`tollgate-redis`'s `abi.rs`).
const OP_ACQUIRE: f64 = 1.0;
const OP_COMMIT: f64 = 2.0;
const OP_BEGIN: f64 = 6.0;
/// Normal priority, and the rate kind's and algorithms' codes, as the store sends them.
const PRIORITY_NORMAL: f64 = 1.0;
const KIND_RATE: f64 = 1.0;
const ALG_SLIDING: f64 = 1.0;
const ALG_GCRA: f64 = 3.0;
/// The key budget every direct counter is admitted in: far above the bench's keys, as the
/// store's default is, so admission always succeeds.
const KEY_BUDGET: f64 = 1_000_000.0;

/// Who decides a direct row's acquire and commit: the function library (`FCALL`) or the
/// module (`TOLLGATE.ACQUIRE`, `TOLLGATE.COMMIT`, the same keys and packed numbers).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Decider {
    Library,
    Module,
}

/// A direct row: GCRA, or sliding with a recorded reservation, its commit or not.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direct {
    Gcra,
    Sliding,
    SlidingCommit,
}

fn pack(numbers: &[f64]) -> Vec<u8> {
    numbers.iter().flat_map(|n| n.to_be_bytes()).collect()
}

impl Direct {
    /// The policy's nine numbers: kind, limit, period, margin, algorithm, burst, ttl and the
    /// two reserves (100 per second, GCRA's burst 100), as `policy_args` gives them.
    fn policy(self) -> [f64; 9] {
        let (algorithm, burst) = match self {
            Direct::Gcra => (ALG_GCRA, LIMIT as f64),
            Direct::Sliding | Direct::SlidingCommit => (ALG_SLIDING, 0.0),
        };
        let period_us = (PERIOD_MS * 1000) as f64;
        [
            KIND_RATE,
            LIMIT as f64,
            period_us,
            0.0,
            algorithm,
            burst,
            0.0,
            0.0,
            0.0,
        ]
    }

    /// A refundable grant (recorded as a reservation) for sliding, a final one for GCRA.
    fn record(self) -> f64 {
        if self == Direct::Gcra { 0.0 } else { 1.0 }
    }

    /// The acquire's numbers, as the store packs one counter's acquire on one Redis: cost 1,
    /// normal priority, one counter; its policy, no pause, its key budget at KEYS[5] (nothing
    /// carried), its queue at KEYS[6]; not waiting.
    fn acquire(self) -> Vec<u8> {
        let mut numbers = vec![OP_ACQUIRE, 1.0, PRIORITY_NORMAL, self.record(), 1.0];
        numbers.extend(self.policy());
        numbers.push(0.0);
        numbers.extend([5.0, KEY_BUDGET, 0.0, 0.0, 6.0, 0.0, 0.0]);
        pack(&numbers)
    }

    /// The commit's numbers: its policy and admission as the acquire's, the reservation's
    /// `seq`, `used` 1.
    fn commit(self, seq: i64) -> Vec<u8> {
        let mut numbers = vec![OP_COMMIT];
        numbers.extend(self.policy());
        numbers.extend([5.0, KEY_BUDGET, 0.0, 0.0, seq as f64, 1.0]);
        pack(&numbers)
    }
}

/// A direct counter's keys, the row's `tag` keeping rows apart: generation, state,
/// reservations, buckets, the key budget, the queue (the commit takes the first five).
fn direct_keys(tag: &str, key: &str) -> [String; 6] {
    let base = format!("tg:{{{DIRECT_NAMESPACE}}}:{DIRECT_NAMESPACE}");
    [
        format!("{base}:gen"),
        format!("{base}:c:{tag}:{key}"),
        format!("{base}:r:{tag}:{key}"),
        format!("{base}:q:{tag}:{key}"),
        format!("{base}:k:{tag}"),
        format!("{base}:w:{tag}:{key}"),
    ]
}

/// Whether `TOLLGATE.ACQUIRE` is loaded (`TOLLGATE.VERSION` answers).
async fn module_loaded(connection: &mut MultiplexedConnection) -> bool {
    redis::cmd("TOLLGATE.VERSION")
        .query_async::<i64>(connection)
        .await
        .is_ok()
}

/// The store's function library loaded as `DIRECT_FUNCTION`, and the direct namespace begun.
async fn load_direct(connection: &MultiplexedConnection) {
    let mut connection = connection.clone();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(tollgate_redis::library_source(DIRECT_FUNCTION))
        .query_async(&mut connection)
        .await
        .expect("FUNCTION LOAD of the store's library");
    let [generation, ..] = direct_keys("", "");
    let _: redis::Value = redis::cmd("FCALL")
        .arg(DIRECT_FUNCTION)
        .arg(1)
        .arg(generation)
        .arg(pack(&[OP_BEGIN]))
        .query_async(&mut connection)
        .await
        .expect("the direct namespace begun");
}

/// Element `at` of an array reply, as a whole number.
fn reply_number(reply: &redis::Value, at: usize) -> Option<i64> {
    let redis::Value::Array(items) = reply else {
        return None;
    };
    match items.get(at)? {
        redis::Value::Int(number) => Some(*number),
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

/// One counter's acquire (its commit too for `SlidingCommit`) per decision, built here and
/// sent as one `FCALL` or one `TOLLGATE.ACQUIRE` (and one `FCALL` or `TOLLGATE.COMMIT`): no
/// store, no batching, nothing but the calls.
async fn direct_case(
    connection: &MultiplexedConnection,
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    decisions: u64,
    (direct, decider): (Direct, Decider),
) -> Figures {
    let tag = match (direct, decider) {
        (Direct::Gcra, Decider::Library) => "gl",
        (Direct::Gcra, Decider::Module) => "gm",
        (Direct::Sliding, Decider::Library) => "sl",
        (Direct::Sliding, Decider::Module) => "sm",
        (Direct::SlidingCommit, Decider::Library) => "cl",
        (Direct::SlidingCommit, Decider::Module) => "cm",
    };
    let connection = connection.clone();
    let keys = keys.clone();
    let acquire = Arc::new(direct.acquire());
    let one = move |k: usize| {
        let mut connection = connection.clone();
        let names = direct_keys(tag, &keys[k]);
        let acquire = acquire.clone();
        async move {
            let mut call = match decider {
                Decider::Library => {
                    let mut call = redis::cmd("FCALL");
                    call.arg(DIRECT_FUNCTION);
                    call
                }
                Decider::Module => redis::cmd("TOLLGATE.ACQUIRE"),
            };
            call.arg(names.len())
                .arg(&names[..])
                .arg(acquire.as_slice());
            let reply: redis::Value = call.query_async(&mut connection).await.expect("acquire");
            assert_eq!(
                reply_number(&reply, 4),
                Some(0),
                "a direct acquire not granted: {reply:?}"
            );
            if direct == Direct::SlidingCommit {
                let seq = reply_number(&reply, 5).expect("the reservation's seq");
                let mut commit = match decider {
                    Decider::Library => {
                        let mut call = redis::cmd("FCALL");
                        call.arg(DIRECT_FUNCTION);
                        call
                    }
                    Decider::Module => redis::cmd("TOLLGATE.COMMIT"),
                };
                let committed: redis::Value = commit
                    .arg(5)
                    .arg(&names[..5])
                    .arg(direct.commit(seq))
                    .arg("tg:bench-direct:wake")
                    .query_async(&mut connection)
                    .await
                    .expect("commit");
                assert!(
                    matches!(&committed, redis::Value::Array(items)
                        if matches!(items.first(), Some(redis::Value::BulkString(s)) if s == b"ok")),
                    "a direct commit refused: {committed:?}"
                );
            }
        }
    };
    measure(
        stats,
        &["fcall", "tollgate.acquire", "tollgate.commit"],
        decisions,
        one,
    )
    .await
}

/// Acquires in one direct batch, as the store sends those that wait for their slot's call.
const DIRECT_BATCH: usize = 64;
const OP_BATCH: f64 = 10.0;

/// GCRA acquires in batches of `DIRECT_BATCH` over as many keys, each batch packed as the store
/// packs one (the generation once, each acquire's keys after the others') and sent as one
/// `FCALL` or one `TOLLGATE.ACQUIRE`, two batches in flight.
async fn direct_batches(
    connection: &MultiplexedConnection,
    keys: &Arc<Vec<String>>,
    stats: &mut MultiplexedConnection,
    decisions: u64,
    decider: Decider,
) -> Figures {
    let tag = match decider {
        Decider::Library => "bl",
        Decider::Module => "bm",
    };
    let connection = connection.clone();
    let keys = keys.clone();
    let acquire = Direct::Gcra.acquire();
    let own_numbers = acquire.len() / 8 - 1;
    let acquire = Arc::new(acquire);
    let one = move |k: usize| {
        let mut connection = connection.clone();
        let acquire = acquire.clone();
        let mut names: Vec<String> = Vec::with_capacity(1 + 5 * DIRECT_BATCH);
        let mut numbers = pack(&[OP_BATCH, DIRECT_BATCH as f64]);
        for i in 0..DIRECT_BATCH {
            let [generation, own @ ..] =
                direct_keys(tag, &keys[(k * DIRECT_BATCH + i) % keys.len()]);
            if names.is_empty() {
                names.push(generation);
            }
            numbers.extend(pack(&[(names.len() - 1) as f64, own_numbers as f64]));
            numbers.extend_from_slice(&acquire[8..]);
            names.extend(own);
        }
        async move {
            let mut call = match decider {
                Decider::Library => {
                    let mut call = redis::cmd("FCALL");
                    call.arg(DIRECT_FUNCTION);
                    call
                }
                Decider::Module => redis::cmd("TOLLGATE.ACQUIRE"),
            };
            call.arg(names.len()).arg(&names[..]).arg(numbers);
            let reply: redis::Value = call.query_async(&mut connection).await.expect("a batch");
            let redis::Value::Array(replies) = &reply else {
                panic!("a batch's reply: {reply:?}");
            };
            assert_eq!(replies.len(), DIRECT_BATCH, "one reply per acquire");
            for item in replies {
                assert_eq!(
                    reply_number(item, 4),
                    Some(0),
                    "a batched acquire not granted: {item:?}"
                );
            }
        }
    };
    let batches = decisions.div_ceil(DIRECT_BATCH as u64);
    let warm = (key_count() as u64).div_ceil(DIRECT_BATCH as u64);
    let mut figures = measure_warmed(
        stats,
        &["fcall", "tollgate.acquire"],
        (warm, batches),
        2,
        one,
    )
    .await;
    figures.decisions = batches * DIRECT_BATCH as u64;
    figures
}

/// `BENCH_MODULE=1`'s rows: each direct case decided by the library, then by the module.
async fn module_rows(
    stats: &mut MultiplexedConnection,
    peers: &MultiplexedConnection,
    keys: &Arc<Vec<String>>,
    decisions: u64,
) -> Vec<Row> {
    load_direct(peers).await;
    let mut rows = Vec::new();
    for (direct, decider, case, path, target) in [
        (
            Direct::Gcra,
            Decider::Library,
            "GCRA, acquire",
            "fcall",
            None,
        ),
        (
            Direct::Gcra,
            Decider::Module,
            "GCRA, acquire",
            "module",
            Some(2.0),
        ),
        (
            Direct::Sliding,
            Decider::Library,
            "sliding, acquire (recorded)",
            "fcall",
            None,
        ),
        (
            Direct::Sliding,
            Decider::Module,
            "sliding, acquire (recorded)",
            "module",
            None,
        ),
        (
            Direct::SlidingCommit,
            Decider::Library,
            "sliding + commit",
            "fcall",
            None,
        ),
        (
            Direct::SlidingCommit,
            Decider::Module,
            "sliding + commit",
            "module",
            Some(4.0),
        ),
    ] {
        let figures = direct_case(peers, keys, stats, decisions, (direct, decider)).await;
        rows.push(Row {
            case,
            path,
            peer: None,
            figures,
            target,
        });
    }
    for (decider, path, target) in [
        (Decider::Library, "fcall", None),
        (Decider::Module, "module", Some(1.5)),
    ] {
        let figures = direct_batches(peers, keys, stats, decisions, decider).await;
        rows.push(Row {
            case: "GCRA, acquire, batches of 64",
            path,
            peer: None,
            figures,
            target,
        });
    }
    rows
}

// ---- Report --------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Peer {
    Cell,
    Incr,
}

#[derive(Clone, Copy)]
struct Row {
    case: &'static str,
    path: &'static str,
    peer: Option<Peer>,
    figures: Figures,
    target: Option<f64>,
}

fn print_table(rows: &[Row]) {
    let peer = |which: Peer| rows.iter().find(|row| row.peer == Some(which));
    let cell = peer(Peer::Cell).map(|row| row.figures);
    let incr = peer(Peer::Incr).map(|row| row.figures.usec_per_decision());
    println!(
        "{:<40} | {:<7} | {:>6} | {:>13} | {:>14} | {:>13} | {:>13} | {:>14} | {:>12} | {:>9} | {:>13} | {:>10} | {:>11} | {:>10}",
        "case",
        "path",
        "calls",
        "usec_per_call",
        "calls/decision",
        "usec/decision",
        "x CL.THROTTLE",
        "x INCR+PEXPIRE",
        "cpu/decision",
        "cpu x CL.",
        "instr/decision",
        "instr x CL.",
        "decisions/s",
        "per core/s"
    );
    println!("{}", "-".repeat(228));
    let show = |value: Option<f64>| value.map_or("-".to_owned(), |value| format!("{value:.2}"));
    for row in rows {
        let usec = row.figures.usec_per_decision();
        let to_cell = cell.map(|cell| usec / cell.usec_per_decision().max(1e-9));
        let cpu = row.figures.cpu_per_decision();
        let cpu_to_cell = cell.map(|cell| cpu / cell.cpu_per_decision().max(1e-9));
        let instructions = row.figures.instructions_per_decision();
        let instructions_to_cell = instructions
            .zip(cell.and_then(|cell| cell.instructions_per_decision()))
            .map(|(own, cell)| own / cell.max(1e-9));
        let verdict = match (row.target, to_cell, cpu_to_cell) {
            (Some(target), Some(to_cell), Some(cpu_to_cell)) => {
                let met = |ratio: f64| if ratio <= target { "met" } else { "NOT met" };
                let by_instructions = instructions_to_cell
                    .map(|ratio| format!(", {} by instructions", met(ratio)))
                    .unwrap_or_default();
                format!(
                    "  (target {target}x: {} by usec, {} by cpu{by_instructions})",
                    met(to_cell),
                    met(cpu_to_cell)
                )
            }
            _ => String::new(),
        };
        println!(
            "{:<40} | {:<7} | {:>6} | {:>13.2} | {:>14.3} | {:>13.2} | {:>13} | {:>14} | {:>12.2} | {:>9} | {:>13} | {:>10} | {:>11.0} | {:>10.0}{verdict}",
            row.case,
            row.path,
            row.figures.calls,
            row.figures.usec_per_call(),
            row.figures.calls_per_decision(),
            usec,
            show(to_cell),
            show(incr.map(|incr| usec / incr.max(1e-9))),
            cpu,
            show(cpu_to_cell),
            instructions.map_or("-".to_owned(), |count| format!("{count:.0}")),
            show(instructions_to_cell),
            row.figures.per_second(),
            row.figures.per_core_second(),
        );
    }
    // What each row's decisions had Redis run: more commands per decision on one path than on
    // another for the same case is work the other path does not send.
    println!();
    println!(
        "{:<40} | {:<7} | {:>13} | inside (time, mget, get, set, pexpire) and other (the call itself included)",
        "case", "path", "cmds/decision"
    );
    for row in rows {
        let (all, each) = row.figures.commands_per_decision();
        println!("{:<40} | {:<7} | {all:>13.2} | {each}", row.case, row.path);
    }
}

/// Each row at its lowest Redis time per decision over the rounds: the one the rest of the
/// machine disturbed least (a command's time in `commandstats` includes any time Redis was
/// not on a core meanwhile).
fn lowest(rounds: &[Vec<Row>]) -> Vec<Row> {
    let mut best = rounds.first().cloned().unwrap_or_default();
    for round in rounds.iter().skip(1) {
        for (kept, row) in best.iter_mut().zip(round) {
            if row.figures.usec_per_decision() < kept.figures.usec_per_decision() {
                *kept = *row;
            }
        }
    }
    best
}

/// One round: the peers, then the library's cases, then the server's; with `lone`, only
/// `CL.THROTTLE` and the rows of one decision in flight (`lone_rows`); with `module`, only
/// `CL.THROTTLE` and the direct rows (`module_rows`).
#[allow(clippy::too_many_arguments)]
async fn round(
    stats: &mut MultiplexedConnection,
    peers: &MultiplexedConnection,
    cell: bool,
    (limiter, store): (&Limiter, &RedisStore),
    base: &str,
    keys: &Arc<Vec<String>>,
    decisions: u64,
    (lone, module): (bool, bool),
) -> Vec<Row> {
    let mut rows = Vec::new();
    if cell {
        rows.push(Row {
            case: "CL.THROTTLE (redis-cell)",
            path: "peer",
            peer: Some(Peer::Cell),
            figures: cell_case(peers, keys, stats, decisions).await,
            target: None,
        });
    }
    if module {
        rows.extend(module_rows(stats, peers, keys, decisions).await);
        return rows;
    }
    if lone {
        rows.extend(lone_rows(stats, (limiter, store), base, keys, decisions).await);
        return rows;
    }
    rows.push(Row {
        case: "INCR+PEXPIRE script (EVALSHA)",
        path: "peer",
        peer: Some(Peer::Incr),
        figures: incr_case(peers, keys, stats, decisions).await,
        target: None,
    });
    rows.push(Row {
        case: "floor: Tollgate's I/O, no decision",
        path: "floor",
        peer: None,
        figures: floor_case(peers, keys, stats, decisions, Floor::Io).await,
        target: None,
    });
    rows.push(Row {
        case: "floor: a function returning 1",
        path: "floor",
        peer: None,
        figures: floor_case(peers, keys, stats, decisions, Floor::One).await,
        target: None,
    });
    rows.push(Row {
        case: "floor: 64 decisions' I/O in one call",
        path: "floor",
        peer: None,
        figures: floor_case(peers, keys, stats, decisions, Floor::Batch).await,
        target: None,
    });
    let library = (limiter, store);
    // One call per acquire: what one decision costs Redis.
    for case in Case::ALL {
        rows.push(Row {
            case: case.label(),
            path: "library",
            peer: None,
            figures: library_case(library, keys, stats, case, decisions, CALLERS, false).await,
            target: Some(case.target()),
        });
    }
    store.set_batching(false);
    rows.push(Row {
        case: "GCRA, high, a low waiter on every key",
        path: "library",
        peer: None,
        figures: library_waited_case(limiter, store, keys, stats, decisions).await,
        target: None,
    });
    store.set_batching(true);
    // 64 in flight, one call each, then batched: the acquires that arrive while the slot's
    // calls are in flight go in the next call.
    for (case, batching, label) in [
        (Case::Gcra, false, "GCRA, unbatched, 64 in flight"),
        (Case::Gcra, true, "GCRA, batched, 64 in flight"),
        (Case::Fixed, false, "fixed window, unbatched, 64 in flight"),
        (Case::Fixed, true, "fixed window, batched, 64 in flight"),
        (
            Case::Sliding,
            false,
            "sliding + commit, unbatched, 64 in flight",
        ),
        (
            Case::Sliding,
            true,
            "sliding + commit, batched, 64 in flight",
        ),
    ] {
        let figures = library_case(library, keys, stats, case, decisions, BATCHED, batching).await;
        rows.push(Row {
            case: label,
            path: "library",
            peer: None,
            figures,
            target: (batching && case != Case::Sliding).then_some(1.0),
        });
    }
    // One in flight: batching must not make a lone decision wait (decisions/s is 1 / latency).
    for (batching, label) in [
        (false, "GCRA, 1 in flight, unbatched"),
        (true, "GCRA, 1 in flight, batching on"),
    ] {
        let figures = library_case(
            library,
            keys,
            stats,
            Case::Gcra,
            decisions / 10,
            1,
            batching,
        )
        .await;
        rows.push(Row {
            case: label,
            path: "library",
            peer: None,
            figures,
            target: None,
        });
    }
    for case in Case::ALL {
        rows.push(Row {
            case: case.label(),
            path: "server",
            peer: None,
            figures: server_case(base, keys, stats, case, decisions, CALLERS).await,
            target: Some(case.target()),
        });
    }
    rows
}

/// GCRA and sliding with a commit, one decision in flight, through the library (the store's
/// batching off, then on as the server has it) and through the server, one after the other:
/// what each path has Redis do per decision for the same work.
async fn lone_rows(
    stats: &mut MultiplexedConnection,
    library: (&Limiter, &RedisStore),
    base: &str,
    keys: &Arc<Vec<String>>,
    decisions: u64,
) -> Vec<Row> {
    let mut rows = Vec::new();
    let (limiter, store) = library;
    for (case, labels) in [
        (
            Case::Gcra,
            [
                "GCRA, 1 in flight, unbatched",
                "GCRA, 1 in flight, batching on",
                "GCRA, 1 in flight",
                "GCRA, 1 in flight, at the server's pace",
            ],
        ),
        (
            Case::Sliding,
            [
                "sliding + commit, 1 in flight, unbatched",
                "sliding + commit, 1 in flight, batching on",
                "sliding + commit, 1 in flight",
                "sliding + commit, 1 in flight, server's pace",
            ],
        ),
    ] {
        for (batching, label) in [(false, labels[0]), (true, labels[1])] {
            let figures = library_case(library, keys, stats, case, decisions, 1, batching).await;
            rows.push(Row {
                case: label,
                path: "library",
                peer: None,
                figures,
                target: None,
            });
        }
        let server = server_case(base, keys, stats, case, decisions, 1).await;
        rows.push(Row {
            case: labels[2],
            path: "server",
            peer: None,
            figures: server,
            target: None,
        });
        let interval = server.elapsed / server.decisions.max(1) as u32;
        let figures =
            library_paced_case(limiter, store, keys, stats, case, decisions, interval).await;
        rows.push(Row {
            case: labels[3],
            path: "library",
            peer: None,
            figures,
            target: None,
        });
    }
    rows
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {text:?}")),
        Err(_) => default,
    }
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: it builds, no more.
    if !std::env::args().any(|argument| argument == "--bench") {
        println!("redis_cpu: run scripts/bench-redis-cpu to measure");
        return;
    }
    let Ok(port) = std::env::var("BENCH_REDIS_PORT") else {
        println!(
            "redis_cpu: SKIPPED: BENCH_REDIS_PORT is unset. It resets the Redis's statistics, so \
             it runs on a private Redis: scripts/bench-redis-cpu starts one"
        );
        return;
    };
    let port: u16 = port
        .parse()
        .unwrap_or_else(|_| panic!("BENCH_REDIS_PORT must be a port, not {port:?}"));
    let decisions = env_number("BENCH_DECISIONS", 50_000).max(1);
    let rounds = env_number("BENCH_ROUNDS", 1).max(1);
    let lone = env_number("BENCH_LONE", 0) == 1;
    let module = env_number("BENCH_MODULE", 0) == 1;
    let url = format!("redis://127.0.0.1:{port}/");
    let keys: Arc<Vec<String>> = Arc::new((0..key_count()).map(|k| format!("u{k}")).collect());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let directory = tempfile::tempdir().expect("a temporary directory");
    let namespace = format!("bench-server-{}", std::process::id());
    let (server, base) = start_server(directory.path(), &url, &namespace);

    runtime.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("a Redis URL");
        let mut stats = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the bench Redis");
        let mut peers = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the bench Redis");
        // A Redis under callgrind answers a call of 64 decisions in a good part of a second.
        stats.set_response_timeout(TIMEOUT);
        peers.set_response_timeout(TIMEOUT);
        let cell = cell_loaded(&mut peers.clone()).await;
        assert!(
            !module || module_loaded(&mut peers.clone()).await,
            "BENCH_MODULE=1: TOLLGATE.ACQUIRE is not loaded in this Redis (scripts/bench-redis-cpu \
             loads it with BENCH_MODULE=1)"
        );
        if !cell {
            println!("CL.THROTTLE: SKIPPED (the redis-cell module is not loaded in this Redis)");
        }
        let (limiter, store) = library_limiter(&url).await;
        server_limits(&base).await;
        println!(
            "{decisions} decisions per case over {} keys, {} at a time, on the Redis at \
             127.0.0.1:{port}; every limit 100 per second per key (never binds)",
            key_count(),
            if lone && !module { 1 } else { CALLERS }
        );
        let mut all = Vec::new();
        for number in 1..=rounds {
            let library = (&limiter, &*store);
            let rows = round(
                &mut stats,
                &peers,
                cell,
                library,
                &base,
                &keys,
                decisions,
                (lone, module),
            )
            .await;
            println!();
            println!("round {number} of {rounds}:");
            print_table(&rows);
            all.push(rows);
        }
        if rounds > 1 {
            println!();
            println!(
                "lowest of {rounds} rounds (each row from the round where it cost Redis least):"
            );
            print_table(&lowest(&all));
        }
        limiter.shutdown();
    });
    drop(server);
}
