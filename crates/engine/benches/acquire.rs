//! Latency of one `try_acquire` decision on the in-memory store, next to governor's limiters
//! measured the same way: one unkeyed limit (against `RateLimiter::direct`) and 10,000 keys of
//! a per-key limit (against `RateLimiter::keyed`), each from one thread and from two.
//!
//! Every limit here is too large ever to deny (a billion units a second), so the figures are
//! the cost of a grant, not of a denial. The memory store answers at once, so the async
//! `try_acquire` is driven by polling it once with a no-op waker: no runtime, no scheduling.
//!
//! `memory_store_*` rows ask the store directly for the same grant, without the limiter around
//! it (resolving names, the wait queue, the permit): the difference is the limiter's share.
//!
//! Two-thread cases: each thread does half of the iterations, and the time reported is the wall
//! time of the whole run divided by all iterations (time per decision across both threads, the
//! inverse of throughput), for tollgate and governor alike. Perfect scaling would halve it.
//!
//! Run: `cargo bench -p tollgate --bench acquire -- --warm-up-time 1 --measurement-time 3`

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate::{
    Algorithm, CounterId, Limit, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, Outcome,
    PermitSecret, Policy, Priority, Request, Reserve, Take, TscClock,
};

/// Units per period of every limit here: the largest the core accepts, never reached.
const UNITS_PER_SECOND: u64 = 1_000_000_000;
/// A GCRA limit counts in whole microseconds, so its rate is at most a million a second; with
/// a burst of `UNITS_PER_SECOND` it never denies here either.
const GCRA_UNITS_PER_SECOND: u64 = 1_000_000;
const SECOND_US: u64 = 1_000_000;
/// Distinct keys in the keyed cases.
const KEYS: usize = 10_000;
/// Threads in the contended cases.
const THREADS: u64 = 2;

/// The value of a future that is ready on its first poll; `None` if it is not.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut context) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

fn limiter_with(name: &str, algorithm: Algorithm, per: Option<&str>) -> Limiter {
    // The time-stamp counter, as governor's default clock reads: both sides pay the same for
    // the time.
    let store = MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000_000,
            recover_on_start: false,
        },
        Arc::new(TscClock::new()),
    );
    let config = LimiterConfig {
        wait_max: Duration::from_secs(60),
        permit_secret: PermitSecret::random(),
    };
    let limiter = Limiter::new(Arc::new(store), config);
    let limit = match algorithm {
        Algorithm::Gcra { .. } => GCRA_UNITS_PER_SECOND,
        Algorithm::Sliding | Algorithm::Fixed => UNITS_PER_SECOND,
    };
    let policy =
        Policy::rate(limit, SECOND_US, 0, algorithm, Reserve::default()).expect("valid policy");
    limiter.set_limit(Limit::new(name, policy, per).expect("valid limit"));
    limiter
}

/// How a case asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    /// `try_acquire`, for a refundable permit (the default).
    Refundable,
    /// `try_acquire` with `refundable(false)`.
    Final,
    /// `check`: a decision and no permit, what governor's `check` is.
    Check,
}

/// One decision, which must be a grant. The request says `refundable` as `ask` does.
fn decide(limiter: &Limiter, request: &Request<'_>, ask: Ask) {
    if ask == Ask::Check {
        let verdict = now_or_never(limiter.check(request))
            .expect("the memory store answers at once")
            .expect("a valid request");
        assert!(verdict.is_allowed(), "a limit this large never denies");
        drop(black_box(verdict));
    } else {
        grant(limiter, request);
    }
}

/// One decision, which must be a grant; the permit is dropped at once (free for rate units).
fn grant(limiter: &Limiter, request: &Request<'_>) {
    let outcome = now_or_never(limiter.try_acquire(request))
        .expect("the memory store answers at once")
        .expect("a valid request");
    assert!(
        matches!(outcome, Outcome::Granted(_)),
        "a limit this large never denies"
    );
    drop(black_box(outcome));
}

/// The store's part of one decision alone, without the limiter around it (resolving names,
/// the wait queue, building the permit): the same grant, asked of the store directly.
fn store_grant(limiter: &Limiter, counter: CounterId<'_>, policy: &Policy) {
    let takes = [Take { counter, policy }];
    let decision = now_or_never(limiter.store().acquire(&takes, 1, Priority::Normal))
        .expect("the memory store answers at once")
        .expect("a valid request");
    assert!(decision.is_granted(), "a limit this large never denies");
    drop(black_box(decision));
}

/// The policy of `name` in force on `limiter`, read once, outside the measured loop.
fn policy_of(limiter: &Limiter, name: &str) -> Policy {
    *limiter
        .limits()
        .get(name)
        .expect("a limit in force")
        .policy()
}

fn governor_quota() -> Quota {
    let per_second = NonZeroU32::new(UNITS_PER_SECOND as u32).expect("non-zero");
    Quota::per_second(per_second)
}

fn keys() -> Vec<String> {
    (0..KEYS).map(|index| format!("user-{index:05}")).collect()
}

/// Run `operation(thread, iteration)` `iterations` times split over `THREADS` threads that start
/// together; the wall time from the common start to the last thread's end.
fn split_over_threads(iterations: u64, operation: &(dyn Fn(u64, u64) + Sync)) -> Duration {
    let barrier = Barrier::new(THREADS as usize);
    let per_thread = iterations.div_ceil(THREADS);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for iteration in 0..per_thread {
                        operation(thread, iteration);
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("bench thread"))
            .collect()
    });
    let start = spans.iter().map(|span| span.0).min().expect("threads ran");
    let end = spans.iter().map(|span| span.1).max().expect("threads ran");
    // Odd counts run one extra operation, negligible against the millions per sample.
    end.duration_since(start)
}

