//! The module loaded into a real `redis-server` (started here on a free port), beside the
//! function library: its version, and its acquires, commits and renewals interleaved with the library's
//! on the same counters, against the library alone, on one Redis clock the test sets: Redis reads the
//! time of day through `gettimeofday`, which a shim preloaded into it answers from a file (a few
//! lines of C built here with the system's `cc`, which Rust's linking needs anyway).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, module_path, redis_server};
use tollgate::conformance::skipped;

/// Redis's time of day, in microseconds, read from the file `TOLLGATE_CLOCK_FILE` names.
const CLOCK_SHIM: &str = r#"
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>
int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  char buf[32] = {0};
  int fd = open(getenv("TOLLGATE_CLOCK_FILE"), O_RDONLY);
  if (fd >= 0) { if (read(fd, buf, sizeof buf - 1) < 0) buf[0] = 0; close(fd); }
  long long us = atoll(buf);
  tv->tv_sec = us / 1000000;
  tv->tv_usec = us % 1000000;
  return 0;
}
"#;
/// Where the test's clock starts (2026-06-01), in microseconds.
const CLOCK_START_US: u64 = 1_780_272_000_000_000;
const FUNCTION: &str = "tollgate_interleave";
const OP_ACQUIRE: f64 = 1.0;
const OP_COMMIT: f64 = 2.0;
const OP_RENEW: f64 = 3.0;
const OP_BEGIN: f64 = 6.0;
/// Added to an operation's code by a store that watches evictions (`abi.rs`).
const OP_WATCH_EVICTIONS: f64 = 16.0;

/// A namespace's evictions record (the generation's key with `evicted` for `gen`).
fn evictions_record(namespace: &str) -> Vec<u8> {
    format!("tg:{{t}}:{namespace}:evicted").into_bytes()
}

/// The call of `numbers` on the two namespaces' `keys`, watching evictions when `watch`, as a
/// store that allows them sends it: the operation flagged, each namespace's evictions record
/// after its keys. The numbers packed, and each namespace's keys.
fn maybe_watching(
    watch: bool,
    mut numbers: Vec<f64>,
    (mut mixed, mut alone): (Vec<Vec<u8>>, Vec<Vec<u8>>),
    (mixed_ns, alone_ns): (&str, &str),
) -> (Vec<u8>, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    if watch {
        numbers[0] += OP_WATCH_EVICTIONS;
        mixed.push(evictions_record(mixed_ns));
        alone.push(evictions_record(alone_ns));
    }
    (pack(&numbers), mixed, alone)
}

/// Now and then (one call in 60) Redis's count of evicted keys moves, alike for both
/// `namespaces` of `counters` counters: one counter's keys gone in both (as if evicted) and the
/// count reset, or every key evicted for real. Whether it moved.
fn evictions_move(
    conn: &mut Conn,
    rng: &mut fastrand::Rng,
    namespaces: [&str; 2],
    counters: usize,
) -> bool {
    if rng.u8(..60) != 0 {
        return false;
    }
    if rng.u8(..4) == 0 {
        evict_everything(conn);
    } else {
        let gone = rng.usize(..counters);
        for namespace in namespaces {
            for key in &keys(namespace, gone)[1..5] {
                conn.call(&[b"DEL", key]);
            }
        }
        conn.call(&[b"CONFIG", b"RESETSTAT"]);
    }
    true
}

/// Redis evicts every key (every namespace alike), so its count of evicted keys moves: a
/// memory limit it cannot meet, then none again once nothing is left.
fn evict_everything(conn: &mut Conn) {
    conn.call(&[b"CONFIG", b"SET", b"maxmemory-policy", b"allkeys-random"]);
    conn.call(&[b"SET", b"tg:{t}:ballast", b"x"]);
    conn.call(&[b"CONFIG", b"SET", b"maxmemory", b"1"]);
    // A write makes Redis evict before it runs (and refuse it: the limit is never met).
    conn.call(&[b"SET", b"tg:{t}:ballast", b"x"]);
    wait_for("every key evicted", || {
        conn.call(&[b"DBSIZE"]) == Resp::Int(0)
    });
    conn.call(&[b"CONFIG", b"SET", b"maxmemory", b"0"]);
    conn.call(&[b"CONFIG", b"SET", b"maxmemory-policy", b"noeviction"]);
}

