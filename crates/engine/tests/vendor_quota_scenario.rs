//! The scenario that motivates Tollgate: one bulk caller making as many calls as it may, three
//! priority callers making 1 or 2 calls each now and then, a vendor allowing N calls per period
//! (N in 5..=10). Thousands of periods run on tokio's paused clock. The test keeps its own log
//! of every call the "vendor" receives and checks, from that log alone:
//!
//! - zero overshoot: never more than N calls in a period (any window for `sliding`, each aligned
//!   window for `fixed`);
//! - priority: a high-priority request never waits while the log shows room for it, unless an
//!   earlier high-priority request is still waiting (first come, first served within a level;
//!   no lower level ever delays it);
//! - nothing is wasted but the reserve: bulk fills what the priority callers leave, so all calls
//!   together reach at least the share bulk alone could use.
//!
//! Each run prints its seed; `TOLLGATE_SEED=<n>` replays one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{Algorithm, Limit, Limiter, Policy, Priority, Request, Reserve};

const PERIOD: Duration = Duration::from_secs(1);
const PERIODS: u64 = 2_000;
/// Units bulk work leaves for the priority callers.
const RESERVED_FOR_HIGH: u64 = 2;

/// A small deterministic generator (xorshift64*), so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// What the vendor saw: the instant of every call, in arrival order.
#[derive(Default)]
struct VendorLog {
    calls: Vec<Instant>,
}

impl VendorLog {
    /// Calls that count against a request made at `now`.
    fn counted_at(&self, now: Instant, algorithm: Algorithm, origin: Instant) -> u64 {
        let counted = |call: &&Instant| match algorithm {
            Algorithm::Fixed => window_of(**call, origin) == window_of(now, origin),
            _ => now.duration_since(**call) < PERIOD,
        };
        self.calls.iter().rev().take(64).filter(counted).count() as u64
    }
}

fn window_of(instant: Instant, origin: Instant) -> u128 {
    // The limiter's clock counts aligned windows from its own epoch; the test aligns to the
    // same epoch through `origin_offset` below.
    instant.duration_since(origin).as_micros() / PERIOD.as_micros()
}

fn check_no_overshoot(calls: &[Instant], limit: u64, algorithm: Algorithm, origin: Instant) {
    match algorithm {
        Algorithm::Fixed => {
            let mut per_window = std::collections::BTreeMap::new();
            for call in calls {
                *per_window.entry(window_of(*call, origin)).or_insert(0u64) += 1;
            }
            for (window, count) in per_window {
                assert!(count <= limit, "window {window}: {count} calls > {limit}");
            }
        }
        _ => {
            // Two pointers over the sorted calls: every half-open window [t, t + period).
            let mut start = 0;
            for end in 0..calls.len() {
                while calls[end].duration_since(calls[start]) >= PERIOD {
                    start += 1;
                }
                let count = (end - start + 1) as u64;
                assert!(
                    count <= limit,
                    "{count} calls within one period ending at call {end} > {limit}"
                );
            }
        }
    }
}