/// The tollgate limiters every group measures: both algorithms, each with refundable permits
/// (the default: every grant records a reservation that `commit` may refund) and with
/// `refundable(false)` (nothing recorded, what governor offers: a decision, no refunds).
fn tollgate_cases(name: &str, per: Option<&str>) -> Vec<(String, Limiter, Ask)> {
    let gcra = Algorithm::Gcra {
        burst: UNITS_PER_SECOND,
    };
    let mut cases = Vec::new();
    for (algorithm_name, algorithm) in [("gcra", gcra), ("sliding", Algorithm::Sliding)] {
        for (suffix, ask) in [
            ("_check", Ask::Check),
            ("_final", Ask::Final),
            ("", Ask::Refundable),
        ] {
            let limiter = limiter_with(name, algorithm, per);
            cases.push((format!("tollgate_{algorithm_name}{suffix}"), limiter, ask));
        }
    }
    cases
}

fn keyed_request(key: &str, ask: Ask) -> Request<'_> {
    Request::new("api")
        .key(key)
        .refundable(ask == Ask::Refundable)
}

/// The plain sliding case, whose store the `memory_store_*` rows ask directly.
fn sliding_refundable(cases: &[(String, Limiter, Ask)]) -> &Limiter {
    let case = cases
        .iter()
        .find(|(name, _, ask)| name.starts_with("tollgate_sliding") && *ask == Ask::Refundable);
    &case.expect("a sliding case").1
}

fn one_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("try_acquire/one_key");

    let cases = tollgate_cases("vendor", None);
    let governor: DefaultDirectRateLimiter = RateLimiter::direct(governor_quota());

    for (case, limiter, ask) in &cases {
        let request = Request::new("vendor").refundable(*ask == Ask::Refundable);
        group.bench_function(format!("{case}/1_thread"), |b| {
            b.iter(|| decide(limiter, &request, *ask))
        });
    }
    group.bench_function("memory_store_sliding/1_thread", |b| {
        let sliding = sliding_refundable(&cases);
        let counter = CounterId {
            limit: "vendor",
            key: None,
        };
        let policy = policy_of(sliding, "vendor");
        b.iter(|| store_grant(sliding, counter, &policy))
    });
    group.bench_function("governor_direct/1_thread", |b| {
        b.iter(|| assert!(black_box(governor.check()).is_ok()))
    });
    for (case, limiter, ask) in &cases {
        let request = Request::new("vendor").refundable(*ask == Ask::Refundable);
        group.bench_function(format!("{case}/2_threads"), |b| {
            b.iter_custom(|iterations| {
                split_over_threads(iterations, &|_, _| decide(limiter, &request, *ask))
            })
        });
    }
    group.bench_function("governor_direct/2_threads", |b| {
        b.iter_custom(|iterations| {
            split_over_threads(iterations, &|_, _| {
                assert!(black_box(governor.check()).is_ok())
            })
        })
    });
    group.finish();
}

fn ten_thousand_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("try_acquire/10k_keys");

    let keys = keys();
    let cases = tollgate_cases("api", Some("user"));
    let governor: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(governor_quota());
    // Every key is tracked before measuring, so no case pays for first insertions.
    for key in &keys {
        for (_, limiter, ask) in &cases {
            decide(limiter, &keyed_request(key, *ask), *ask);
        }
        assert!(governor.check_key(key).is_ok());
    }
    // The second thread starts half-way through the keys, so the threads rarely share a key.
    let key_at = |thread: u64, iteration: u64| -> &String {
        let index = (iteration as usize + thread as usize * KEYS / 2) % KEYS;
        &keys[index]
    };

    for (case, limiter, ask) in &cases {
        group.bench_function(format!("{case}/1_thread"), |b| {
            let mut iteration = 0;
            b.iter(|| {
                let key = key_at(0, iteration);
                decide(limiter, &keyed_request(key, *ask), *ask);
                iteration += 1;
            })
        });
    }
    group.bench_function("memory_store_sliding/1_thread", |b| {
        let sliding = sliding_refundable(&cases);
        let policy = policy_of(sliding, "api");
        let mut iteration = 0;
        b.iter(|| {
            let counter = CounterId {
                limit: "api",
                key: Some(key_at(0, iteration)),
            };
            store_grant(sliding, counter, &policy);
            iteration += 1;
        })
    });
    group.bench_function("governor_keyed/1_thread", |b| {
        let mut iteration = 0;
        b.iter(|| {
            assert!(black_box(governor.check_key(key_at(0, iteration))).is_ok());
            iteration += 1;
        })
    });
    for (case, limiter, ask) in &cases {
        group.bench_function(format!("{case}/2_threads"), |b| {
            b.iter_custom(|iterations| {
                split_over_threads(iterations, &|thread, iteration| {
                    decide(
                        limiter,
                        &keyed_request(key_at(thread, iteration), *ask),
                        *ask,
                    )
                })
            })
        });
    }
    group.bench_function("governor_keyed/2_threads", |b| {
        b.iter_custom(|iterations| {
            split_over_threads(iterations, &|thread, iteration| {
                assert!(black_box(governor.check_key(key_at(thread, iteration))).is_ok())
            })
        })
    });
    group.finish();
}

criterion_group!(benches, one_key, ten_thousand_keys);
criterion_main!(benches);
