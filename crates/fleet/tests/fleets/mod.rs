//! Fleets of worker processes (`tollgate-fleet-worker`) and the outside count of their grants,
//! shared by the fleet, cluster and Sentinel tests: free-running fleets, whose grants are counted
//! at the decision times the workers print, and stepped fleets, whose every grant is bracketed by
//! this process's own clock.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use tollgate_redis::loss::Generation;

fn worker_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tollgate-fleet-worker"))
}

pub struct Fleet {
    children: Vec<Child>,
}

pub struct Run {
    pub name: String,
    pub limit: u64,
    pub period_ms: u64,
    pub acquirers: u64,
    pub duration_ms: u64,
    pub algorithm: &'static str,
}

/// A worker process with its clock moved by `skew` (libfaketime's `FAKETIME`, e.g. `"+7s"`),
/// if any.
fn worker_command(args: &[&str], skew: Option<&str>) -> Command {
    let mut command = Command::new(worker_binary());
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(offset) = skew {
        command
            .env(
                "LD_PRELOAD",
                faketime_library().expect("checked by the caller"),
            )
            .env("FAKETIME", offset)
            .env("FAKETIME_DONT_RESET", "1");
    }
    command
}

impl Fleet {
    pub fn start(url: &str, namespace: &str, run: &Run, skews: &[Option<&str>]) -> Fleet {
        let (limit, period_ms) = (run.limit.to_string(), run.period_ms.to_string());
        let (acquirers, duration_ms) = (run.acquirers.to_string(), run.duration_ms.to_string());
        let args = [
            url,
            namespace,
            &run.name,
            &limit,
            &period_ms,
            &acquirers,
            &duration_ms,
            run.algorithm,
        ];
        let children = skews
            .iter()
            .map(|skew| {
                worker_command(&args, *skew)
                    .spawn()
                    .expect("start a fleet worker")
            })
            .collect();
        Fleet { children }
    }

    /// Every grant's decision time, and the total of errors the workers met.
    pub fn collect(self) -> (Vec<u64>, u64) {
        let (by_limit, errors) = self.collect_by_limit();
        let mut grants: Vec<u64> = by_limit.into_values().flatten().collect();
        grants.sort_unstable();
        (grants, errors)
    }

    /// Every grant's decision time per limit, and the total of errors the workers met.
    pub fn collect_by_limit(mut self) -> (BTreeMap<String, Vec<u64>>, u64) {
        let mut grants: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut errors = 0;
        for mut child in std::mem::take(&mut self.children) {
            let stdout = child.stdout.take().expect("piped");
            for line in BufReader::new(stdout).lines() {
                let line = line.expect("worker output");
                let mut words = line.split_whitespace();
                match words.next() {
                    Some("grant") => {
                        let at: u64 = words.next().and_then(|w| w.parse().ok()).expect("time");
                        let limit = words.nth(1).unwrap_or_default().to_owned();
                        grants.entry(limit).or_default().push(at);
                    }
                    Some("error") => errors += 1,
                    _ => {}
                }
            }
            let status = child.wait().expect("worker exit");
            assert!(status.success(), "a worker failed: {status}");
        }
        for times in grants.values_mut() {
            times.sort_unstable();
        }
        (grants, errors)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
        }
    }
}

/// A grant as this process saw it: decided at some instant of `[after_us, before_us]` on this
/// process's monotonic clock (microseconds since the fleet started), by worker `worker`. No
/// number the worker or the store printed goes into it.
#[derive(Clone, Copy, Debug)]
pub struct Bracket {
    pub after_us: u64,
    pub before_us: u64,
    pub worker: usize,
}

/// One `tollgate-fleet-worker --steps` process.
struct Stepper {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    skew: Option<String>,
}

impl Stepper {
    /// The next line the worker printed.
    fn line(&mut self) -> String {
        let mut line = String::new();
        let read = self.output.read_line(&mut line).expect("worker output");
        assert!(read > 0, "worker (clock {:?}) ended early", self.skew);
        line.trim_end().to_owned()
    }