/// A RESP2 value.
#[derive(Clone, Debug, PartialEq)]
enum Resp {
    Nil,
    Int(i64),
    Bytes(Vec<u8>),
    Status(String),
    Error(String),
    Array(Vec<Resp>),
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(port: u16) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        Ok(Conn {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    fn call(&mut self, args: &[&[u8]]) -> Resp {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend(format!("${}\r\n", arg.len()).bytes());
            out.extend(*arg);
            out.extend(b"\r\n");
        }
        self.writer.write_all(&out).expect("write to redis");
        self.read()
    }

    fn read(&mut self) -> Resp {
        let mut line = Vec::new();
        self.reader
            .read_until(b'\n', &mut line)
            .expect("read from redis");
        let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        match line[0] {
            b'+' => Resp::Status(text),
            b'-' => Resp::Error(text),
            b':' => Resp::Int(text.parse().expect("integer")),
            b'$' => {
                let len: i64 = text.parse().expect("length");
                if len < 0 {
                    return Resp::Nil;
                }
                let mut body = vec![0; len as usize + 2];
                std::io::Read::read_exact(&mut self.reader, &mut body).expect("bulk");
                body.truncate(len as usize);
                Resp::Bytes(body)
            }
            b'*' => {
                let len: i64 = text.parse().expect("length");
                if len < 0 {
                    return Resp::Nil;
                }
                Resp::Array((0..len).map(|_| self.read()).collect())
            }
            other => panic!("unexpected reply byte {other}"),
        }
    }
}

/// A `redis-server` with the module loaded, on a free port, its clock set by `set_clock`;
/// stopped when dropped.
struct Server {
    children: Vec<Child>,
    port: u16,
    redis_server: String,
    clock: PathBuf,
    shim: PathBuf,
    dir: tempdir::Dir,
}

mod tempdir {
    /// A directory removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start() -> Option<Server> {
    let redis_server = redis_server()?;
    let module = module_path();
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("tollgate-module-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let clock = dir.join("clock");
    std::fs::write(&clock, CLOCK_START_US.to_string()).expect("clock file");
    let source = dir.join("clock.c");
    let shim = dir.join("clock.so");
    std::fs::write(&source, CLOCK_SHIM).expect("clock shim source");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let built = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&shim)
        .arg(&source)
        .status();
    if !built.is_ok_and(|status| status.success()) {
        let _ = std::fs::remove_dir_all(&dir);
        skipped(&format!(
            "no C compiler ({cc}) to build the test's clock for Redis"
        ));
        return None;
    }
    let mut server = Server {
        children: Vec::new(),
        port,
        redis_server,
        clock,
        shim,
        dir: tempdir::Dir(dir),
    };
    let module = module.into_os_string();
    // MODULE LOAD from the test's own (local) connection too.
    server.spawn(
        port,
        &[
            "--loadmodule".into(),
            module,
            "--enable-module-command".into(),
            "local".into(),
        ],
    );
    Some(server)
}

impl Server {
    /// A `redis-server` on `port`, its time of day the test's, started and answering.
    fn spawn(&mut self, port: u16, extra: &[std::ffi::OsString]) {
        let dir = self.dir.0.join(port.to_string());
        std::fs::create_dir_all(&dir).expect("server dir");
        let child = Command::new(&self.redis_server)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            // The time of day stands still at the file's, read again on every call.
            .env("LD_PRELOAD", &self.shim)
            .env("TOLLGATE_CLOCK_FILE", &self.clock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Conn::open(port).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A replica of the server, without the module: it can replay writes, not the module's
    /// commands.
    fn replica(&mut self) -> Conn {
        // The full sync's delay counts on the time of day, which stands still here.
        self.conn()
            .call(&[b"CONFIG", b"SET", b"repl-diskless-sync-delay", b"0"]);
        let port = free_port();
        let master = self.port.to_string();
        self.spawn(
            port,
            &["--replicaof".into(), "127.0.0.1".into(), master.into()],
        );
        let mut conn = Conn::open(port).expect("connect to the replica");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = conn.call(&[b"INFO", b"replication"]);
            if matches!(&info, Resp::Bytes(text) if text.windows(21).any(|w| w == b"master_link_status:up"))
            {
                return conn;
            }
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn conn(&self) -> Conn {
        Conn::open(self.port).expect("connect")
    }

    fn set_clock(&self, us_after_start: u64) {
        std::fs::write(&self.clock, (CLOCK_START_US + us_after_start).to_string())
            .expect("clock file");
    }
}

fn pack(numbers: &[f64]) -> Vec<u8> {
    numbers.iter().flat_map(|n| n.to_be_bytes()).collect()
}

#[test]
fn the_version_is_the_function_librarys() {
    assert_eq!(
        tollgate_redis_module::PROTOCOL_VERSION,
        tollgate_redis::PROTOCOL_VERSION
    );
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    assert_eq!(
        conn.call(&[b"TOLLGATE.VERSION"]),
        Resp::Int(tollgate_redis::PROTOCOL_VERSION as i64)
    );
}

/// One namespace's keys: the generation, then per counter its state, reservations, buckets
/// and queue, then the key budget.
fn keys(namespace: &str, counter: usize) -> Vec<Vec<u8>> {
    let base = format!("tg:{{t}}:{namespace}");
    let mut keys = vec![format!("{base}:gen").into_bytes()];
    for part in ["c", "r", "q", "w"] {
        keys.push(format!("{base}:{part}:{counter}").into_bytes());
    }
    // The limits' key budget (one for all the test's counters), at KEYS[6].
    keys.push(format!("{base}:k").into_bytes());
    keys
}

/// A policy's nine numbers: kind, limit, period, margin, algorithm, burst, ttl, reserves.
fn policies() -> Vec<[f64; 9]> {
    let s = 1_000_000.0;
    vec![
        // GCRA: 5 per 10 s (one unit every 2 s), a burst of 4, a reserve for high.
        [1.0, 5.0, 10.0 * s, 0.0, 3.0, 4.0, 0.0, 1.0, 0.0],
        // GCRA: 3 per 4 s with a margin, a burst of 3.
        [1.0, 3.0, 4.0 * s, 0.5 * s, 3.0, 3.0, 0.0, 0.0, 0.0],
        // Sliding: 4 per 6 s, a reserve for high (every instant a bucket of its own).
        [1.0, 4.0, 6.0 * s, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0],
        // Sliding: 5 per 3 s with a margin (a shorter window: buckets switched to the other
        // sliding policy count longer).
        [1.0, 5.0, 3.0 * s, 0.5 * s, 1.0, 0.0, 0.0, 0.0, 0.0],
        // A fixed window, 4 per 5 s with a margin, a reserve for high.
        [1.0, 4.0, 5.0 * s, 0.25 * s, 2.0, 0.0, 0.0, 1.0, 0.0],
        // A fixed window, 3 per 2 s (a counter switched from the other fixed window is carried
        // into this one's windows).
        [1.0, 3.0, 2.0 * s, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0],
        // A concurrency limit, 3 leases of 4 s (as the store packs one: no period, margin,
        // algorithm or burst), a reserve for high.
        [2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 4.0 * s, 1.0, 0.0],
    ]
}

/// The concurrency limit's counter, the last: every other is a rate limit's.
const CONCURRENCY: usize = 6;

/// An acquire of one counter: `record` 1 records a reservation; its limit's pause as the
/// caller read it (`-paused_until`, or 0); its admission (where its limit's key budget is, the
/// budget, the cover brought, apart); its queue at KEYS[5]; not waiting.
fn acquire_numbers(
    policy: &[f64; 9],
    cost: f64,
    priority: f64,
    record: f64,
    pause: f64,
    admission: [f64; 4],
) -> Vec<f64> {
    let mut numbers = vec![OP_ACQUIRE, cost, priority, record, 1.0];
    numbers.extend(policy);
    numbers.push(pause);
    numbers.extend(admission);
    numbers.extend([5.0, 0.0, 0.0]);
    numbers
}

fn fcall(conn: &mut Conn, keys: &[Vec<u8>], packed: &[u8]) -> Resp {
    call_on(conn, &[b"FCALL", FUNCTION.as_bytes()], keys, &[packed])
}

fn module(conn: &mut Conn, keys: &[Vec<u8>], packed: &[u8]) -> Resp {
    call_on(conn, &[b"TOLLGATE.ACQUIRE"], keys, &[packed])
}

fn stored(conn: &mut Conn, keys: &[Vec<u8>]) -> Vec<(Resp, Resp)> {
    keys.iter()
        .map(|key| (conn.call(&[b"GET", key]), conn.call(&[b"PTTL", key])))
        .collect()
}

/// A commit of one counter's reservation `seq`, `used` units of it: its policy and admission
/// (its limit's key budget, when in the call, at KEYS[5]: commits name no queue).
fn commit_numbers(policy: &[f64; 9], admission: [f64; 4], seq: f64, used: f64) -> Vec<f64> {
    let mut numbers = vec![OP_COMMIT];
    numbers.extend(policy);
    numbers.extend(admission);
    numbers.extend([seq, used]);
    numbers
}

/// A renewal of the lease `fence` of one counter: its policy and admission (its limit's key
/// budget, when in the call, at KEYS[5], as a commit's).
fn renew_numbers(policy: &[f64; 9], admission: [f64; 4], fence: f64) -> Vec<f64> {
    let mut numbers = vec![OP_RENEW];
    numbers.extend(policy);
    numbers.extend(admission);
    numbers.push(fence);
    numbers
}

/// A commit's keys (a renewal's too): the generation, the counter's three, the key budget.
fn commit_keys(namespace: &str, counter: usize) -> Vec<Vec<u8>> {
    let all = keys(namespace, counter);
    vec![
        all[0].clone(),
        all[1].clone(),
        all[2].clone(),
        all[3].clone(),
        all[5].clone(),
    ]
}

/// `command` (`FCALL <function>` or a module command) on `keys`, then `args`.
fn call_on(conn: &mut Conn, command: &[&[u8]], keys: &[Vec<u8>], args: &[&[u8]]) -> Resp {
    let count = keys.len().to_string();
    let mut all: Vec<&[u8]> = command.to_vec();
    all.push(count.as_bytes());
    all.extend(keys.iter().map(Vec::as_slice));
    all.extend(args);
    conn.call(&all)
}

/// The wake-up channel each namespace's commits publish to, and the one that ends a step.
const WAKE_MIXED: &[u8] = b"tg:mixed:wake";
const WAKE_ALONE: &[u8] = b"tg:alone:wake";
const STEP_DONE: &[u8] = b"tg:step-done";

/// A connection subscribed to both namespaces' wake-ups and to `STEP_DONE`.
fn subscriber(server: &Server) -> Conn {
    let mut conn = server.conn();
    conn.writer
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    conn.call(&[b"SUBSCRIBE", WAKE_MIXED, WAKE_ALONE, STEP_DONE]);
    for _ in 0..2 {
        conn.read();
    }
    conn
}

/// The messages published to each namespace's wake-up channel since the last step, in order:
/// read until the `STEP_DONE` message this publishes now arrives (Redis delivers in order).
fn wake_ups(conn: &mut Conn, subscriber: &mut Conn) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    assert_eq!(
        conn.call(&[b"PUBLISH", STEP_DONE, b"."]),
        Resp::Int(1),
        "the subscriber listens"
    );
    let (mut mixed, mut alone) = (Vec::new(), Vec::new());
    loop {
        let Resp::Array(message) = subscriber.read() else {
            panic!("not a message");
        };
        let (Some(Resp::Bytes(channel)), Some(Resp::Bytes(payload))) =
            (message.get(1), message.get(2))
        else {
            panic!("not a message: {message:?}");
        };
        match channel.as_slice() {
            STEP_DONE => return (mixed, alone),
            WAKE_MIXED => mixed.push(payload.clone()),
            WAKE_ALONE => alone.push(payload.clone()),
            other => panic!("a message on {}", String::from_utf8_lossy(other)),
        }
    }
}

/// The module refused a call it decides.
fn refused(step: usize, what: &str, e: &str) -> ! {
    panic!("step {step}: a {what} refused (the module decides every one here): {e}")
}

/// Steps of the interleaving test: a few seconds.
const STEPS: usize = 1_500;

/// What the interleaving test's commits must have answered, each a few times: a refund, a
/// lease's release, and each refusal.
const COMMIT_STATUSES: [&str; 6] = [
    "ok",
    "ok, refunded",
    "ok, released",
    "gone",
    "unknown",
    "used_above_cost",
];

/// What its renewals must have answered: a lease renewed, one ended (or never kept), one
/// released, a fence not handed out, a rate limit's.
const RENEW_STATUSES: [&str; 5] = [
    "ok",
    "lease_expired",
    "lease_expired, released",
    "unknown",
    "wrong_kind",
];

/// Acquires, commits and renewals of the same counters, each decided by the module or the
/// library at random in one namespace and by the library alone in another, on one Redis clock:
/// every reply, every stored value and expiry, and every wake-up published are the same.
/// Commits name reservations (and leases) still open, already committed, expired or never
/// recorded, and seqs not yet handed out, with `used` up to one above the reservation's units;
/// renewals name leases open, expired, released, fences not handed out yet, and rate limits'
/// grants (the wrong kind).
#[test]
fn the_module_and_the_library_interleaved_decide_as_the_library_alone() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    let mut wakes = subscriber(&server);
    load_library(&mut conn);
    let policies = policies();
    let seed = std::env::var("TOLLGATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("TOLLGATE_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    // Both namespaces begun (generations born at time zero): nothing is held at first.
    for namespace in ["mixed", "alone"] {
        let generation = keys(namespace, 0).swap_remove(0);
        fcall(&mut conn, &[generation], &pack(&[OP_BEGIN]));
    }
    let mut clock = 0;
    let (mut native, mut native_commits, mut native_renews, mut woken) = (0, 0, 0, 0);
    let (mut granted, mut denied) = (vec![0; policies.len()], vec![0; policies.len()]);
    let mut statuses = std::collections::BTreeMap::<String, u32>::new();
    let mut commit_statuses = std::collections::BTreeMap::<String, u32>::new();
    let mut renew_statuses = std::collections::BTreeMap::<String, u32>::new();
    // Per counter, the grants so far not committed: (seq, units, recorded as a reservation);
    // and those committed.
    let mut grants: Vec<Vec<(f64, f64, bool)>> = vec![Vec::new(); policies.len()];
    let mut committed: Vec<Vec<(f64, f64, bool)>> = vec![Vec::new(); policies.len()];
    let (mut evictions, mut since_eviction, mut held_after_eviction) = (0, 0, 0);
    // At least STEPS steps, then on until every case below was met often enough (a random
    // sequence meets the rarer ones a few times per STEPS): its coverage never left to luck.
    for step in 0..5 * STEPS {
        let covered = (0..policies.len()).all(|c| granted[c] > 5 && denied[c] > 5)
            && ["admit", "keys"]
                .iter()
                .all(|status| statuses.get(*status) > Some(&3))
            && COMMIT_STATUSES
                .iter()
                .all(|status| commit_statuses.get(*status) > Some(&3))
            && RENEW_STATUSES
                .iter()
                .all(|status| renew_statuses.get(*status) > Some(&3))
            && woken > 10
            && evictions > 3
            && held_after_eviction > 3;
        if step >= STEPS && covered {
            break;
        }
        if rng.u8(..4) == 0 {
            // Up to 3 s, to the microsecond: GCRA's intervals are 1.5 s and 2 s.
            clock += rng.u64(1..3_000_000);
            server.set_clock(clock);
        }
        if rng.u16(..150) == 0 {
            // A loss of state: the generation gone; counters are held, then recover.
            for namespace in ["mixed", "alone"] {
                conn.call(&[b"DEL", &keys(namespace, 0)[0]]);
            }
        }
        // One step in three watches evictions, as a store allowing them calls. Now and then
        // Redis's count of evicted keys moves: one counter's keys gone in both namespaces (as
        // if evicted) and the count reset, or every key evicted for real.
        let watch = rng.u8(..3) == 0;
        if evictions_move(&mut conn, &mut rng, ["mixed", "alone"], policies.len()) {
            evictions += 1;
            since_eviction = 0;
        }
        since_eviction += 1;
        // One step in four a commit, one in eight a renewal, mostly of the concurrency limit.
        let (commit, renew) = match rng.u8(..8) {
            0 | 1 => (true, false),
            2 => (false, true),
            _ => (false, false),
        };
        let counter = if renew && rng.u8(..4) != 0 {
            CONCURRENCY
        } else {
            rng.usize(..policies.len())
        };
        let cost = if rng.u8(..40) == 0 {
            9.0
        } else {
            f64::from(rng.u8(1..3))
        };
        let priority = f64::from(rng.u8(..3));
        // Now and then a counter under another policy (its units carried over to the other
        // algorithm, interval or window; made leases, or leases made a rate's), or its limit
        // paused for up to 2 s.
        let policy = if rng.u8(..12) == 0 {
            &policies[rng.usize(..policies.len())]
        } else {
            &policies[counter]
        };
        let pause = if rng.u8(..15) == 0 {
            -((CLOCK_START_US + clock + rng.u64(..2_000_000)) as f64)
        } else {
            0.0
        };
        let record = if rng.u8(..4) == 0 { 0.0 } else { 1.0 };
        let admission = {
            let now = (CLOCK_START_US + clock) as f64;
            // A budget that can be lost apart from its counters: held after a loss, which a
            // commit is admitted through and a request is not; more often for commits, which
            // meet it only on a counter not covered yet.
            let apart = f64::from(u8::from(
                rng.u8(..if commit || renew { 3 } else { 10 }) == 0,
            ));
            // The key budget's place among the call's keys.
            let here = if commit || renew { 5.0 } else { 6.0 };
            match rng.u8(..20) {
                // No key: counted in no budget.
                0..=3 => [0.0; 4],
                // The budget in another slot: the caller asked for nothing yet, or brings a
                // cover (long enough or not), or a hold after its budget's loss.
                4..=5 => [-1.0, 3.0, 0.0, apart],
                6..=7 => [-1.0, 3.0, now + rng.f64() * 60e6, apart],
                8 => [-1.0, 3.0, -(now + rng.f64() * 2e6), apart],
                // The budget here: three counters of keys at most.
                _ => [here, 3.0, 0.0, apart],
            }
        };
        let (mixed, alone, seq) = if renew {
            let now = (CLOCK_START_US + clock) as f64;
            let open = &grants[counter];
            let done = &committed[counter];
            let fence = match rng.u8(..10) {
                // A fence not handed out yet.
                0 => now + 1e9,
                // A lease released already.
                1 | 2 if !done.is_empty() => done[rng.usize(..done.len())].0,
                // Any lease not released: mostly ended.
                3 if !open.is_empty() => open[rng.usize(..open.len())].0,
                // A recent one: mostly open.
                _ if !open.is_empty() => {
                    open[rng.usize(open.len().saturating_sub(3)..open.len())].0
                }
                _ => now - 1e6,
            };
            let (packed, mixed_keys, alone_keys) = maybe_watching(
                watch,
                renew_numbers(policy, admission, fence),
                (commit_keys("mixed", counter), commit_keys("alone", counter)),
                ("mixed", "alone"),
            );
            let function: &[&[u8]] = &[b"FCALL", FUNCTION.as_bytes()];
            let mixed = if rng.bool() {
                match call_on(&mut conn, &[b"TOLLGATE.RENEW"], &mixed_keys, &[&packed]) {
                    Resp::Error(e) if e.starts_with("ERR tollgate: not native:") => {
                        refused(step, "renewal", &e)
                    }
                    reply => {
                        native_renews += 1;
                        reply
                    }
                }
            } else {
                call_on(&mut conn, function, &mixed_keys, &[&packed])
            };
            let alone = call_on(&mut conn, function, &alone_keys, &[&packed]);
            (mixed, alone, fence)
        } else if commit {
            let now = (CLOCK_START_US + clock) as f64;
            let recorded: Vec<&(f64, f64, bool)> = grants[counter].iter().filter(|g| g.2).collect();
            let finals: Vec<&(f64, f64, bool)> = grants[counter].iter().filter(|g| !g.2).collect();
            let done = &committed[counter];
            let (seq, units) = match rng.u8(..12) {
                // A seq not handed out yet.
                0 => (now + 1e9, 1.0),
                // A final grant's: never a reservation.
                1 if !finals.is_empty() => {
                    let g = finals[rng.usize(..finals.len())];
                    (g.0, g.1)
                }
                // A reservation committed already.
                2 if !done.is_empty() => {
                    let g = done[rng.usize(..done.len())];
                    (g.0, g.1)
                }
                // A reservation not committed yet, mostly a recent one (open, or expired).
                _ if !recorded.is_empty() => {
                    let from = recorded.len().saturating_sub(3);
                    let g = recorded[rng.usize(from..recorded.len())];
                    (g.0, g.1)
                }
                _ => (now - 1e6, 1.0),
            };
            // Nothing used half the time, else up to one unit above the reservation's.
            let used = if rng.bool() {
                0.0
            } else {
                f64::from(rng.u8(..=(units as u8 + 1)))
            };
            let (packed, mixed_keys, alone_keys) = maybe_watching(
                watch,
                commit_numbers(policy, admission, seq, used),
                (commit_keys("mixed", counter), commit_keys("alone", counter)),
                ("mixed", "alone"),
            );
            let function: &[&[u8]] = &[b"FCALL", FUNCTION.as_bytes()];
            let mixed = if rng.bool() {
                match call_on(
                    &mut conn,
                    &[b"TOLLGATE.COMMIT"],
                    &mixed_keys,
                    &[&packed, WAKE_MIXED],
                ) {
                    Resp::Error(e) if e.starts_with("ERR tollgate: not native:") => {
                        refused(step, "commit", &e)
                    }
                    reply => {
                        native_commits += 1;
                        reply
                    }
                }
            } else {
                call_on(&mut conn, function, &mixed_keys, &[&packed, WAKE_MIXED])
            };
            let alone = call_on(&mut conn, function, &alone_keys, &[&packed, WAKE_ALONE]);
            (mixed, alone, seq)
        } else {
            let (packed, mixed_keys, alone_keys) = maybe_watching(
                watch,
                acquire_numbers(policy, cost, priority, record, pause, admission),
                (keys("mixed", counter), keys("alone", counter)),
                ("mixed", "alone"),
            );
            let mixed = if rng.bool() {
                match module(&mut conn, &mixed_keys, &packed) {
                    Resp::Error(e) if e.starts_with("ERR tollgate: not native:") => {
                        refused(step, "acquire", &e)
                    }
                    reply => {
                        native += 1;
                        reply
                    }
                }
            } else {
                fcall(&mut conn, &mixed_keys, &packed)
            };
            let alone = fcall(&mut conn, &alone_keys, &packed);
            (mixed, alone, 0.0)
        };
        assert_eq!(mixed, alone, "step {step} (seed {seed}): replies differ");
        let kept = |conn: &mut Conn, namespace: &str| {
            let mut kept = keys(namespace, counter);
            kept.push(evictions_record(namespace));
            stored(conn, &kept)
        };
        assert_eq!(
            kept(&mut conn, "mixed"),
            kept(&mut conn, "alone"),
            "step {step} (seed {seed}): stored values or expiries differ"
        );
        // A watched acquire held (recovering) soon after an eviction was seen, the generation
        // not lost.
        if watch
            && !commit
            && !renew
            && since_eviction < 30
            && let Resp::Array(reply) = &alone
            && reply.get(3) == Some(&Resp::Int(0))
            && reply.get(4) == Some(&Resp::Int(2))
            && reply.get(7) == Some(&Resp::Int(2))
        {
            held_after_eviction += 1;
        }
        let (mixed_wakes, alone_wakes) = wake_ups(&mut conn, &mut wakes);
        let mixed_wakes: Vec<Vec<u8>> = mixed_wakes
            .iter()
            .map(|key| {
                String::from_utf8_lossy(key)
                    .replace(":mixed:", ":alone:")
                    .into_bytes()
            })
            .collect();
        assert_eq!(
            mixed_wakes, alone_wakes,
            "step {step} (seed {seed}): wake-ups published differ"
        );
        woken += alone_wakes.len();
        if let Resp::Array(reply) = &alone
            && let Some(Resp::Bytes(status)) = reply.first()
        {
            let status = String::from_utf8_lossy(status).into_owned();
            if renew {
                let released = committed[counter].iter().any(|g| g.0 == seq);
                let status = if status == "lease_expired" && released {
                    "lease_expired, released".to_owned()
                } else {
                    status
                };
                *renew_statuses.entry(status).or_default() += 1;
            } else if commit {
                let refunded = matches!(reply.get(4), Some(Resp::Int(n)) if *n > 0);
                let released = matches!(reply.get(5), Some(Resp::Int(n)) if *n > 0);
                let status = if status == "ok" && refunded {
                    "ok, refunded".to_owned()
                } else if status == "ok" && released {
                    "ok, released".to_owned()
                } else {
                    status
                };
                if status.starts_with("ok") {
                    let open = &mut grants[counter];
                    if let Some(at) = open.iter().position(|g| g.0 == seq) {
                        committed[counter].push(open.remove(at));
                    }
                }
                *commit_statuses.entry(status).or_default() += 1;
            } else {
                if status == "ok" {
                    match reply.get(4) {
                        Some(Resp::Int(0)) => {
                            granted[counter] += 1;
                            if let Some(Resp::Int(seq)) = reply.get(5) {
                                grants[counter].push((*seq as f64, cost, record == 1.0));
                            }
                        }
                        _ => denied[counter] += 1,
                    }
                }
                *statuses.entry(status).or_default() += 1;
            }
        }
    }
    eprintln!(
        "acquires: native {native}, granted {granted:?}, denied {denied:?}, {statuses:?}; \
         commits: native {native_commits}, {commit_statuses:?}, wake-ups {woken}; renewals: \
         native {native_renews}, {renew_statuses:?}"
    );
    assert!(native > STEPS / 5, "the module acquired");
    assert!(native_commits > STEPS / 12, "the module committed");
    assert!(native_renews > STEPS / 40, "the module renewed");
    for counter in 0..policies.len() {
        assert!(
            granted[counter] > 5 && denied[counter] > 5,
            "counter {counter}: grants and denials both met"
        );
    }
    for status in ["admit", "keys"] {
        assert!(statuses.get(status) > Some(&3), "{status} answered");
    }
    for status in COMMIT_STATUSES {
        assert!(
            commit_statuses.get(status) > Some(&3),
            "a commit answered {status}"
        );
    }
    for status in RENEW_STATUSES {
        assert!(
            renew_statuses.get(status) > Some(&3),
            "a renewal answered {status}"
        );
    }
    assert!(woken > 10, "wake-ups published: {woken}");
    assert!(
        evictions > 3 && held_after_eviction > 3,
        "evictions seen by watched calls: {evictions} events, {held_after_eviction} holds"
    );
}

/// A counter changing kind, as the library changes it: a sliding window's with closed buckets
/// and open reservations (its logs' keys) made leases by a concurrency limit's acquire, a
/// commit and a renewal; the leases then carried into a rate limit's fixed window. Each step is
/// decided by the module on one namespace and by the library on another: the same replies,
/// stored values and expiries.
#[test]
fn a_counter_made_leases_and_back_is_the_librarys() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    let function: &[&[u8]] = &[b"FCALL", FUNCTION.as_bytes()];
    for namespace in ["kind-mod", "kind-lib"] {
        fcall(&mut conn, &keys(namespace, 0)[..1], &pack(&[OP_BEGIN]));
    }
    let policies = policies();
    let (sliding, leases, fixed) = (&policies[2], &policies[CONCURRENCY], &policies[4]);
    let acquire = |policy| pack(&acquire_numbers(policy, 1.0, 2.0, 1.0, 0.0, [0.0; 4]));
    // (clock, what): two sliding grants at two instants (a closed bucket, two reservations),
    // then leases, a renewal and a release, then a fixed window.
    // (The renewal's and the commit's numbers name the leases granted, made at their step.)
    let steps: Vec<(u64, &str, Vec<u8>)> = vec![
        (1_000_000, "acquire", acquire(sliding)),
        (1_500_000, "acquire", acquire(sliding)),
        (1_600_000, "acquire", acquire(leases)),
        (1_700_000, "acquire", acquire(leases)),
        (1_800_000, "renew", Vec::new()),
        (1_900_000, "commit", Vec::new()),
        (2_000_000, "acquire", acquire(fixed)),
    ];
    let mut fences = Vec::new();
    for (at, what, packed) in steps {
        server.set_clock(at);
        let mut replies = Vec::new();
        for (namespace, command) in [
            ("kind-mod", &[b"TOLLGATE.ACQUIRE".as_slice()][..]),
            ("kind-lib", function),
        ] {
            let reply = match what {
                "acquire" => call_on(&mut conn, command, &keys(namespace, 0), &[&packed]),
                "renew" => {
                    let command: &[&[u8]] = if namespace == "kind-mod" {
                        &[b"TOLLGATE.RENEW"]
                    } else {
                        function
                    };
                    let packed = pack(&renew_numbers(leases, [0.0; 4], fences[0]));
                    call_on(&mut conn, command, &commit_keys(namespace, 0), &[&packed])
                }
                _ => {
                    let command: &[&[u8]] = if namespace == "kind-mod" {
                        &[b"TOLLGATE.COMMIT"]
                    } else {
                        function
                    };
                    let packed = pack(&commit_numbers(leases, [0.0; 4], fences[1], 0.0));
                    call_on(
                        &mut conn,
                        command,
                        &commit_keys(namespace, 0),
                        &[&packed, WAKE_MIXED],
                    )
                }
            };
            replies.push(reply);
        }
        assert_eq!(replies[0], replies[1], "at {at}, {what}: replies differ");
        let Resp::Array(reply) = &replies[1] else {
            panic!("at {at}, {what}: {:?}", replies[1]);
        };
        assert_eq!(reply[0], Resp::Bytes(b"ok".to_vec()), "at {at}, {what}");
        if what == "acquire" {
            assert_eq!(reply[4], Resp::Int(0), "at {at}: granted");
            if let Resp::Int(seq) = reply[5]
                && at >= 1_600_000
            {
                fences.push(seq as f64);
            }
        }
        let (by_module, by_library) = (
            stored(&mut conn, &keys("kind-mod", 0)),
            stored(&mut conn, &keys("kind-lib", 0)),
        );
        assert_eq!(
            by_module, by_library,
            "at {at}, {what}: stored values differ"
        );
        if at == 1_500_000 {
            // The sliding window's logs are there to be cleared.
            assert!(
                by_library[2].0 != Resp::Nil && by_library[3].0 != Resp::Nil,
                "reservations and closed buckets logged: {by_library:?}"
            );
        }
        if at == 1_800_000 {
            assert!(
                matches!(&reply[4], Resp::Int(n) if *n > 1_800_000),
                "renewed: {reply:?}"
            );
        }
        if at == 1_900_000 {
            assert_eq!(reply[5], Resp::Int(1), "released");
        }
    }
}

/// Values of leases the library reads (a count whose records' bytes round to theirs), and
/// those it takes for another format's (a count of leases not their records', or not whole)
/// or stops on (shorter than the count): the module's
/// acquire answers and writes as the library's, or refuses the last.
#[test]
fn leases_values_are_read_as_the_library_reads_them() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    for namespace in ["read-mod", "read-lib"] {
        fcall(&mut conn, &keys(namespace, 0)[..1], &pack(&[OP_BEGIN]));
    }
    server.set_clock(1_000_000);
    let now = (CLOCK_START_US + 1_000_000) as f64;
    // Written in the generation born at 0: 'X', g p s k ro re ra rl rx a, then the leases.
    let value = |leases: &[f64]| {
        let mut value = vec![b'X'];
        value.extend(pack(&[0.0, 0.0, now, 4.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0]));
        value.extend(pack(leases));
        value
    };
    let lease = [now - 10.0, 2.0, now + 2e6];
    let mut half = value(&[0.5]);
    half.extend([0; 12]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("one lease", value(&[&[1.0][..], &lease].concat())),
        ("no lease", value(&[0.0])),
        (
            "two counted, one recorded",
            value(&[&[2.0][..], &lease].concat()),
        ),
        ("half a lease", half),
        (
            "none counted, one recorded",
            value(&[&[0.0][..], &lease].concat()),
        ),
        (
            "one and a half counted, one recorded",
            value(&[&[1.5][..], &lease].concat()),
        ),
        // Its records' bytes round to none, as the library reckons them: no lease.
        ("a sliver counted, none recorded", value(&[1e-300])),
    ];
    let packed = pack(&acquire_numbers(
        &policies()[CONCURRENCY],
        2.0,
        2.0,
        1.0,
        0.0,
        [0.0; 4],
    ));
    for (case, raw) in cases {
        let mut replies = Vec::new();
        for (namespace, by_module) in [("read-mod", true), ("read-lib", false)] {
            let keys = keys(namespace, 0);
            conn.call(&[b"SET", &keys[1], &raw]);
            replies.push(if by_module {
                module(&mut conn, &keys, &packed)
            } else {
                fcall(&mut conn, &keys, &packed)
            });
        }
        assert_eq!(replies[0], replies[1], "{case}: replies differ");
        assert_eq!(
            stored(&mut conn, &keys("read-mod", 0)),
            stored(&mut conn, &keys("read-lib", 0)),
            "{case}: stored values differ"
        );
        eprintln!("{case}: {:?}", replies[1]);
    }
    // Shorter than its count of leases: the library stops, the module refuses it.
    let mut short = value(&[]);
    short.extend([0; 4]);
    let keys = keys("read-mod", 0);
    conn.call(&[b"SET", &keys[1], &short]);
    assert_eq!(
        module(&mut conn, &keys, &packed),
        Resp::Error("ERR tollgate: not native: a counter value shorter than its kind's".into())
    );
    assert!(matches!(fcall(&mut conn, &keys, &packed), Resp::Error(_)));
}

const OP_PAUSE: f64 = 4.0;
const OP_USAGE: f64 = 5.0;
const OP_RESUME: f64 = 7.0;
const OP_ADMIT: f64 = 8.0;
const OP_CHARGE: f64 = 11.0;

/// A namespace's keys for the operations on one counter or limit: `keys`' (the generation, the
/// counter's state, reservations, buckets and queue, the key budget at KEYS[6]), then the
/// counter's limit's pause, at KEYS[7].
fn op_keys(namespace: &str, counter: usize) -> Vec<Vec<u8>> {
    let mut keys = keys(namespace, counter);
    keys.push(format!("tg:{{t}}:{namespace}:p:{counter}").into_bytes());
    keys
}

/// `op_keys`' keys at these places (1-based, as the library's KEYS).
fn picked(all: &[Vec<u8>], places: &[usize]) -> Vec<Vec<u8>> {
    places.iter().map(|&at| all[at - 1].clone()).collect()
}

/// A one-counter call's numbers: the operation, the policy, the admission, its own numbers.
fn counter_numbers(op: f64, policy: &[f64; 9], admission: [f64; 4], own: &[f64]) -> Vec<f64> {
    let mut numbers = vec![op];
    numbers.extend(policy);
    numbers.extend(admission);
    numbers.extend(own);
    numbers
}

/// A number of a reply (its `at`, 0-based), or -1.
fn number(reply: &Resp, at: usize) -> i64 {
    match reply {
        Resp::Array(items) => match items.get(at) {
            Some(Resp::Int(n)) => *n,
            _ => -1,
        },
        _ => -1,
    }
}

fn status(reply: &Resp) -> String {
    match reply {
        Resp::Array(items) => match items.first() {
            Some(Resp::Bytes(status)) => String::from_utf8_lossy(status).into_owned(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// A stored counter's pause (`c.p`, its header's second number), 0 when none is kept.
fn counter_pause(conn: &mut Conn, key: &[u8]) -> f64 {
    match conn.call(&[b"GET", key]) {
        Resp::Bytes(value) if value.len() >= 17 && value[0] == b'X' => {
            f64::from_be_bytes(value[9..17].try_into().expect("eight bytes"))
        }
        _ => 0.0,
    }
}

/// Pauses (of a key, on its counter, and of a whole limit, short and long), resumes (lifting a
/// pause, and leaving the hold after a loss of state), usage (the limit's pause read with the
/// counter or brought by the caller), charges (past the limit, after a loss, a GCRA debt's
/// reach), admissions of keys (the budget full, held, apart) and begins of a namespace, among
/// acquires that make state, each decided by the module or the library at random in one
/// namespace and by the library alone in another, on one Redis clock: every reply and every
/// stored value and expiry are the same; it runs on until the module decided each case a few
/// times; the module refuses none of them (a concurrency limit's counter is paused, resumed and
/// read natively too).
#[test]
fn the_modules_pauses_usage_charges_admits_and_begins_decide_as_the_library_alone() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    let policies = policies();
    let seed = std::env::var("TOLLGATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("TOLLGATE_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mixed_ns, alone_ns) = ("ops-mixed", "ops-alone");
    for namespace in [mixed_ns, alone_ns] {
        fcall(&mut conn, &keys(namespace, 0)[..1], &pack(&[OP_BEGIN]));
    }
    let function: &[&[u8]] = &[b"FCALL", FUNCTION.as_bytes()];
    let mut clock = 0;
    let mut since_loss = usize::MAX;
    // The covers the budget gave (for admissions of a key already covered).
    let mut covers: Vec<f64> = Vec::new();
    let mut met = std::collections::BTreeMap::<&'static str, u32>::new();
    let cases = [
        "pause of a key",
        "pause of a key kept longer",
        "pause of a limit",
        "pause of a limit kept longer",
        "pause uncovered",
        "resume lifted a pause",
        "resume left a hold",
        "resume of a counter not kept",
        "resume of a limit lifted",
        "usage",
        "usage held",
        "usage paused by its limit",
        "charge counted",
        "charge past the limit",
        "charge after a loss",
        "charge of a GCRA debt admitted",
        "charge uncovered",
        "charge of leases",
        "admit ok",
        "admit of a key covered",
        "admit keys",
        "admit held",
        "begin made",
        "begin made, watching evictions",
        "begin found",
        "usage of leases",
        "native",
    ];
    for step in 0..8 * STEPS {
        if step >= STEPS && cases.iter().all(|case| met.get(case) > Some(&3)) {
            break;
        }
        if rng.u8(..4) == 0 {
            clock += rng.u64(1..3_000_000);
            server.set_clock(clock);
        }
        let now = (CLOCK_START_US + clock) as f64;
        since_loss = since_loss.saturating_add(1);
        if rng.u8(..80) == 0 {
            // A loss of state: the generation gone; counters are held, then recover.
            for namespace in [mixed_ns, alone_ns] {
                conn.call(&[b"DEL", &keys(namespace, 0)[0]]);
            }
            since_loss = 0;
        }
        // One step in three watches evictions, which move now and then.
        let watch = rng.u8(..3) == 0;
        evictions_move(&mut conn, &mut rng, [mixed_ns, alone_ns], policies.len());
        let counter = rng.usize(..policies.len());
        // Now and then a rate counter under another rate policy (carried over).
        let policy = if counter != CONCURRENCY && rng.u8(..20) == 0 {
            &policies[rng.usize(..CONCURRENCY)]
        } else {
            &policies[counter]
        };
        let apart = f64::from(u8::from(rng.u8(..8) == 0));
        // The key budget (four counters of keys) at KEYS[`here`] of the call, elsewhere, or
        // none.
        let admission = |rng: &mut fastrand::Rng, here: f64| match rng.u8(..20) {
            0..=3 => [0.0; 4],
            4..=5 => [-1.0, 4.0, 0.0, apart],
            6..=7 => [-1.0, 4.0, now + rng.f64() * 60e6, apart],
            8 => [-1.0, 4.0, -(now + rng.f64() * 2e6), apart],
            _ => [here, 4.0, 0.0, apart],
        };
        let (mixed_all, alone_all) = (op_keys(mixed_ns, counter), op_keys(alone_ns, counter));
        // What the step calls: the module's command (or None: the library only), the keys by
        // their places in `op_keys`, and its numbers.
        let (command, places, numbers): (Option<&[u8]>, Vec<usize>, Vec<f64>) = match rng.u8(..16) {
            // An acquire, the limit's pause at KEYS[7] now and then.
            0..=3 => {
                let cost = f64::from(rng.u8(1..3));
                let pause = if rng.u8(..3) == 0 { 7.0 } else { 0.0 };
                let numbers = acquire_numbers(
                    policy,
                    cost,
                    f64::from(rng.u8(..3)),
                    f64::from(rng.u8(..2)),
                    pause,
                    admission(&mut rng, 6.0),
                );
                (Some(b"TOLLGATE.ACQUIRE"), (1..=7).collect(), numbers)
            }
            // A pause of a key or of its whole limit, short or long.
            4..=5 => {
                let duration = if rng.bool() {
                    rng.f64() * 3e6
                } else {
                    rng.f64() * 60e6
                }
                .floor();
                if rng.u8(..3) > 0 {
                    let numbers = counter_numbers(
                        OP_PAUSE,
                        policy,
                        admission(&mut rng, 5.0),
                        &[duration, 1.0],
                    );
                    (Some(b"TOLLGATE.PAUSE"), vec![1, 2, 3, 4, 6], numbers)
                } else {
                    let numbers = counter_numbers(OP_PAUSE, policy, [0.0; 4], &[duration, 0.0]);
                    (Some(b"TOLLGATE.PAUSE"), vec![1, 7], numbers)
                }
            }
            // A resume of a key or of its whole limit.
            6..=7 => {
                if rng.u8(..3) > 0 {
                    let numbers =
                        counter_numbers(OP_RESUME, policy, admission(&mut rng, 5.0), &[1.0]);
                    (Some(b"TOLLGATE.RESUME"), vec![1, 2, 3, 4, 6], numbers)
                } else {
                    let numbers = counter_numbers(OP_RESUME, policy, [0.0; 4], &[0.0]);
                    (Some(b"TOLLGATE.RESUME"), vec![1, 7], numbers)
                }
            }
            // Usage: the limit's pause read with the counter (KEYS[6]) or as the caller read
            // it.
            8..=9 => {
                let pause = match rng.u8(..3) {
                    0 => 6.0,
                    1 => -(now + rng.f64() * 5e6).floor(),
                    _ => 0.0,
                };
                let numbers = counter_numbers(OP_USAGE, policy, admission(&mut rng, 5.0), &[pause]);
                (Some(b"TOLLGATE.USAGE"), vec![1, 2, 3, 4, 6, 7], numbers)
            }
            // A charge, up to three capacities' units.
            10..=12 => {
                let units = f64::from(rng.u8(1..13));
                let numbers =
                    counter_numbers(OP_CHARGE, policy, admission(&mut rng, 5.0), &[units]);
                (Some(b"TOLLGATE.CHARGE"), vec![1, 2, 3, 4, 6], numbers)
            }
            // An admission of a key (a new one, or one covered), the hold honoured or not,
            // the budget lost apart from its counters more often (held after a loss).
            13..=14 => {
                let apart = f64::from(u8::from(rng.u8(..3) == 0));
                // Mostly a recent cover: one still counted, which the budget moves.
                let old = if !covers.is_empty() && rng.u8(..3) > 0 {
                    covers[rng.usize(covers.len().saturating_sub(3)..covers.len())]
                } else {
                    0.0
                };
                let need = (now + rng.f64() * 20e6).floor();
                let mut numbers = vec![OP_ADMIT];
                numbers.extend(policy);
                numbers.extend([3.0, old, need, f64::from(rng.u8(..2)), apart]);
                (Some(b"TOLLGATE.ADMIT"), vec![1, 6], numbers)
            }
            // A begin, of a namespace with a generation or without.
            _ => {
                if rng.u8(..3) == 0 {
                    for namespace in [mixed_ns, alone_ns] {
                        conn.call(&[b"DEL", &keys(namespace, 0)[0]]);
                    }
                    since_loss = 0;
                }
                (Some(b"TOLLGATE.BEGIN"), vec![1], vec![OP_BEGIN])
            }
        };
        let (packed, mixed_keys, alone_keys) = maybe_watching(
            watch,
            numbers.clone(),
            (picked(&mixed_all, &places), picked(&alone_all, &places)),
            (mixed_ns, alone_ns),
        );
        let mut by_module = false;
        let mixed = match command {
            Some(command) if rng.bool() => {
                match call_on(&mut conn, &[command], &mixed_keys, &[&packed]) {
                    Resp::Error(e) if e.starts_with("ERR tollgate: not native:") => {
                        panic!("step {step} (seed {seed}): the module refused: {e}")
                    }
                    reply => {
                        *met.entry("native").or_default() += 1;
                        by_module = true;
                        reply
                    }
                }
            }
            _ => fcall(&mut conn, &mixed_keys, &packed),
        };
        let alone = call_on(&mut conn, function, &alone_keys, &[&packed]);
        assert_eq!(
            mixed,
            alone,
            "step {step} (seed {seed}): {} replies differ",
            String::from_utf8_lossy(command.unwrap_or(b"?"))
        );
        let with_record = |all: &[Vec<u8>], namespace: &str| {
            let mut all = all.to_vec();
            all.push(evictions_record(namespace));
            all
        };
        assert_eq!(
            stored(&mut conn, &with_record(&mixed_all, mixed_ns)),
            stored(&mut conn, &with_record(&alone_all, alone_ns)),
            "step {step} (seed {seed}): {} stored values or expiries differ",
            String::from_utf8_lossy(command.unwrap_or(b"?"))
        );

        // The cases the module met, read from the library's reply.
        if !by_module {
            continue;
        }
        let op = numbers[0];
        let st = status(&alone);
        let mut meet = |case: &'static str| *met.entry(case).or_default() += 1;
        let keyed_call = places.len() > 2;
        let reply_at = |at: usize| number(&alone, at) as f64;
        if op == OP_PAUSE && st == "ok" {
            let duration = numbers[numbers.len() - 2];
            let kept_longer = reply_at(4) > now + duration;
            match (keyed_call, kept_longer) {
                (true, false) => meet("pause of a key"),
                (true, true) => meet("pause of a key kept longer"),
                (false, false) => meet("pause of a limit"),
                (false, true) => meet("pause of a limit kept longer"),
            }
        } else if op == OP_PAUSE && keyed_call {
            meet("pause uncovered");
        } else if op == OP_RESUME && st == "ok" {
            if !keyed_call {
                if reply_at(4) == 1.0 {
                    meet("resume of a limit lifted");
                }
            } else if conn.call(&[b"EXISTS", &alone_all[1]]) == Resp::Int(0) {
                meet("resume of a counter not kept");
            } else {
                if reply_at(4) == 1.0 {
                    meet("resume lifted a pause");
                }
                if counter_pause(&mut conn, &alone_all[1]) > now {
                    meet("resume left a hold");
                }
            }
        } else if op == OP_USAGE && st == "ok" {
            meet("usage");
            if policy[0] == 2.0 && reply_at(4) > 0.0 {
                meet("usage of leases");
            }
            if reply_at(7) > 0.0 {
                meet("usage held");
            }
            if reply_at(6) > now && reply_at(7) == 0.0 {
                meet("usage paused by its limit");
            }
        } else if op == OP_CHARGE {
            let units = numbers[numbers.len() - 1];
            match st.as_str() {
                "ok" if policy[0] == 2.0 => meet("charge of leases"),
                "ok" => {
                    let charged = reply_at(4);
                    if charged == units {
                        meet("charge counted");
                    } else {
                        meet("charge past the limit");
                    }
                    if since_loss < 10 {
                        meet("charge after a loss");
                    }
                    if policy[4] == 3.0 && numbers[10] != 0.0 {
                        meet("charge of a GCRA debt admitted");
                    }
                }
                _ => meet("charge uncovered"),
            }
        } else if op == OP_ADMIT {
            match st.as_str() {
                "ok" => {
                    covers.push(reply_at(4));
                    if numbers[11] > now {
                        meet("admit of a key covered");
                    } else {
                        meet("admit ok");
                    }
                }
                "keys" => meet("admit keys"),
                "held" => meet("admit held"),
                other => panic!("step {step}: admit answered {other}"),
            }
        } else if op == OP_BEGIN {
            match alone {
                Resp::Int(1) => {
                    meet("begin made");
                    if watch {
                        meet("begin made, watching evictions");
                    }
                }
                Resp::Int(0) => meet("begin found"),
                other => panic!("step {step}: begin answered {other:?}"),
            }
        }
    }
    eprintln!("{met:?}");
    for case in cases {
        assert!(met.get(case) > Some(&3), "{case}: met {:?}", met.get(case));
    }
}

/// A budget that can be lost apart from its counters (a cluster's), found missing after the
/// slot's state was lost, holds new keys of requests for a while; a commit of a counter not
/// covered yet is admitted through the hold. The module's commit answers and writes as the
/// library's, for a GCRA and a sliding window counter.
#[test]
fn a_commit_is_admitted_through_a_held_budget_as_by_the_library() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    let function: &[&[u8]] = &[b"FCALL", FUNCTION.as_bytes()];
    for namespace in ["held-mixed", "held-alone"] {
        fcall(&mut conn, &keys(namespace, 0)[..1], &pack(&[OP_BEGIN]));
    }
    for (step, counter) in [0, 2].into_iter().enumerate() {
        server.set_clock(10_000_000 * (step as u64 + 1));
        let policy = &policies()[counter];
        // Granted without a key budget: the counter is not covered.
        let acquire = pack(&acquire_numbers(policy, 1.0, 2.0, 1.0, 0.0, [0.0; 4]));
        let mut seqs = Vec::new();
        for namespace in ["held-mixed", "held-alone"] {
            match fcall(&mut conn, &keys(namespace, counter), &acquire) {
                Resp::Array(reply) if reply.get(4) == Some(&Resp::Int(0)) => {
                    seqs.push(reply[5].clone())
                }
                other => panic!("not granted: {other:?}"),
            }
            conn.call(&[b"DEL", &keys(namespace, 0)[0]]);
        }
        assert_eq!(seqs[0], seqs[1]);
        let Resp::Int(seq) = seqs[0] else {
            panic!("seq {:?}", seqs[0])
        };
        let commit = pack(&commit_numbers(
            policy,
            [5.0, 3.0, 0.0, 1.0],
            seq as f64,
            0.0,
        ));
        let mixed = call_on(
            &mut conn,
            &[b"TOLLGATE.COMMIT"],
            &commit_keys("held-mixed", counter),
            &[&commit, WAKE_MIXED],
        );
        let alone = call_on(
            &mut conn,
            function,
            &commit_keys("held-alone", counter),
            &[&commit, WAKE_ALONE],
        );
        assert_eq!(mixed, alone, "counter {counter}: replies differ");
        assert!(
            matches!(&alone, Resp::Array(reply) if reply[0] == Resp::Bytes(b"ok".to_vec()) && reply[4] == Resp::Int(1)),
            "counter {counter}: refunded: {alone:?}"
        );
        assert_eq!(
            stored(&mut conn, &keys("held-mixed", counter)),
            stored(&mut conn, &keys("held-alone", counter)),
            "counter {counter}: stored values or expiries differ"
        );
        // A request of a new key, by contrast, is held.
        let request = pack(&acquire_numbers(
            policy,
            1.0,
            2.0,
            1.0,
            0.0,
            [6.0, 3.0, 0.0, 1.0],
        ));
        let held = fcall(&mut conn, &keys("held-alone", counter + 1), &request);
        assert!(
            matches!(&held, Resp::Array(reply) if reply.get(4) == Some(&Resp::Int(2))),
            "a request is held: {held:?}"
        );
    }
}

#[test]
fn the_modules_writes_reach_a_replica_without_the_module() {
    let Some(mut server) = start() else { return };
    let mut replica = server.replica();
    let mut conn = server.conn();
    let policy = policies()[0];
    let keys = keys("replicated", 0);
    let mut clock = 0;
    let mut granted = 0;
    for step in 0..60 {
        clock += 700_000;
        server.set_clock(clock);
        let packed = pack(&acquire_numbers(&policy, 1.0, 2.0, 0.0, 0.0, [0.0; 4]));
        match module(&mut conn, &keys, &packed) {
            Resp::Array(reply) if reply.get(4) == Some(&Resp::Int(0)) => granted += 1,
            Resp::Array(_) => {}
            other => panic!("step {step}: {other:?}"),
        }
    }
    assert!(granted > 10, "granted {granted}");
    assert_eq!(conn.call(&[b"WAIT", b"1", b"5000"]), Resp::Int(1));
    for key in &keys {
        assert_eq!(
            replica.call(&[b"GET", key]),
            conn.call(&[b"GET", key]),
            "{}",
            String::from_utf8_lossy(key)
        );
    }
    assert_ne!(
        replica.call(&[b"GET", &keys[1]]),
        Resp::Nil,
        "the counter replicated"
    );
}

/// An acquire's `lost` (the fourth of its head): whether it found the slot's state lost.
fn lost(reply: &Resp) -> i64 {
    match reply {
        Resp::Array(items) => match items.get(3) {
            Some(Resp::Int(lost)) => *lost,
            other => panic!("no lost flag in {reply:?}: {other:?}"),
        },
        other => panic!("not an acquire's reply: {other:?}"),
    }
}

fn info_has(conn: &mut Conn, section: &[u8], text: &str) -> bool {
    matches!(conn.call(&[b"INFO", section]), Resp::Bytes(info) if info.windows(text.len()).any(|w| w == text.as_bytes()))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn replid(conn: &mut Conn) -> Vec<u8> {
    match conn.call(&[b"INFO", b"replication"]) {
        Resp::Bytes(info) => {
            let field = b"master_replid:";
            let at = info
                .windows(field.len())
                .position(|w| w == field)
                .expect("master_replid");
            info[at + field.len()..]
                .iter()
                .take_while(|b| b.is_ascii_hexdigit())
                .copied()
                .collect()
        }
        other => panic!("INFO replication: {other:?}"),
    }
}

fn load_library(conn: &mut Conn) {
    let library = tollgate_redis::library_source(FUNCTION);
    assert_eq!(
        conn.call(&[b"FUNCTION", b"LOAD", b"REPLACE", library.as_bytes()]),
        Resp::Bytes(FUNCTION.as_bytes().to_vec())
    );
}

/// The identity the module keeps (read once, not on every acquire) is forgotten when Redis
/// loads a data set, as the library's is. Here a master takes its replica's copy by a full sync
/// and is promoted again: its counters may have lost what it granted after the copy was
/// taken, yet the generation it finds is the one it wrote itself under its old identity, so
/// only an identity read anew (the new replication id) tells the loss.
#[test]
fn a_full_sync_is_a_loss_to_the_module_as_to_the_library() {
    let Some(mut server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    let keys = keys("resync", 0);
    fcall(&mut conn, &keys[..1], &pack(&[OP_BEGIN]));
    let packed = pack(&acquire_numbers(
        &policies()[0],
        1.0,
        2.0,
        0.0,
        0.0,
        [0.0; 4],
    ));
    assert_eq!(lost(&module(&mut conn, &keys, &packed)), 0);
    let mut replica = server.replica();
    assert_eq!(conn.call(&[b"WAIT", b"1", b"5000"]), Resp::Int(1));
    // The replica promoted; the old master grants once more, which the copy never sees.
    assert_eq!(
        replica.call(&[b"REPLICAOF", b"NO", b"ONE"]),
        Resp::Status("OK".into())
    );
    replica.call(&[b"CONFIG", b"SET", b"repl-diskless-sync-delay", b"0"]);
    assert_eq!(lost(&module(&mut conn, &keys, &packed)), 0);
    let port = match replica.call(&[b"CONFIG", b"GET", b"port"]) {
        Resp::Array(pair) => match pair.get(1) {
            Some(Resp::Bytes(port)) => port.clone(),
            other => panic!("port: {other:?}"),
        },
        other => panic!("CONFIG GET port: {other:?}"),
    };
    // The old master follows the copy (a full sync: it wrote past what the copy holds), then
    // is promoted again.
    assert_eq!(
        conn.call(&[b"REPLICAOF", b"127.0.0.1", &port]),
        Resp::Status("OK".into())
    );
    wait_for("the full sync", || {
        info_has(&mut conn, b"replication", "master_link_status:up")
    });
    assert_eq!(
        conn.call(&[b"REPLICAOF", b"NO", b"ONE"]),
        Resp::Status("OK".into())
    );
    let after = module(&mut conn, &keys, &packed);
    assert_eq!(
        lost(&after),
        1,
        "the module's first acquire after the sync tells the loss: {after:?}"
    );
    // And the library agrees with the identity the module wrote.
    assert_eq!(lost(&fcall(&mut conn, &keys, &packed)), 0);
}

/// A master's replication id also changes without any load: when a first replica attaches,
/// and when it frees its backlog once no replica has been back for `repl-backlog-ttl`. The
/// library, loaded again after that, would read an identity the module never kept: it asks
/// the module for the one it keeps instead, so the two never take turns declaring losses.
#[test]
fn module_and_library_keep_one_identity_through_new_replication_ids() {
    let Some(mut server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    let keys = keys("renewed", 0);
    fcall(&mut conn, &keys[..1], &pack(&[OP_BEGIN]));
    let packed = pack(&acquire_numbers(
        &policies()[0],
        1.0,
        2.0,
        0.0,
        0.0,
        [0.0; 4],
    ));
    let first = replid(&mut conn);
    drop(server.replica());
    let second = replid(&mut conn);
    assert_ne!(first, second, "a first replica draws a new replication id");
    assert_eq!(lost(&module(&mut conn, &keys, &packed)), 0);
    assert_eq!(lost(&fcall(&mut conn, &keys, &packed)), 0);
    // The replica gone, the backlog is freed a second later on the master's clock.
    let mut replica = server.children.pop().expect("the replica");
    let _ = replica.kill();
    let _ = replica.wait();
    wait_for("the replica gone", || {
        info_has(&mut conn, b"replication", "connected_slaves:0")
    });
    conn.call(&[b"CONFIG", b"SET", b"repl-backlog-ttl", b"1"]);
    server.set_clock(5_000_000);
    wait_for("a third replication id", || replid(&mut conn) != second);
    load_library(&mut conn);
    for step in 0..4 {
        assert_eq!(
            lost(&fcall(&mut conn, &keys, &packed)),
            0,
            "step {step}: library"
        );
        assert_eq!(
            lost(&module(&mut conn, &keys, &packed)),
            0,
            "step {step}: module"
        );
    }
}

/// The module loaded into a Redis whose library already read its identity, the replication id
/// changed since: the module's first acquire takes the library's identity (this process's, by
/// its node and run id) rather than declaring a loss the library would answer with another.
#[test]
fn a_module_loaded_late_takes_the_librarys_identity() {
    let Some(mut server) = start() else { return };
    let mut conn = server.conn();
    assert_eq!(
        conn.call(&[b"MODULE", b"UNLOAD", b"tollgate"]),
        Resp::Status("OK".into())
    );
    load_library(&mut conn);
    let keys = keys("late", 0);
    fcall(&mut conn, &keys[..1], &pack(&[OP_BEGIN]));
    let packed = pack(&acquire_numbers(
        &policies()[0],
        1.0,
        2.0,
        0.0,
        0.0,
        [0.0; 4],
    ));
    assert_eq!(lost(&fcall(&mut conn, &keys, &packed)), 0);
    let first = replid(&mut conn);
    drop(server.replica());
    assert_ne!(replid(&mut conn), first, "a new replication id");
    let module_path = module_path().into_os_string().into_encoded_bytes();
    assert_eq!(
        conn.call(&[b"MODULE", b"LOAD", &module_path]),
        Resp::Status("OK".into())
    );
    for step in 0..4 {
        assert_eq!(
            lost(&module(&mut conn, &keys, &packed)),
            0,
            "step {step}: module"
        );
        assert_eq!(
            lost(&fcall(&mut conn, &keys, &packed)),
            0,
            "step {step}: library"
        );
    }
}

/// A module command, its keys and its packed numbers.
type Call = (&'static [u8], Vec<Vec<u8>>, Vec<u8>);

/// The module's writes reach the append-only file as the writes themselves: Redis started
/// again from it holds every value and expiry the module left.
#[test]
fn an_append_only_file_replays_what_the_module_wrote() {
    let Some(mut server) = start() else { return };
    let mut conn = server.conn();
    conn.call(&[b"CONFIG", b"SET", b"appendfsync", b"always"]);
    assert_eq!(
        conn.call(&[b"CONFIG", b"SET", b"appendonly", b"yes"]),
        Resp::Status("OK".into())
    );
    wait_for("the first rewrite of the append-only file", || {
        info_has(&mut conn, b"persistence", "aof_rewrite_in_progress:0")
            && info_has(&mut conn, b"persistence", "aof_rewrite_scheduled:0")
    });
    let policies = policies();
    let mut clock = 0;
    let mut all_keys = Vec::new();
    let mut granted = 0;
    for step in 0..80 {
        clock += 300_000;
        server.set_clock(clock);
        let counter = step % policies.len();
        let keys = keys("appended", counter);
        let record = f64::from(u8::from(step % 3 == 0));
        let packed = pack(&acquire_numbers(
            &policies[counter],
            1.0,
            1.0,
            record,
            0.0,
            // A key budget with room for every counter.
            [6.0, policies.len() as f64, 0.0, 0.0],
        ));
        let fence = match module(&mut conn, &keys, &packed) {
            Resp::Array(reply) if reply.get(4) == Some(&Resp::Int(0)) => {
                granted += 1;
                number(&Resp::Array(reply), 5) as f64
            }
            Resp::Array(_) => 0.0,
            other => panic!("step {step}: {other:?}"),
        };
        // Every other operation's writes too: a waiting request's place, a key's pause and a
        // charge (watching evictions: the slot's record), a lease renewed and released.
        let budget = [5.0, policies.len() as f64, 0.0, 0.0];
        let policy = &policies[counter];
        let mut calls: Vec<Call> = Vec::new();
        match step % 3 {
            0 => {
                let acquire = acquire_numbers(policy, 3.0, 1.0, 0.0, 0.0, [6.0, 7.0, 0.0, 0.0]);
                let packed = waiting(pack(&acquire), 1, step as f64 + 1.0, 5e6);
                calls.push((b"TOLLGATE.ACQUIRE", keys.clone(), packed));
            }
            1 => {
                let pause = counter_numbers(OP_PAUSE, policy, budget, &[200_000.0, 1.0]);
                let (packed, watched, _) = maybe_watching(
                    true,
                    pause,
                    (commit_keys("appended", counter), Vec::new()),
                    ("appended", "appended"),
                );
                calls.push((b"TOLLGATE.PAUSE", watched, packed));
            }
            _ => {
                let charge = counter_numbers(OP_CHARGE, policy, budget, &[2.0]);
                let (packed, watched, _) = maybe_watching(
                    true,
                    charge,
                    (commit_keys("appended", counter), Vec::new()),
                    ("appended", "appended"),
                );
                calls.push((b"TOLLGATE.CHARGE", watched, packed));
            }
        }
        if counter == CONCURRENCY && fence > 0.0 {
            let renew = pack(&renew_numbers(policy, budget, fence));
            calls.push((b"TOLLGATE.RENEW", commit_keys("appended", counter), renew));
        }
        for (command, call_keys, packed) in calls {
            match call_on(&mut conn, &[command], &call_keys, &[&packed]) {
                Resp::Array(_) => {}
                other => panic!("step {step}: {other:?}"),
            }
        }
        if counter == CONCURRENCY && fence > 0.0 && step % 2 == 0 {
            let release = pack(&commit_numbers(policy, budget, fence, 0.0));
            let reply = call_on(
                &mut conn,
                &[b"TOLLGATE.COMMIT"],
                &commit_keys("appended", counter),
                &[&release, WAKE_MIXED],
            );
            assert!(matches!(reply, Resp::Array(_)), "step {step}: {reply:?}");
        }
        all_keys.extend(keys);
    }
    all_keys.push(evictions_record("appended"));
    assert!(granted > 10, "granted {granted}");
    all_keys.sort();
    all_keys.dedup();
    let before = stored(&mut conn, &all_keys);
    assert!(
        before
            .iter()
            .filter(|(value, _)| *value != Resp::Nil)
            .count()
            > policies.len(),
        "counters, their logs and the budget written: {before:?}"
    );
    // The other operations' writes are among them: places in queues, the evictions record.
    let written = |key: &[u8]| {
        all_keys
            .iter()
            .zip(&before)
            .any(|(k, (value, _))| k.as_slice() == key && *value != Resp::Nil)
    };
    assert!(
        written(&evictions_record("appended")),
        "the evictions record written"
    );
    assert!(
        (0..policies.len()).any(|c| written(&keys("appended", c)[4])),
        "places in queues written"
    );
    // Stopped and started again on the same directory and port, reading the file back.
    let port = server.port;
    let mut child = server.children.pop().expect("the server");
    let _ = child.kill();
    let _ = child.wait();
    server.spawn(
        port,
        &[
            "--loadmodule".into(),
            module_path().into_os_string(),
            "--appendonly".into(),
            "yes".into(),
        ],
    );
    let mut conn = server.conn();
    // Redis may say `loading:0` before its loading began: a key read answers only after.
    wait_for("the append-only file loaded", || {
        info_has(&mut conn, b"persistence", "loading:0")
            && !matches!(conn.call(&[b"GET", &all_keys[0]]), Resp::Error(e) if e.starts_with("LOADING"))
    });
    assert_eq!(stored(&mut conn, &all_keys), before);
}

const OP_BATCH: f64 = 10.0;

/// A batch of acquires as the store packs one: the generation once, then each acquire's own
/// keys after the others', its numbers (but the operation) after its shift and their count.
fn batch(namespace: &str, acquires: &[(usize, Vec<f64>)]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut all = vec![keys(namespace, 0).swap_remove(0)];
    let mut numbers = vec![OP_BATCH, acquires.len() as f64];
    for (counter, acquire) in acquires {
        numbers.push((all.len() - 1) as f64);
        numbers.push((acquire.len() - 1) as f64);
        numbers.extend(&acquire[1..]);
        // Its own keys, its key budget one of two (by counter), so that a key read at the
        // wrong shift is another acquire's.
        let mut own = keys(namespace, *counter);
        own[5] = format!("tg:{{t}}:{namespace}:k{}", counter % 2).into_bytes();
        all.extend(own.into_iter().skip(1));
    }
    (all, pack(&numbers))
}

/// Batches of acquires, decided by the module on one namespace and by the library on another,
/// from the same numbers at the same instants: the same replies, the same stored bytes and
/// expiries, acquire by acquire, a concurrency limit's leases granted and denied among them.
#[test]
fn a_batch_decided_by_the_module_is_the_librarys() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    let policies = policies();
    let seed = std::env::var("TOLLGATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("TOLLGATE_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    for namespace in ["bmod", "blib"] {
        fcall(&mut conn, &keys(namespace, 0)[..1], &pack(&[OP_BEGIN]));
    }
    let (mut native, mut decided) = (0, 0);
    let (mut leased, mut lease_denied) = (0, 0);
    let mut clock = 0;
    for step in 0..300 {
        if rng.u8(..3) == 0 {
            clock += rng.u64(1..2_000_000);
            server.set_clock(clock);
        }
        let acquires: Vec<(usize, Vec<f64>)> = (0..rng.usize(1..7))
            .map(|_| {
                let counter = if rng.u8(..4) == 0 {
                    CONCURRENCY
                } else {
                    rng.usize(..CONCURRENCY)
                };
                let admission = match rng.u8(..4) {
                    0 => [0.0; 4],
                    _ => [6.0, 3.0, 0.0, 0.0],
                };
                let numbers = acquire_numbers(
                    &policies[counter],
                    f64::from(rng.u8(1..3)),
                    f64::from(rng.u8(..3)),
                    if rng.bool() { 1.0 } else { 0.0 },
                    0.0,
                    admission,
                );
                (counter, numbers)
            })
            .collect();
        let (mod_keys, packed) = batch("bmod", &acquires);
        let (lib_keys, lib_packed) = batch("blib", &acquires);
        assert_eq!(packed, lib_packed);
        let by_module = match module(&mut conn, &mod_keys, &packed) {
            Resp::Error(e) if e.starts_with("ERR tollgate: not native:") => {
                refused(step, "batch", &e)
            }
            reply => {
                native += 1;
                reply
            }
        };
        let by_library = fcall(&mut conn, &lib_keys, &packed);
        assert_eq!(
            by_module, by_library,
            "step {step} (seed {seed}): replies differ"
        );
        if let Resp::Array(replies) = &by_library {
            decided += replies.len();
            for ((counter, _), reply) in acquires.iter().zip(replies) {
                if *counter != CONCURRENCY {
                    continue;
                }
                match reply {
                    // Granted, with the lease's expiry.
                    Resp::Array(r) if r.get(4) == Some(&Resp::Int(0)) => {
                        assert!(matches!(r.get(8), Some(Resp::Int(n)) if *n > 0), "{r:?}");
                        leased += 1;
                    }
                    Resp::Array(r) if r.get(4) == Some(&Resp::Int(2)) => lease_denied += 1,
                    _ => {}
                }
            }
        }
        assert_eq!(
            stored(&mut conn, &mod_keys),
            stored(&mut conn, &lib_keys),
            "step {step} (seed {seed}): stored values or expiries differ"
        );
    }
    eprintln!(
        "native batches {native}, acquires decided {decided}, leases granted {leased}, \
         denied {lease_denied}"
    );
    assert_eq!(native, 300, "every batch decided natively");
    assert!(
        leased > 10 && lease_denied > 10,
        "leases granted and denied"
    );
}

/// A library that may not call the module's `TOLLGATE.IDENTITY` (an ACL without it) fails its
/// calls, naming the refusal, rather than writing generations under an identity of its own
/// that the module's may not be.
#[test]
fn a_library_refused_the_modules_identity_fails_loudly() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    assert_eq!(
        conn.call(&[
            b"ACL",
            b"SETUSER",
            b"limited",
            b"on",
            b">secret",
            b"~*",
            b"&*",
            b"+@all",
            b"-tollgate.identity",
        ]),
        Resp::Status("OK".into())
    );
    let mut limited = server.conn();
    assert_eq!(
        limited.call(&[b"AUTH", b"limited", b"secret"]),
        Resp::Status("OK".into())
    );
    let keys = keys("acl", 0);
    match fcall(&mut limited, &keys[..1], &pack(&[OP_BEGIN])) {
        Resp::Error(error) => assert!(error.contains("TOLLGATE.IDENTITY refused"), "{error}"),
        other => panic!("the library decided without the module's identity: {other:?}"),
    }
}

/// A caller's numbers never size what the module allocates nor reach past what it holds: a
/// batch claiming more acquires, or longer ones, than its numbers is refused as bad, and Redis
/// keeps answering.
#[test]
fn a_batch_past_its_own_numbers_is_refused_and_redis_stays_up() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    let keys = keys("hostile", 0);
    let mut own = acquire_numbers(&policies()[0], 1.0, 1.0, 0.0, 0.0, [0.0; 4]);
    own.remove(0);
    for head in [
        vec![OP_BATCH, 1e18],
        vec![OP_BATCH, 1.0, 0.0, 1e300],
        vec![OP_BATCH, 1.0, 1e12, own.len() as f64],
        vec![OP_BATCH, 2.0, 0.0, f64::NAN],
    ] {
        let mut numbers = head.clone();
        numbers.extend(&own);
        match module(&mut conn, &keys, &pack(&numbers)) {
            Resp::Error(error) => assert!(
                error.starts_with("ERR tollgate: batch:"),
                "{head:?}: {error}"
            ),
            other => panic!("{head:?}: {other:?}"),
        }
        assert_eq!(conn.call(&[b"PING"]), Resp::Status("PONG".into()));
    }
}

/// Every operation's command given fewer numbers than its operation needs, or the evictions
/// flag without the record's key after the others, answers an error naming what is missing,
/// writes nothing, and Redis stays up.
#[test]
fn each_command_refuses_a_short_call_naming_what_it_lacks() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    let keys = commit_keys("short", 0);
    let policy = policies()[0];
    let counter = |op: f64| counter_numbers(op, &policy, [0.0; 4], &[]);
    let cases: Vec<(&[u8], Vec<f64>, &str)> = vec![
        (
            b"TOLLGATE.RENEW",
            counter(OP_RENEW),
            "renew: fewer than its own numbers",
        ),
        (
            b"TOLLGATE.PAUSE",
            counter(OP_PAUSE),
            "pause: fewer than its own numbers",
        ),
        (
            b"TOLLGATE.RESUME",
            counter(OP_RESUME),
            "resume: fewer than its own numbers",
        ),
        (
            b"TOLLGATE.USAGE",
            counter(OP_USAGE),
            "usage: fewer than its own numbers",
        ),
        (
            b"TOLLGATE.CHARGE",
            counter(OP_CHARGE),
            "charge: fewer than its own numbers",
        ),
        (
            b"TOLLGATE.PAUSE",
            vec![OP_PAUSE, 1.0],
            "pause: fewer than a policy's numbers",
        ),
        (
            b"TOLLGATE.ADMIT",
            vec![OP_ADMIT, 1.0],
            "admit: fewer than a policy's numbers",
        ),
        (
            b"TOLLGATE.USAGE",
            vec![OP_USAGE + OP_WATCH_EVICTIONS],
            "evictions watched: no evictions record",
        ),
    ];
    for (command, numbers, lacks) in cases {
        let reply = call_on(&mut conn, &[command], &keys[..1], &[&pack(&numbers)]);
        match reply {
            Resp::Error(error) => assert!(
                error.starts_with("ERR tollgate: ") && error.contains(lacks),
                "{}: {error}",
                String::from_utf8_lossy(command)
            ),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(command)),
        }
        assert_eq!(conn.call(&[b"PING"]), Resp::Status("PONG".into()));
    }
    assert_eq!(conn.call(&[b"DBSIZE"]), Resp::Int(0), "nothing written");
}

/// An acquire of several counters as the store packs one: the generation, each counter's
/// three keys, each counter's queue, then the limits' key budget; per counter its policy, no
/// pause, its admission in that budget and its queue; not waiting; with `costs`, one cost per
/// counter after the head's -1 marker.
fn several(
    namespace: &str,
    counters: &[usize],
    cost: &[f64],
    priority: f64,
    record: f64,
) -> (Vec<Vec<u8>>, Vec<u8>) {
    let base = format!("tg:{{t}}:{namespace}");
    let n = counters.len();
    let mut keys = vec![format!("{base}:gen").into_bytes()];
    for counter in counters {
        for part in ["c", "r", "q"] {
            keys.push(format!("{base}:{part}:{counter}").into_bytes());
        }
    }
    for counter in counters {
        keys.push(format!("{base}:w:{counter}").into_bytes());
    }
    keys.push(format!("{base}:k").into_bytes());
    let budget_at = (2 + 4 * n) as f64;
    let same = cost.iter().all(|c| *c == cost[0]);
    let mut numbers = vec![
        OP_ACQUIRE,
        if same { cost[0] } else { -1.0 },
        priority,
        record,
        n as f64,
    ];
    let policies = policies();
    for (i, counter) in counters.iter().enumerate() {
        numbers.extend(policies[*counter]);
        numbers.push(0.0);
        // A budget far above the test's counters: `keys` is the single-counter tests' to meet.
        numbers.extend([budget_at, 100.0, 0.0, 0.0]);
        numbers.push((2 + 3 * n + i) as f64);
    }
    numbers.extend([0.0, 0.0]);
    if !same {
        numbers.extend(cost);
    }
    (keys, pack(&numbers))
}

/// What the acquires of several counters must have answered, each a few times.
const SEVERAL_STATUSES: [&str; 6] = [
    "granted",
    "denied",
    "cost",
    "a lease granted",
    "a lease denied",
    "a lease allowed, another denied",
];

/// Acquires of two or three counters, all or none, decided by the module on one namespace
/// and by the library on another, from the same numbers at the same instants (each counter at
/// its own cost now and then): the same replies, stored bytes and expiries, the concurrency
/// limit's leases among them (granted, denied, or allowed and not granted for another's
/// denial).
#[test]
fn an_acquire_of_several_counters_is_the_librarys() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    let seed = std::env::var("TOLLGATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("TOLLGATE_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    for namespace in ["smod", "slib"] {
        fcall(&mut conn, &keys(namespace, 0)[..1], &pack(&[OP_BEGIN]));
    }
    let mut native = 0;
    let mut statuses = std::collections::BTreeMap::<String, u32>::new();
    let mut clock = 0;
    // At least 400 acquires, then on until each answer below was met a few times.
    for step in 0..4_000 {
        let covered = SEVERAL_STATUSES
            .iter()
            .all(|status| statuses.get(*status) > Some(&3));
        if step >= 400 && covered {
            break;
        }
        if rng.u8(..3) == 0 {
            clock += rng.u64(1..2_000_000);
            server.set_clock(clock);
        }
        let mut counters: Vec<usize> = (0..=CONCURRENCY).collect();
        rng.shuffle(&mut counters);
        counters.truncate(rng.usize(2..4));
        // Now and then a cost past a counter's capacity (refused as `cost`).
        let mut cost: Vec<f64> = if rng.bool() {
            vec![f64::from(rng.u8(1..3)); counters.len()]
        } else {
            counters.iter().map(|_| f64::from(rng.u8(1..4))).collect()
        };
        if rng.u8(..20) == 0 {
            let last = cost.len() - 1;
            cost[last] = 9.0;
        }
        let (priority, record) = (f64::from(rng.u8(..3)), if rng.bool() { 1.0 } else { 0.0 });
        let (mod_keys, packed) = several("smod", &counters, &cost, priority, record);
        let (lib_keys, _) = several("slib", &counters, &cost, priority, record);
        let by_module = match module(&mut conn, &mod_keys, &packed) {
            Resp::Error(e) if e.starts_with("ERR tollgate: not native:") => {
                refused(step, "acquire of several counters", &e)
            }
            reply => {
                native += 1;
                reply
            }
        };
        let by_library = fcall(&mut conn, &lib_keys, &packed);
        assert_eq!(
            by_module, by_library,
            "step {step} (seed {seed}): replies differ"
        );
        assert_eq!(
            stored(&mut conn, &mod_keys),
            stored(&mut conn, &lib_keys),
            "step {step} (seed {seed}): stored values or expiries differ"
        );
        if let Resp::Array(reply) = &by_library
            && let Some(Resp::Bytes(status)) = reply.first()
        {
            let mut status = String::from_utf8_lossy(status).into_owned();
            if status == "ok" {
                status = match reply.get(4) {
                    Some(Resp::Int(0)) => "granted".into(),
                    _ => "denied".into(),
                };
                // The concurrency limit's own outcome, when it is among the counters.
                if let Some(i) = counters.iter().position(|c| *c == CONCURRENCY) {
                    *statuses
                        .entry(match reply.get(4 + 5 * i) {
                            Some(Resp::Int(0)) => "a lease granted".into(),
                            Some(Resp::Int(2)) => "a lease denied".into(),
                            _ => "a lease allowed, another denied".into(),
                        })
                        .or_default() += 1;
                }
            }
            *statuses.entry(status).or_default() += 1;
        }
    }
    eprintln!("native {native}, {statuses:?}");
    assert!(native >= 400, "the module acquired");
    for status in SEVERAL_STATUSES {
        assert!(statuses.get(status) > Some(&3), "{status} answered");
    }
}

const OP_LEAVE: f64 = 9.0;
/// Where a reply's denial reason is, after the outcome (`abi.rs`'s REASON_QUEUED: a denial
/// owed to places ahead).
const REASON_QUEUED: i64 = 3;

/// An acquire's packed numbers, `counters` of them, made a waiting request: its waiter's id (0:
/// it does not wait) and how long a place it takes lives, after every counter's numbers.
fn waiting(mut packed: Vec<u8>, counters: usize, waiter: f64, place_ttl_us: f64) -> Vec<u8> {
    let at = (5 + 15 * counters) * 8;
    packed[at..at + 8].copy_from_slice(&waiter.to_be_bytes());
    packed[at + 8..at + 16].copy_from_slice(&place_ttl_us.to_be_bytes());
    packed
}

/// Every key of the native counters of `namespace`, the key budgets a batch uses among them.
fn every_key(namespace: &str) -> Vec<Vec<u8>> {
    let mut all: Vec<Vec<u8>> = (0..policies().len())
        .flat_map(|c| keys(namespace, c))
        .collect();
    for budget in ["k0", "k1"] {
        all.push(format!("tg:{{t}}:{namespace}:{budget}").into_bytes());
    }
    all.sort();
    all.dedup();
    all
}

/// The denial reasons in an acquire's reply (one per counter denied), or a batch's.
fn reasons(reply: &Resp) -> Vec<i64> {
    match reply {
        Resp::Array(items) if matches!(items.first(), Some(Resp::Array(_))) => {
            items.iter().flat_map(reasons).collect()
        }
        Resp::Array(items) if items.first() == Some(&Resp::Bytes(b"ok".to_vec())) => items[4..]
            .chunks(5)
            .filter(|outcome| outcome[0] == Resp::Int(2))
            .filter_map(|outcome| match outcome[3] {
                Resp::Int(reason) => Some(reason),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether an acquire's reply (not a batch's) granted.
fn granted(reply: &Resp) -> bool {
    match reply {
        Resp::Array(items) => {
            items.first() == Some(&Resp::Bytes(b"ok".to_vec()))
                && items.get(4) == Some(&Resp::Int(0))
        }
        _ => false,
    }
}

/// Waiting requests of several waiters (each its id and priority; two of each priority, so
/// that equal arrivals at a clock standing still rank by id) and requests that do not wait,
/// on the native counters alone, several at once and in batches, with places living from a
/// fraction of a second to seconds on the test's clock, and waiters leaving: each decided by
/// the module or the library at random in one namespace and by the library alone in another.
/// Every reply (the ranks' `queued` denials, their retry hints), every stored value and expiry
/// (the queues' places taken, renewed, left and expired) and every wake-up published are the
/// same.
#[test]
fn waiting_requests_and_their_queues_interleaved_decide_as_the_library_alone() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    let mut wakes = subscriber(&server);
    load_library(&mut conn);
    let policies = policies();
    let seed = std::env::var("TOLLGATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("TOLLGATE_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    for namespace in ["mixed", "alone"] {
        fcall(&mut conn, &keys(namespace, 0)[..1], &pack(&[OP_BEGIN]));
    }
    // Waiters' ids as a process draws them (below 2^53); the i-th of priority i % 3.
    let waiters: Vec<f64> = (0..6).map(|_| rng.u64(1..1 << 53) as f64).collect();
    let function: &[&[u8]] = &[b"FCALL", FUNCTION.as_bytes()];
    let mut clock = 0;
    let mut counts = std::collections::BTreeMap::<&str, u32>::new();
    let wanted = [
        ("native acquires", 200),
        ("native batches", 30),
        ("native several", 30),
        ("native leaves", 30),
        ("queued", 40),
        ("queued newcomers", 10),
        ("waiters granted", 40),
        ("woken by acquires", 10),
        ("woken by leaves", 10),
    ];
    for step in 0..5 * STEPS {
        let covered = wanted
            .iter()
            .all(|(what, least)| counts.get(what).copied().unwrap_or(0) >= *least);
        if step >= STEPS && covered {
            break;
        }
        // The clock stands still for a few steps at a time: arrivals at one instant.
        if rng.u8(..3) == 0 {
            clock += rng.u64(1..1_500_000);
            server.set_clock(clock);
        }
        if rng.u16(..200) == 0 {
            for namespace in ["mixed", "alone"] {
                conn.call(&[b"DEL", &keys(namespace, 0)[0]]);
            }
        }
        let by_module = rng.bool();
        let place_ttl = [300_000.0, 1_000_000.0, 3_000_000.0][rng.usize(..3)];
        // A waiter, or (one time in four) a request that does not wait.
        let who = rng.usize(..8);
        let (waiter, priority) = if who < waiters.len() {
            (waiters[who], (who % 3) as f64)
        } else {
            (0.0, f64::from(rng.u8(..3)))
        };
        let record = if rng.bool() { 1.0 } else { 0.0 };
        let pause = if rng.u8(..25) == 0 {
            -((CLOCK_START_US + clock + rng.u64(..1_000_000)) as f64)
        } else {
            0.0
        };
        let kind = rng.u8(..10);
        let (mixed, alone) = if kind == 0 {
            // A waiter gives up its place on one counter (or has none there).
            let counter = rng.usize(..policies.len());
            let id = if rng.u8(..6) == 0 {
                rng.u64(1..1 << 53) as f64
            } else {
                waiters[rng.usize(..waiters.len())]
            };
            let packed = pack(&[OP_LEAVE, id]);
            let call = |conn: &mut Conn, namespace: &str, command: &[&[u8]]| {
                let all = keys(namespace, counter);
                call_on(
                    conn,
                    command,
                    &[all[0].clone(), all[4].clone()],
                    &[&packed, &all[1]],
                )
            };
            let mixed = if by_module {
                *counts.entry("native leaves").or_default() += 1;
                call(&mut conn, "mixed", &[b"TOLLGATE.LEAVE"])
            } else {
                call(&mut conn, "mixed", function)
            };
            (mixed, call(&mut conn, "alone", function))
        } else if kind <= 2 {
            // A batch of acquires, each its own waiter (or none), as the store batches them.
            let acquires: Vec<(usize, Vec<f64>)> = (0..rng.usize(2..5))
                .map(|_| {
                    let counter = rng.usize(..policies.len());
                    let who = rng.usize(..8);
                    let (id, priority) = if who < waiters.len() {
                        (waiters[who], (who % 3) as f64)
                    } else {
                        (0.0, f64::from(rng.u8(..3)))
                    };
                    let admission = if rng.bool() {
                        [0.0; 4]
                    } else {
                        [6.0, 3.0, 0.0, 0.0]
                    };
                    let mut numbers = acquire_numbers(
                        &policies[counter],
                        f64::from(rng.u8(1..3)),
                        priority,
                        record,
                        0.0,
                        admission,
                    );
                    let last = numbers.len();
                    numbers[last - 2] = id;
                    numbers[last - 1] = place_ttl;
                    (counter, numbers)
                })
                .collect();
            let (mixed_keys, packed) = batch("mixed", &acquires);
            let (alone_keys, _) = batch("alone", &acquires);
            let mixed = if by_module {
                *counts.entry("native batches").or_default() += 1;
                module(&mut conn, &mixed_keys, &packed)
            } else {
                fcall(&mut conn, &mixed_keys, &packed)
            };
            (mixed, fcall(&mut conn, &alone_keys, &packed))
        } else if kind <= 4 {
            // One request on two or three counters, all or none.
            let mut counters: Vec<usize> = (0..policies.len()).collect();
            rng.shuffle(&mut counters);
            counters.truncate(rng.usize(2..4));
            let cost: Vec<f64> = if rng.bool() {
                vec![f64::from(rng.u8(1..3)); counters.len()]
            } else {
                counters.iter().map(|_| f64::from(rng.u8(1..3))).collect()
            };
            let n = counters.len();
            let (mixed_keys, packed) = several("mixed", &counters, &cost, priority, record);
            let (alone_keys, _) = several("alone", &counters, &cost, priority, record);
            let packed = waiting(packed, n, waiter, place_ttl);
            let mixed = if by_module {
                *counts.entry("native several").or_default() += 1;
                module(&mut conn, &mixed_keys, &packed)
            } else {
                fcall(&mut conn, &mixed_keys, &packed)
            };
            let alone = fcall(&mut conn, &alone_keys, &packed);
            if waiter != 0.0 && granted(&alone) {
                *counts.entry("waiters granted").or_default() += 1;
            }
            (mixed, alone)
        } else {
            // One request on one counter.
            let counter = rng.usize(..policies.len());
            let admission = match rng.u8(..4) {
                0 => [6.0, 3.0, 0.0, 0.0],
                _ => [0.0; 4],
            };
            let packed = pack(&acquire_numbers(
                &policies[counter],
                f64::from(rng.u8(1..3)),
                priority,
                record,
                pause,
                admission,
            ));
            let packed = waiting(packed, 1, waiter, place_ttl);
            let mixed = if by_module {
                *counts.entry("native acquires").or_default() += 1;
                module(&mut conn, &keys("mixed", counter), &packed)
            } else {
                fcall(&mut conn, &keys("mixed", counter), &packed)
            };
            let alone = fcall(&mut conn, &keys("alone", counter), &packed);
            if waiter != 0.0 && granted(&alone) {
                *counts.entry("waiters granted").or_default() += 1;
            }
            if waiter == 0.0 && reasons(&alone).contains(&REASON_QUEUED) {
                *counts.entry("queued newcomers").or_default() += 1;
            }
            (mixed, alone)
        };
        assert_eq!(mixed, alone, "step {step} (seed {seed}): replies differ");
        assert!(
            !matches!(&alone, Resp::Error(_)),
            "step {step} (seed {seed}): {alone:?}"
        );
        assert_eq!(
            stored(&mut conn, &every_key("mixed")),
            stored(&mut conn, &every_key("alone")),
            "step {step} (seed {seed}): stored values or expiries differ"
        );
        let (mixed_wakes, alone_wakes) = wake_ups(&mut conn, &mut wakes);
        let mixed_wakes: Vec<Vec<u8>> = mixed_wakes
            .iter()
            .map(|key| {
                String::from_utf8_lossy(key)
                    .replace(":mixed:", ":alone:")
                    .into_bytes()
            })
            .collect();
        assert_eq!(
            mixed_wakes, alone_wakes,
            "step {step} (seed {seed}): wake-ups published differ"
        );
        if !alone_wakes.is_empty() {
            let by = if kind == 0 {
                "woken by leaves"
            } else {
                "woken by acquires"
            };
            *counts.entry(by).or_default() += 1;
        }
        let queued = reasons(&alone)
            .iter()
            .filter(|reason| **reason == REASON_QUEUED)
            .count();
        *counts.entry("queued").or_default() += queued as u32;
    }
    eprintln!("{counts:?}");
    for (what, least) in wanted {
        assert!(
            counts.get(what).copied().unwrap_or(0) >= least,
            "{what}: {counts:?}"
        );
    }
}

/// Both namespaces begun, and counter 0's whole burst taken in each by the library: the next
/// request is denied, and would stand in the queue.
fn burst_taken(conn: &mut Conn) {
    for namespace in ["mixed", "alone"] {
        fcall(conn, &keys(namespace, 0)[..1], &pack(&[OP_BEGIN]));
        let all = pack(&acquire_numbers(
            &policies()[0],
            4.0,
            2.0,
            0.0,
            0.0,
            [0.0; 4],
        ));
        assert!(granted(&fcall(conn, &keys(namespace, 0), &all)));
    }
}

/// A waiting request whose place would expire before it is taken (a lifetime far below zero)
/// fails in Redis, by the module as by the library, rather than being answered as if its
/// place were kept.
#[test]
fn a_place_that_expires_before_it_is_taken_fails_as_in_the_library() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    burst_taken(&mut conn);
    let packed = waiting(
        pack(&acquire_numbers(
            &policies()[0],
            1.0,
            2.0,
            0.0,
            0.0,
            [0.0; 4],
        )),
        1,
        7.0,
        -5e6,
    );
    let by_module = module(&mut conn, &keys("mixed", 0), &packed);
    let by_library = fcall(&mut conn, &keys("alone", 0), &packed);
    for reply in [&by_module, &by_library] {
        assert!(
            matches!(reply, Resp::Error(error) if error.contains("invalid expire time")),
            "{reply:?}"
        );
    }
    assert_eq!(
        stored(&mut conn, &keys("mixed", 0)),
        stored(&mut conn, &keys("alone", 0))
    );
}

/// A full queue keeps its best places: forty waiters of three priorities, several at each
/// instant, stand on one counter (module and library taking turns in one namespace, the
/// library alone in another) past the 32 places a queue keeps; a waiter ranked past the last
/// place is not kept, one ranked before it takes the last one's. The same replies and bytes.
#[test]
fn a_full_queue_keeps_its_best_places_as_in_the_library() {
    let Some(server) = start() else { return };
    let mut conn = server.conn();
    load_library(&mut conn);
    burst_taken(&mut conn);
    let mut clock = 0;
    for id in 1..=40u64 {
        if id % 4 == 0 {
            clock += 1_000;
            server.set_clock(clock);
        }
        // Ids not in arrival order: equal arrivals rank by id.
        let waiter = ((id * 7_919) % 101 + 1) as f64;
        let packed = waiting(
            pack(&acquire_numbers(
                &policies()[0],
                1.0,
                (id % 3) as f64,
                0.0,
                0.0,
                [0.0; 4],
            )),
            1,
            waiter,
            60e6,
        );
        let mixed = if id % 2 == 0 {
            module(&mut conn, &keys("mixed", 0), &packed)
        } else {
            fcall(&mut conn, &keys("mixed", 0), &packed)
        };
        let alone = fcall(&mut conn, &keys("alone", 0), &packed);
        assert_eq!(mixed, alone, "waiter {id}: replies differ");
        assert_eq!(
            stored(&mut conn, &keys("mixed", 0)),
            stored(&mut conn, &keys("alone", 0)),
            "waiter {id}: stored values or expiries differ"
        );
    }
    match conn.call(&[b"STRLEN", &keys("alone", 0)[4]]) {
        Resp::Int(length) => assert_eq!(length, 32 * 40, "a full queue"),
        other => panic!("STRLEN: {other:?}"),
    }
}
