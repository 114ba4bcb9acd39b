//! How the Redis store scales from one master to three: decisions per second, and Redis CPU per
//! decision on each master, with the library (`RedisStore` under a `Limiter`) driving private
//! Redis processes this bench starts on loopback ports and stops when it ends:
//!
//! - `redis://`: one master (with a replica, as a deployment would have);
//! - `redis-sentinel://`: the same master and replica, followed through three Sentinels;
//! - `redis-cluster://`, one master with a replica: every slot on one node;
//! - `redis-cluster://`, three masters, each with a replica.
//!
//! Cases, each run for `BENCH_SECONDS` (default 5) by 64 callers, after one untimed decision on
//! each of its keys:
//!
//! - GCRA, 100 per second per key over 10,000 keys, `Request::refundable(false)`;
//! - sliding window, the same, with a refundable permit committed after (two calls);
//! - concurrency, 1,000 leases per key over 10,000 keys: acquire, then release (two calls);
//! - leasing: a sliding limit (10^9 per second, 50 ms margin) over 16 keys, through a
//!   `LeasingStore` (blocks of up to 256 units living up to 50 ms), so most decisions are
//!   answered in the process.
//!
//! No limit binds: every decision is a grant. Per master, `INFO commandstats` gives the script
//! calls and the microseconds spent in them, and `INFO cpu` the process's whole CPU (network
//! and replication included). "Ceiling" is the decisions per second at which the busiest
//! master's CPU would reach one core at the measured cost per decision: what the Redis side
//! could serve, whatever the client here could drive.
//!
//! On a machine with fewer cores than Redis processes plus the client, the measured decisions
//! per second say more about the machine than the topology; read the CPU per decision and the
//! ceiling. `cargo bench -p tollgate-redis --bench cluster_scale` (needs `redis-server`,
//! `redis-cli`; under `cargo test --all-targets` it does nothing).

#[path = "../tests/nodes/mod.rs"]
mod nodes;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::Store;
use tollgate::{Algorithm, Limit, Limiter, LimiterConfig, PermitSecret, Policy, Request, Reserve};
use tollgate_redis::{LeasingConfig, LeasingStore, RedisStore, RedisStoreConfig};

use nodes::{Cluster, Node, Sentinels};

const KEYS: usize = 10_000;
const LEASED_KEYS: usize = 16;
const CALLERS: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    Gcra,
    SlidingCommit,
    Concurrency,
    Leased,
}

impl Case {
    const ALL: [Case; 4] = [
        Case::Gcra,
        Case::SlidingCommit,
        Case::Concurrency,
        Case::Leased,
    ];

    fn label(self) -> &'static str {
        match self {
            Case::Gcra => "GCRA, refundable(false)",
            Case::SlidingCommit => "sliding, permit + commit",
            Case::Concurrency => "concurrency, acquire + release",
            Case::Leased => "sliding through quota leasing",
        }
    }

    fn limit(self) -> &'static str {
        match self {
            Case::Gcra => "scale-gcra",
            Case::SlidingCommit => "scale-sliding",
            Case::Concurrency => "scale-concurrency",
            Case::Leased => "scale-leased",
        }
    }

    fn keys(self) -> usize {
        match self {
            Case::Leased => LEASED_KEYS,
            _ => KEYS,
        }
    }

    fn policy(self) -> Policy {
        let rate = |limit, margin_us, algorithm| {
            Policy::rate(limit, 1_000_000, margin_us, algorithm, Reserve::default())
        };
        match self {
            Case::Gcra => rate(100, 0, Algorithm::Gcra { burst: 100 }),
            Case::SlidingCommit => rate(100, 0, Algorithm::Sliding),
            Case::Concurrency => Policy::concurrency(1_000, 30_000_000, Reserve::default()),
            Case::Leased => rate(1_000_000_000, 50_000, Algorithm::Sliding),
        }
        .expect("a valid policy")
    }

    /// One decision on key `key`, whole: acquire, and commit or release where the case does.
    async fn decide(self, limiter: &Limiter, key: &str) {
        let request = Request::new(self.limit()).key(key);
        let request = match self {
            Case::Gcra => request.refundable(false),
            _ => request,
        };
        let permit = limiter
            .try_acquire(&request)
            .await
            .expect("the store answers")
            .granted()
            .expect("a grant: the bench's limits never bind");
        match self {
            Case::SlidingCommit => {
                permit.commit(1).await.expect("the commit is taken");
            }
            Case::Concurrency => {
                permit.release().await.expect("the release is taken");
            }
            Case::Gcra | Case::Leased => {}
        }
    }
}