    fn ask(&mut self, asks: Asks, count: u64) {
        let verb = match asks {
            Asks::OneByOne => "take",
            Asks::AtOnce => "burst",
        };
        writeln!(self.input, "{verb} {count}").expect("write to a worker");
        self.input.flush().expect("write to a worker");
    }

    /// The grants of the step asked last, and how many of its asks the worker's store decided
    /// in a batch, once the worker says it is over. Redis is up for every stepped test: an
    /// error fails it.
    fn grants(&mut self) -> (u64, u64) {
        let mut grants = 0;
        loop {
            let line = self.line();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("grant") => grants += 1,
                Some("taken") => {
                    let mut number =
                        || -> u64 { words.next().and_then(|w| w.parse().ok()).expect("count") };
                    let (said, batched) = (number(), number());
                    assert_eq!(
                        said, grants,
                        "worker printed {grants} grant lines, said {said}"
                    );
                    return (grants, batched);
                }
                _ => panic!("worker (clock {:?}) failed: {line}", self.skew),
            }
        }
    }
}

/// How a worker makes a step's asks: one after another (each its own call to Redis), or all at
/// once (the first calls alone, the rest batched by the store: `tollgate_redis`'s `batch.rs`).
#[derive(Clone, Copy, Debug)]
pub enum Asks {
    OneByOne,
    AtOnce,
}

/// What a stepped fleet's step gave: every grant bracketed, and for each worker asked, how many
/// of its asks its store decided in a call with others (as the worker reported).
pub struct Step {
    pub brackets: Vec<Bracket>,
    pub batched: Vec<(usize, u64)>,
}

/// Workers driven one step at a time (`tollgate-fleet-worker --steps`). Each step is bracketed
/// by two readings of this process's monotonic clock, before it asks and after the last answer
/// is read, so every grant is known to have been decided within its step's bracket, whatever
/// clock the workers or the store read.
pub struct SteppedFleet {
    workers: Vec<Stepper>,
    started: Instant,
}

impl SteppedFleet {
    /// One worker per entry of `skews`, each on limit `name` (`limit` per `period_ms`), every
    /// one connected before this returns.
    pub fn start(
        url: &str,
        namespace: &str,
        name: &str,
        (limit, period_ms): (u64, u64),
        algorithm: &str,
        skews: &[Option<&str>],
    ) -> SteppedFleet {
        let (limit, period_ms) = (limit.to_string(), period_ms.to_string());
        let args = [
            "--steps", url, namespace, name, &limit, &period_ms, algorithm,
        ];
        let mut workers: Vec<Stepper> = skews
            .iter()
            .map(|skew| {
                let mut child = worker_command(&args, *skew)
                    .stdin(Stdio::piped())
                    .spawn()
                    .expect("start a fleet worker");
                Stepper {
                    input: child.stdin.take().expect("piped"),
                    output: BufReader::new(child.stdout.take().expect("piped")),
                    child,
                    skew: skew.map(str::to_owned),
                }
            })
            .collect();
        for worker in &mut workers {
            let line = worker.line();
            assert_eq!(line, "ready", "worker (clock {:?})", worker.skew);
        }
        SteppedFleet {
            workers,
            started: Instant::now(),
        }
    }

    /// This process's clock, in microseconds since the fleet started.
    pub fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Workers `order`, one after another, each asking `count` times as `asks` says: every
    /// grant bracketed by its own worker's step.
    pub fn in_turn(&mut self, order: &[usize], asks: Asks, count: u64) -> Step {
        let mut step = Step {
            brackets: Vec::new(),
            batched: Vec::new(),
        };
        for &worker in order {
            let after_us = self.now_us();
            self.workers[worker].ask(asks, count);
            let (grants, batched) = self.workers[worker].grants();
            let before_us = self.now_us();
            step.brackets.extend((0..grants).map(|_| Bracket {
                after_us,
                before_us,
                worker,
            }));
            step.batched.push((worker, batched));
        }
        step
    }

