//! Four OS processes x 50 callers calling one mock vendor through dispatchers. The vendor
//! counts every call itself and escalates its `Retry-After` for every request that arrives
//! during a cessation.
//!
//! - sharing the Redis store: after a 429 no request reaches the vendor until the cessation
//!   ends (zero escalations), and every job completes;
//! - each process on its own memory store: no process sends during a wait it was told of (at
//!   most the one request that tells it, per process), but the processes escalate each other:
//!   the fleet-wide pause is what the shared store adds.

#[path = "../../redis/tests/common.rs"]
mod common;
#[path = "../../dispatch/tests/common/mod.rs"]
mod vendor;

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use vendor::{Vendor, VendorRules};

const PROCESSES: usize = 4;
const CALLERS: u32 = 50;

struct Fleet {
    children: Vec<Child>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
        }
    }
}

#[derive(Debug, Default)]
struct Outcome {
    done_ok: u64,
    other: Vec<String>,
    unfinished: u64,
    rate_limited: u64,
}

/// Start the fleet, wait for it (off the runtime that serves the vendor), gather its lines.
async fn run_fleet(vendor: &Vendor, store: &str, namespace: &str, deadline_ms: u64) -> Outcome {
    let binary = env!("CARGO_BIN_EXE_tollgate-dispatch-worker");
    let mut fleet = Fleet {
        children: (0..PROCESSES)
            .map(|process| {
                Command::new(binary)
                    .args([
                        vendor.url(),
                        store.to_owned(),
                        namespace.to_owned(),
                        format!("p{process}"),
                        CALLERS.to_string(),
                        // The quota is looser than the vendor's (30 vs 20 per second), so the
                        // vendor does answer 429; one request in flight per host (see below).
                        "30".into(),
                        "1000".into(),
                        "1".into(),
                        deadline_ms.to_string(),
                    ])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("start a worker")
            })
            .collect(),
    };
    let children = std::mem::take(&mut fleet.children);
    tokio::task::spawn_blocking(move || {
        let mut outcome = Outcome::default();
        for mut child in children {
            let mut text = String::new();
            child
                .stdout
                .take()
                .expect("piped")
                .read_to_string(&mut text)
                .expect("worker output");
            assert!(child.wait().expect("exit").success(), "a worker failed");
            for line in text.lines() {
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["done", "200"] => outcome.done_ok += 1,
                    ["unfinished", n] => outcome.unfinished += n.parse::<u64>().expect("n"),
                    ["stats", _sent, limited, ..] => {
                        outcome.rate_limited += limited.parse::<u64>().expect("n")
                    }
                    _ => outcome.other.push(line.to_owned()),
                }
            }
        }
        outcome
    })
    .await
    .expect("gather")
}

fn vendor_rules() -> VendorRules {
    VendorRules {
        limit: 20,
        period: Duration::from_secs(1),
        retry_after_s: 1,
        retry_after_s_max: 8,
    }
}

/// The paused-vendor scenario (docs/guarantees.md) with a shared store. The host's concurrency
/// limit is 1 fleet-wide, and the dispatcher records the pause before it releases the lease: so the
/// request that gets the 429 is the only one in flight, and the next grant anywhere sees the pause.
/// Zero escalations then holds by construction, not by timing. With more in flight, requests
/// already on the wire when the 429 comes back still arrive (docs/outbound.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_sharing_redis_sends_nothing_during_a_cessation() {
    let Some(url) = common::redis_url("a_fleet_sharing_redis_sends_nothing_during_a_cessation")
    else {
        return;
    };
    let namespace = common::namespace("shared");
    common::declare_fresh(&url, &namespace).await;
    let vendor = Vendor::start(vendor_rules()).await;
    let outcome = run_fleet(&vendor, &url, &namespace, 120_000).await;
    let tally = vendor.tally();
    eprintln!(
        "shared store: {outcome:?}; vendor: calls {} ok {} limited {} escalations {} most in a window {}",
        tally.calls, tally.ok, tally.limited, tally.escalations, tally.most_in_a_window
    );
    assert!(
        tally.limited >= 1,
        "the test must provoke the vendor: {tally:?}"
    );
    assert_eq!(
        tally.escalations, 0,
        "a request reached the vendor during a cessation"
    );
    assert!(tally.disobeyed.is_empty(), "{:?}", tally.disobeyed);
    assert_eq!(outcome.unfinished, 0, "{outcome:?}");
    assert!(outcome.other.is_empty(), "{outcome:?}");
    assert_eq!(
        outcome.done_ok,
        (PROCESSES as u64) * u64::from(CALLERS),
        "every job completes"
    );
    assert_eq!(
        tally.ok, outcome.done_ok,
        "each job got through exactly once"
    );
}

/// Without a shared store each process learns of a cessation only from its own 429: it sends
/// at most that one request into the cessation and nothing until the wait it was told ends,
/// but the others' requests escalate the wait for everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_shared_store_each_process_obeys_only_what_it_was_told() {
    let vendor = Vendor::start(vendor_rules()).await;
    let outcome = run_fleet(&vendor, "memory", "-", 15_000).await;
    let tally = vendor.tally();
    eprintln!(
        "memory stores: {outcome:?}; vendor: calls {} ok {} limited {} escalations {}",
        tally.calls, tally.ok, tally.limited, tally.escalations
    );
    assert!(tally.limited >= 1, "{tally:?}");
    assert!(
        tally.disobeyed.is_empty(),
        "a process sent during a wait the vendor had told it: {:?}",
        tally.disobeyed
    );
    assert!(outcome.other.is_empty(), "{outcome:?}");
}