/// What one Redis process had done at a moment.
#[derive(Clone, Copy, Default)]
struct Reading {
    script_calls: u64,
    script_usec: u64,
    pause_reads: u64,
    cpu_usec: u64,
}

impl std::ops::Add for Reading {
    type Output = Reading;
    fn add(self, other: Reading) -> Reading {
        Reading {
            script_calls: self.script_calls + other.script_calls,
            script_usec: self.script_usec + other.script_usec,
            pause_reads: self.pause_reads + other.pause_reads,
            cpu_usec: self.cpu_usec + other.cpu_usec,
        }
    }
}

impl std::ops::Sub for Reading {
    type Output = Reading;
    fn sub(self, before: Reading) -> Reading {
        Reading {
            script_calls: self.script_calls - before.script_calls,
            script_usec: self.script_usec - before.script_usec,
            pause_reads: self.pause_reads - before.pause_reads,
            cpu_usec: self.cpu_usec - before.cpu_usec,
        }
    }
}

/// What the Redis on loopback `port` has done so far.
fn read(port: u16) -> Reading {
    let stats = nodes::query(port, &["INFO", "commandstats"]).expect("INFO commandstats");
    let mut table: HashMap<&str, (u64, u64)> = HashMap::new();
    for line in stats.lines() {
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
        table.insert(name, (field("calls"), field("usec")));
    }
    let (script_calls, script_usec) = ["fcall", "evalsha", "eval"]
        .iter()
        .filter_map(|command| table.get(command))
        .fold((0, 0), |(calls, usec), (c, u)| (calls + c, usec + u));
    let seconds = |field: &str| {
        nodes::info_field(port, "cpu", field)
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Reading {
        script_calls,
        script_usec,
        // The scripts never GET (but on a refused cost); the store GETs a limit's pause when a
        // counter's call cannot read it, on a cluster.
        pause_reads: table.get("get").map_or(0, |(calls, _)| *calls),
        cpu_usec: ((seconds("used_cpu_sys") + seconds("used_cpu_user")) * 1e6) as u64,
    }
}

/// This process's CPU so far, from `/proc/self/stat` (0 where there is none).
fn own_cpu_usec() -> u64 {
    let ticks_per_second = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(100);
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces: utime and
    // stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) * 1_000_000 / ticks_per_second
}

/// The Redis processes of one topology, and how the store reaches them.
struct Topology {
    label: String,
    url: String,
    /// Re-read before each case: the masters at that moment.
    masters: Box<dyn Fn() -> Vec<u16>>,
    replicas: Box<dyn Fn() -> Vec<u16>>,
}

/// A case's figures on one topology.
struct Figures {
    decisions: u64,
    elapsed: Duration,
    p50_us: u64,
    p99_us: u64,
    masters: Vec<(u16, Reading)>,
    replicas_cpu_usec: u64,
    client_cpu_usec: u64,
}

impl Figures {
    fn per_decision(&self, value: u64) -> f64 {
        value as f64 / self.decisions.max(1) as f64
    }
    fn total(&self) -> Reading {
        self.masters
            .iter()
            .fold(Reading::default(), |sum, (_, reading)| sum + *reading)
    }
    fn per_second(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Decisions per second at which the busiest master would spend one core.
    fn ceiling(&self) -> f64 {
        let busiest = self
            .masters
            .iter()
            .map(|(_, reading)| reading.cpu_usec)
            .max()
            .unwrap_or(0);
        self.decisions as f64 * 1e6 / busiest.max(1) as f64
    }
}

async fn limiter_on(url: &str, case: Case) -> Limiter {
    let store = RedisStore::connect(RedisStoreConfig {
        url: url.to_owned(),
        namespace: format!("scale-{}", std::process::id()),
        fail_open: false,
        allow_eviction: false,
        module: tollgate_redis::Module::Auto,
        timeout: Duration::from_secs(10),
        keys_per_limit_max: 100_000,
    })
    .await
    .expect("connect the store");
    // A namespace never used: nothing to hold (G6). Idempotent per slot.
    store
        .begin_new_namespace()
        .await
        .expect("declare the namespace new");
    let store: Arc<dyn Store> = Arc::new(store);
    let store: Arc<dyn Store> = match case {
        Case::Leased => LeasingStore::new(
            store,
            LeasingConfig {
                block_lifetime: Duration::from_millis(50),
                block_units_max: 256,
            },
        ),
        _ => store,
    };
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_secs(1),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    limiter.set_limit(Limit::new(case.limit(), case.policy(), Some("user")).expect("a limit"));
    limiter
}

/// `CALLERS` callers deciding on `keys` in turn until `until`: each one's latencies.
async fn drive(
    limiter: &Limiter,
    case: Case,
    keys: &Arc<Vec<String>>,
    until: Option<Instant>,
) -> Vec<u64> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut callers = Vec::with_capacity(CALLERS);
    for _ in 0..CALLERS {
        let (limiter, keys, next) = (limiter.clone(), keys.clone(), next.clone());
        callers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match until {
                    // Untimed: one pass over the keys.
                    None if n >= keys.len() => break,
                    Some(until) if Instant::now() >= until => break,
                    _ => {}
                }
                let asked = Instant::now();
                case.decide(&limiter, &keys[n % keys.len()]).await;
                latencies.push(asked.elapsed().as_micros() as u64);
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for caller in callers {
        latencies.extend(caller.await.expect("a caller"));
    }
    latencies
}

fn measure(
    runtime: &tokio::runtime::Runtime,
    topology: &Topology,
    case: Case,
    seconds: u64,
) -> Figures {
    let keys: Arc<Vec<String>> = Arc::new((0..case.keys()).map(|k| format!("u{k}")).collect());
    let limiter = runtime.block_on(limiter_on(&topology.url, case));
    runtime.block_on(drive(&limiter, case, &keys, None));
    let masters = (topology.masters)();
    let replicas = (topology.replicas)();
    let before: Vec<Reading> = masters.iter().map(|port| read(*port)).collect();
    let replicas_before: u64 = replicas.iter().map(|port| read(*port).cpu_usec).sum();
    let client_before = own_cpu_usec();
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let mut latencies = runtime.block_on(drive(&limiter, case, &keys, Some(until)));
    let elapsed = started.elapsed();
    let client_cpu_usec = own_cpu_usec() - client_before;
    let masters: Vec<(u16, Reading)> = masters
        .iter()
        .zip(before)
        .map(|(port, before)| (*port, read(*port) - before))
        .collect();
    let replicas_cpu_usec = replicas
        .iter()
        .map(|port| read(*port).cpu_usec)
        .sum::<u64>()
        - replicas_before;
    limiter.shutdown();
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or(0)
    };
    Figures {
        decisions: latencies.len() as u64,
        elapsed,
        p50_us: at(0.5),
        p99_us: at(0.99),
        masters,
        replicas_cpu_usec,
        client_cpu_usec,
    }
}

fn print_topology(topology: &Topology, rows: &[(Case, Figures)]) {
    println!();
    println!("{} ({})", topology.label, topology.url);
    println!(
        "{:<31} | {:>11} | {:>6} | {:>6} | {:>12} | {:>11} | {:>13} | {:>13} | {:>13} | {:>13} | {:>11}",
        "case",
        "decisions/s",
        "p50 us",
        "p99 us",
        "scripts/dec",
        "GETs/dec",
        "script us/dec",
        "master CPU us",
        "replica CPU us",
        "client CPU us",
        "ceiling/s"
    );
    println!("{}", "-".repeat(170));
    for (case, figures) in rows {
        let total = figures.total();
        println!(
            "{:<31} | {:>11.0} | {:>6} | {:>6} | {:>12.3} | {:>11.3} | {:>13.2} | {:>13.2} | {:>14.2} | {:>13.2} | {:>11.0}",
            case.label(),
            figures.per_second(),
            figures.p50_us,
            figures.p99_us,
            figures.per_decision(total.script_calls),
            figures.per_decision(total.pause_reads),
            figures.per_decision(total.script_usec),
            figures.per_decision(total.cpu_usec),
            figures.per_decision(figures.replicas_cpu_usec),
            figures.per_decision(figures.client_cpu_usec),
            figures.ceiling(),
        );
        if figures.masters.len() > 1 {
            for (port, reading) in &figures.masters {
                println!(
                    "    master :{port}: {:>5.1} % of script calls, {:>6.2} us per call, CPU {:>5.1} % of a core",
                    100.0 * reading.script_calls as f64 / total.script_calls.max(1) as f64,
                    reading.script_usec as f64 / reading.script_calls.max(1) as f64,
                    100.0 * reading.cpu_usec as f64 / figures.elapsed.as_micros().max(1) as f64,
                );
            }
        }
    }
}

fn cluster_topology(binary: &std::path::Path, masters: usize) -> Topology {
    let cluster = Arc::new(Cluster::start(binary, masters));
    let url = cluster.url();
    let ports = |nodes: Vec<&Node>| nodes.iter().map(|node| node.port).collect::<Vec<u16>>();
    // The closures own the cluster: its nodes live as long as the topology.
    let (for_masters, for_replicas) = (cluster.clone(), cluster);
    Topology {
        label: format!(
            "redis-cluster, {}",
            if masters == 1 {
                "1 master with a replica".to_owned()
            } else {
                format!("{masters} masters with a replica each")
            }
        ),
        url,
        masters: Box::new(move || ports(for_masters.masters())),
        replicas: Box::new(move || ports(for_replicas.replicas())),
    }
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: it builds, no more.
    if !std::env::args().any(|argument| argument == "--bench") {
        println!("cluster_scale: run with `cargo bench -p tollgate-redis --bench cluster_scale`");
        return;
    }
    let Some(binary) = nodes::installed_redis_server() else {
        println!("cluster_scale: SKIPPED: no redis-server on this machine");
        return;
    };
    let seconds: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .map(|text| {
            text.parse()
                .unwrap_or_else(|_| panic!("BENCH_SECONDS must be a whole number, not {text:?}"))
        })
        .unwrap_or(5)
        .max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    println!(
        "{CALLERS} callers, {seconds} s per case; every limit keyed per user, never binding; \
         CPU figures are microseconds per decision"
    );

    let sentinels = Sentinels::start(&binary, "scale");
    let (master, replica) = (sentinels.master.port, sentinels.replica.port);
    let single = [
        Topology {
            label: "redis, 1 master with a replica".into(),
            url: sentinels.master.url(),
            masters: Box::new(move || vec![master]),
            replicas: Box::new(move || vec![replica]),
        },
        Topology {
            label: "redis-sentinel, the same master and replica, 3 Sentinels".into(),
            url: sentinels.url(),
            masters: Box::new(move || vec![master]),
            replicas: Box::new(move || vec![replica]),
        },
    ];
    let mut summary: Vec<(String, Case, f64, f64, f64, usize)> = Vec::new();
    let mut run = |topology: &Topology| {
        let rows: Vec<(Case, Figures)> = Case::ALL
            .into_iter()
            .map(|case| (case, measure(&runtime, topology, case, seconds)))
            .collect();
        print_topology(topology, &rows);
        for (case, figures) in &rows {
            summary.push((
                topology.label.clone(),
                *case,
                figures.per_second(),
                figures.per_decision(figures.total().cpu_usec),
                figures.ceiling(),
                figures.masters.len(),
            ));
        }
    };
    for topology in &single {
        run(topology);
    }
    drop(single);
    drop(sentinels);
    for masters in [1, 3] {
        let topology = cluster_topology(&binary, masters);
        run(&topology);
    }

    println!();
    println!("summary: per case, each topology against one plain Redis");
    println!(
        "{:<31} | {:<62} | {:>11} | {:>14} | {:>11} | {:>16}",
        "case", "topology", "decisions/s", "CPU us/dec", "ceiling/s", "ceiling x redis"
    );
    println!("{}", "-".repeat(162));
    for case in Case::ALL {
        let rows: Vec<_> = summary.iter().filter(|row| row.1 == case).collect();
        let base = rows.first().map_or(1.0, |row| row.4);
        for (label, _, per_second, cpu, ceiling, masters) in rows {
            println!(
                "{:<31} | {:<62} | {:>11.0} | {:>14.2} | {:>11.0} | {:>16.2}",
                case.label(),
                format!("{label} [{masters}]"),
                per_second,
                cpu,
                ceiling,
                ceiling / base.max(1e-9),
            );
        }
    }
}