async fn run(seed: u64, limit: u64, algorithm: Algorithm) {
    // One clock for the limiter and for the test's window alignment.
    let clock = Arc::new(tollgate::MonotonicClock::new());
    let store = tollgate::MemoryStore::new(
        tollgate::MemoryStoreConfig {
            keys_tracked_max: 1_000,
            keys_per_limit_max: 1_000,
        },
        clock.clone(),
    );
    let limiter = Limiter::new(
        Arc::new(store),
        tollgate::LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: tollgate::PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..tollgate::LimiterConfig::default()
        },
    );
    let policy = Policy::rate(
        limit,
        PERIOD.as_micros() as u64,
        0,
        algorithm,
        Reserve {
            high: RESERVED_FOR_HIGH,
            normal: 0,
        },
    )
    .expect("valid policy");
    limiter.set_limit(Limit::new("vendor", policy, None).expect("valid limit"));
    // Fixed windows are aligned on the limiter's clock (Unix micros); find where one starts.
    let now_us = tollgate::Clock::now_us(&*clock);
    let origin = Instant::now() - Duration::from_micros(now_us % PERIOD.as_micros() as u64);

    let log = Arc::new(Mutex::new(VendorLog::default()));
    let end = Instant::now() + PERIOD * PERIODS as u32;

    let bulk = {
        let limiter = limiter.clone();
        let log = log.clone();
        tokio::spawn(async move {
            let mut calls = 0u64;
            while Instant::now() < end {
                let request = Request::new("vendor")
                    .priority(Priority::Low)
                    .wait(Duration::from_secs(5));
                if let Some(permit) = limiter.acquire(&request).await.expect("acquire").granted() {
                    log.lock().expect("log").calls.push(Instant::now());
                    calls += 1;
                    permit.commit(1).await.expect("commit");
                }
            }
            calls
        })
    };

    // High-priority requests asked and not yet answered.
    let high_pending = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut priority_callers = Vec::new();
    for caller in 0..3u64 {
        let limiter = limiter.clone();
        let log = log.clone();
        let high_pending = high_pending.clone();
        let mut rng = Rng(seed ^ (caller + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        priority_callers.push(tokio::spawn(async move {
            let mut calls = 0u64;
            loop {
                // Think for up to two periods, in whole milliseconds.
                tokio::time::sleep(Duration::from_millis(rng.below(2_000))).await;
                if Instant::now() >= end {
                    return calls;
                }
                let cost = 1 + rng.below(2);
                let asked_at = Instant::now();
                let room = {
                    let log = log.lock().expect("log");
                    limit - log.counted_at(asked_at, algorithm, origin).min(limit) >= cost
                };
                let request = Request::new("vendor")
                    .priority(Priority::High)
                    .cost(cost)
                    .wait(Duration::from_secs(5));
                let ahead = high_pending.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let permit = limiter
                    .acquire(&request)
                    .await
                    .expect("acquire")
                    .granted()
                    .expect("a high-priority call is granted within one period");
                high_pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                let waited = asked_at.elapsed();
                assert!(
                    !room || ahead > 0 || waited.is_zero(),
                    "seed {seed}: a high call of cost {cost} waited {waited:?} with room for it \
                     and no high call ahead of it"
                );
                {
                    let mut log = log.lock().expect("log");
                    for _ in 0..cost {
                        log.calls.push(Instant::now());
                    }
                }
                calls += cost;
                permit.commit(cost).await.expect("commit");
            }
        }));
    }

    let bulk_calls = bulk.await.expect("bulk");
    let mut priority_calls = 0;
    for caller in priority_callers {
        priority_calls += caller.await.expect("caller");
    }
    let calls = log.lock().expect("log").calls.clone();
    assert_eq!(calls.len() as u64, bulk_calls + priority_calls);
    check_no_overshoot(&calls, limit, algorithm, origin);
    // Bulk may use everything but the reserve, and always wants more: whatever the priority
    // callers take, the calls together fill at least that share (less one period at the end).
    let floor = (limit - RESERVED_FOR_HIGH) * (PERIODS - 1);
    let total = bulk_calls + priority_calls;
    assert!(
        total >= floor,
        "seed {seed}: {total} calls in {PERIODS} periods, below the {floor} bulk alone could make"
    );
    println!(
        "seed {seed} N={limit} {}: {bulk_calls} bulk + {priority_calls} priority calls in \
         {PERIODS} periods, {:.1}% of the limit",
        algorithm.name(),
        100.0 * total as f64 / (limit * PERIODS) as f64
    );
}

fn seed() -> u64 {
    match std::env::var("TOLLGATE_SEED") {
        Ok(text) => text.parse().expect("TOLLGATE_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_nanos() as u64 | 1)
            .unwrap_or(0x5eed),
    }
}

#[tokio::test(start_paused = true)]
async fn vendor_quota_sliding_never_overshoots_and_never_delays_priority() {
    let seed = seed();
    for limit in 5..=10 {
        run(seed, limit, Algorithm::Sliding).await;
    }
}

#[tokio::test(start_paused = true)]
async fn vendor_quota_fixed_never_overshoots_and_never_delays_priority() {
    let seed = seed();
    for limit in 5..=10 {
        run(seed, limit, Algorithm::Fixed).await;
    }
}
