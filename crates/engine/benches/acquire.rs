//! Latency of one decision (`LimitHandle::check_now`, `check`, `try_acquire`) on the in-memory
//! store, next to governor's limiters
//! measured the same way: one unkeyed limit (against `RateLimiter::direct`) and 10,000 keys of
//! a per-key limit (against `RateLimiter::keyed`), each from one thread and from two.
//!
//! Every limit here is too large ever to deny (a billion units a second, or a burst of a
//! billion), so the figures are the cost of a grant, not of a denial. The memory store answers
//! at once, so the async calls are driven by polling them once with a no-op waker: no runtime,
//! no scheduling. Every tollgate limiter reads `TscClock`, as governor's default clock does.
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
use tollgate::store::{CounterId, Take};
use tollgate::{
    Algorithm, Check, Limit, LimitHandle, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig,
    Outcome, PermitSecret, Policy, Priority, Request, Reserve, TscClock,
};

/// Units per period of every sliding limit here: the largest the core accepts, never reached.
const UNITS_PER_SECOND: u64 = 1_000_000_000;
/// A GCRA limit of 100 a second with a burst of `UNITS_PER_SECOND`: it never denies here either,
/// and every grant puts 10 ms on the key's backlog, so a key visited every few milliseconds
/// stays tracked, as governor's keys do. (At a million a second a key would be idle a
/// microsecond after its grant, and the memory store would forget it and make it again on the
/// next visit: the cost of a new key, not of a decision on a tracked one.)
const GCRA_UNITS_PER_SECOND: u64 = 100;
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
            keys_per_limit_max: 1_000_000,
        },
        Arc::new(TscClock::new()),
    );
    let config = LimiterConfig {
        wait_max: Duration::from_secs(60),
        permit_secret: PermitSecret::random(),
        pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
        ..LimiterConfig::default()
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
    /// `LimitHandle::check`: `check` with the limit looked up once, as governor's limiter is
    /// one object per quota.
    Handle,
}

/// One measured configuration: a limiter on a limit `name`, and how it is asked.
struct Case {
    label: String,
    name: &'static str,
    limiter: Limiter,
    ask: Ask,
    handle: LimitHandle,
}

impl Case {
    /// One decision on `key` (for a per-key limit), which must be a grant.
    fn decide(&self, key: Option<&str>) {
        if self.ask == Ask::Handle {
            // As governor's rows do: the answer through `black_box`, then asserted allowed.
            let answer = black_box(self.handle.check_now(key, 1, Priority::Normal));
            assert!(
                matches!(answer, Some(Ok(Check::Allowed(_)))),
                "a limit this large never denies"
            );
            return;
        }
        let request = || {
            let request = Request::new(self.name).refundable(self.ask == Ask::Refundable);
            match key {
                Some(key) => request.key(key),
                None => request,
            }
        };
        let verdict = match self.ask {
            Ask::Check => now_or_never(self.limiter.check(&request())),
            Ask::Handle | Ask::Refundable | Ask::Final => return grant(&self.limiter, &request()),
        };
        let verdict = verdict
            .expect("the memory store answers at once")
            .expect("a valid request");
        assert!(verdict.is_allowed(), "a limit this large never denies");
        drop(black_box(verdict));
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
    let decision = now_or_never(
        limiter
            .store()
            .acquire(tollgate::store::Ask::new(&takes, 1, Priority::Normal).refundable(true)),
    )
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

/// The tollgate limiters every group measures: both algorithms, each asked by a handle, by
/// `check`, by `try_acquire` with `refundable(false)` (nothing recorded: a decision and no
/// refunds, what governor offers), and by `try_acquire` for a refundable permit (the default:
/// every grant records a reservation that `commit` may refund).
fn tollgate_cases(name: &'static str, per: Option<&str>) -> Vec<Case> {
    let gcra = Algorithm::Gcra {
        burst: UNITS_PER_SECOND,
    };
    let mut cases = Vec::new();
    for (algorithm_name, algorithm) in [("gcra", gcra), ("sliding", Algorithm::Sliding)] {
        for (suffix, ask) in [
            ("_handle", Ask::Handle),
            ("_check", Ask::Check),
            ("_final", Ask::Final),
            ("", Ask::Refundable),
        ] {
            let limiter = limiter_with(name, algorithm, per);
            let handle = limiter.handle(name).expect("a limit in force");
            cases.push(Case {
                label: format!("tollgate_{algorithm_name}{suffix}"),
                name,
                limiter,
                ask,
                handle,
            });
        }
    }
    cases
}

/// The plain sliding case, whose store the `memory_store_*` rows ask directly.
fn sliding_refundable(cases: &[Case]) -> &Limiter {
    let case = cases
        .iter()
        .find(|case| case.label.starts_with("tollgate_sliding") && case.ask == Ask::Refundable);
    &case.expect("a sliding case").limiter
}

fn one_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("try_acquire/one_key");

    let cases = tollgate_cases("vendor", None);
    let governor: DefaultDirectRateLimiter = RateLimiter::direct(governor_quota());

    for case in &cases {
        group.bench_function(format!("{}/1_thread", case.label), |b| {
            b.iter(|| case.decide(None))
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
    for case in &cases {
        group.bench_function(format!("{}/2_threads", case.label), |b| {
            b.iter_custom(|iterations| split_over_threads(iterations, &|_, _| case.decide(None)))
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
        for case in &cases {
            case.decide(Some(key));
        }
        assert!(governor.check_key(key).is_ok());
    }
    // The second thread starts half-way through the keys, so the threads rarely share a key.
    let key_at = |thread: u64, iteration: u64| -> &String {
        let index = (iteration as usize + thread as usize * KEYS / 2) % KEYS;
        &keys[index]
    };

    for case in &cases {
        group.bench_function(format!("{}/1_thread", case.label), |b| {
            let mut iteration = 0;
            b.iter(|| {
                case.decide(Some(key_at(0, iteration)));
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
    for case in &cases {
        group.bench_function(format!("{}/2_threads", case.label), |b| {
            b.iter_custom(|iterations| {
                split_over_threads(iterations, &|thread, iteration| {
                    case.decide(Some(key_at(thread, iteration)))
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