    /// Every worker at once, each asking `count` times as `asks` says: every grant bracketed by
    /// the whole step.
    pub fn together(&mut self, asks: Asks, count: u64) -> Step {
        let after_us = self.now_us();
        for worker in &mut self.workers {
            worker.ask(asks, count);
        }
        let answers: Vec<(u64, u64)> = self.workers.iter_mut().map(Stepper::grants).collect();
        let before_us = self.now_us();
        let brackets = answers
            .iter()
            .enumerate()
            .flat_map(|(worker, &(grants, _))| {
                (0..grants).map(move |_| Bracket {
                    after_us,
                    before_us,
                    worker,
                })
            })
            .collect();
        let batched = answers
            .iter()
            .enumerate()
            .map(|(worker, &(_, batched))| (worker, batched))
            .collect();
        Step { brackets, batched }
    }
}

impl Drop for SteppedFleet {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.child.kill();
            let _ = worker.child.wait();
        }
    }
}

/// The most grants that are certainly decided within one half-open interval of `span_us`: all
/// of whose brackets fit inside it. Sound whatever the brackets' widths (a wide bracket only
/// makes the count smaller), so a count above a limit proves an overshoot.
pub fn most_certainly_within(brackets: &[Bracket], span_us: u64) -> usize {
    brackets
        .iter()
        .map(|first| {
            brackets
                .iter()
                .filter(|other| {
                    other.after_us >= first.after_us && other.before_us < first.after_us + span_us
                })
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// libfaketime's library, at the first of the paths every script looks at
/// (`tests/faketime-libraries`) that holds it.
pub fn faketime_library() -> Option<&'static str> {
    include_str!("../../../../tests/faketime-libraries")
        .lines()
        .map(str::trim)
        .find(|path| !path.is_empty() && std::path::Path::new(path).exists())
}

/// The most grants in any half-open window `[t, t + period)` (sliding) or aligned window
/// (fixed), from the grants' decision times.
pub fn most_in_a_window(grants: &[u64], period_us: u64, algorithm: &str) -> u64 {
    if algorithm == "fixed" {
        let mut per_window = BTreeMap::new();
        for at in grants {
            *per_window.entry(at / period_us).or_insert(0u64) += 1;
        }
        return per_window.into_values().max().unwrap_or(0);
    }
    let mut most = 0;
    let mut start = 0;
    for end in 0..grants.len() {
        while grants[end] - grants[start] >= period_us {
            start += 1;
        }
        most = most.max((end - start + 1) as u64);
    }
    most
}

/// The wall clock, in microseconds: the clock Redis reads for `TIME` when it runs on this
/// machine, as the private nodes of the cluster and Sentinel tests do.
pub fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

/// `after` is a generation started after the fault at `fault_at_us` (wall clock) by another
/// owner than `before`, the one read before the fault: the generation the hold is judged from.
pub fn assert_new_generation(before: &Generation, after: &Generation, fault_at_us: u64) {
    assert!(
        after.born_us > fault_at_us && after.born_us > before.born_us,
        "no generation born after the fault at {fault_at_us}: before {before:?}, after {after:?}"
    );
    assert_ne!(
        after.owner, before.owner,
        "the generation's owner did not change"
    );
}

/// A limit's grants (decision times) across a fault at `fault_at_us` that started the
/// generation born at `born_us`: served before the fault, nothing inside `[born, born +
/// period)`, served again after it. The grants on both sides show the fleet asked throughout,
/// so an empty hold is the store's doing, not a lull.
pub fn assert_held_for_a_period(times: &[u64], fault_at_us: u64, born_us: u64, period_ms: u64) {
    let held_until_us = born_us + period_ms * 1_000;
    assert!(
        times.iter().any(|&at| at < fault_at_us),
        "no grant before the fault: the hold was never put to the test"
    );
    let inside: Vec<u64> = times
        .iter()
        .copied()
        .filter(|&at| at >= born_us && at < held_until_us)
        .collect();
    assert!(
        inside.is_empty(),
        "grants inside the hold [{born_us}, {held_until_us}): {inside:?}"
    );
    assert!(
        times.iter().any(|&at| at >= held_until_us),
        "the limit was not served again after its hold"
    );
}
