//! Throughput of acquires that contend and wait, on a tokio multi-thread runtime with two
//! workers (the machine's two cores), in wall-clock time:
//!
//! - `acquire_waiting`: 64 tasks share a sliding limit of 1,000 per 100 ms and each loops
//!   `acquire(.. .wait(1 s))` until the run's grants are taken. The limit is saturated before
//!   the clock starts counting grants, so every counted grant waited for room, and the ideal is
//!   the limit's own rate: 10,000 grants/s. Criterion's `thrpt` line is grants/s.
//! - `lease_churn`: 64 tasks share a concurrency limit of 8 and each loops acquire (waiting),
//!   yield while holding the lease, commit. Criterion's `thrpt` line is acquire+commit pairs/s.
//!
//! Run: `cargo bench -p tollgate --bench contended -- --warm-up-time 1 --measurement-time 4`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::{Algorithm, Limit, Limiter, Outcome, Policy, Request, Reserve};

/// Tasks contending in every case.
const TASKS: u64 = 64;
/// The waiting case's limit: units per period.
const RATE_LIMIT: u64 = 1_000;
const RATE_PERIOD_US: u64 = 100_000;
/// Grants counted per run: three full periods at the limit, so 300 ms at the ideal rate.
const WAITING_GRANTS_PER_RUN: u64 = 3 * RATE_LIMIT;
/// The lease case's limit: leases held at once.
const LEASES_MAX: u64 = 8;
const LEASE_TTL_US: u64 = 10_000_000;
/// Acquire+commit pairs per task per run.
const LEASE_CYCLES_PER_TASK: u64 = 100;
/// How long one acquire may wait; far above any wait these runs need.
const WAIT_MAX: Duration = Duration::from_secs(1);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a tokio runtime")
}

fn limiter_with(name: &str, policy: Policy) -> Limiter {
    let limiter = Limiter::in_memory();
    limiter.set_limit(Limit::new(name, policy, None).expect("valid limit"));
    limiter
}

/// One run of the waiting case: the wall time from saturating the limit to the last grant.
async fn waiting_run() -> Duration {
    let policy = Policy::rate(
        RATE_LIMIT,
        RATE_PERIOD_US,
        0,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid policy");
    let limiter = limiter_with("vendor", policy);
    let start = Instant::now();
    // Take the whole first period at once: from here on every grant must wait for room.
    let request = Request::new("vendor");
    for _ in 0..RATE_LIMIT {
        let outcome = limiter
            .try_acquire(&request)
            .await
            .expect("a valid request");
        assert!(outcome.is_granted(), "the first period's units are open");
    }
    let grants_left = Arc::new(AtomicU64::new(WAITING_GRANTS_PER_RUN));
    let timeouts = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let limiter = limiter.clone();
            let grants_left = grants_left.clone();
            let timeouts = timeouts.clone();
            tokio::spawn(async move {
                let request = Request::new("vendor").wait(WAIT_MAX);
                // Claim a grant to take, then wait for it; the run ends when none are left.
                while grants_left
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                        left.checked_sub(1)
                    })
                    .is_ok()
                {
                    loop {
                        match limiter.acquire(&request).await.expect("a valid request") {
                            Outcome::Granted(permit) => {
                                drop(permit);
                                break;
                            }
                            Outcome::Denied(_) => {
                                timeouts.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a bench task");
    }
    let elapsed = start.elapsed();
    let timeouts = timeouts.load(Ordering::Relaxed);
    assert_eq!(timeouts, 0, "no acquire should wait its whole second");
    elapsed
}

/// One run of the lease case: the wall time for every task's acquire+commit cycles.
async fn lease_run() -> Duration {
    let policy =
        Policy::concurrency(LEASES_MAX, LEASE_TTL_US, Reserve::default()).expect("valid policy");
    let limiter = limiter_with("pool", policy);
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let request = Request::new("pool").wait(WAIT_MAX);
                for _ in 0..LEASE_CYCLES_PER_TASK {
                    let permit = limiter
                        .acquire(&request)
                        .await
                        .expect("a valid request")
                        .granted()
                        .expect("a lease within the wait");
                    // Hold the lease across a scheduling point, so that others find it taken.
                    tokio::task::yield_now().await;
                    let committed = permit.commit(0).await.expect("a held lease commits");
                    assert_eq!(committed.released, 1);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a bench task");
    }
    start.elapsed()
}

fn acquire_waiting(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("acquire_waiting");
    group.sample_size(10);
    group.throughput(Throughput::Elements(WAITING_GRANTS_PER_RUN));
    group.bench_function("sliding_1000_per_100ms/64_tasks", |b| {
        b.iter_custom(|runs| (0..runs).map(|_| runtime.block_on(waiting_run())).sum())
    });
    group.finish();
}

fn lease_churn(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("lease_churn");
    group.sample_size(10);
    group.throughput(Throughput::Elements(TASKS * LEASE_CYCLES_PER_TASK));
    group.bench_function("concurrency_8/64_tasks", |b| {
        b.iter_custom(|runs| (0..runs).map(|_| runtime.block_on(lease_run())).sum())
    });
    group.finish();
}

criterion_group!(benches, acquire_waiting, lease_churn);
criterion_main!(benches);
