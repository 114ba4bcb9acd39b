//! Instructions per `try_acquire` decision, for `valgrind --tool=callgrind`: a count that does
//! not move with the machine's load, unlike the criterion figures of `benches/acquire.rs`.
//!
//! `decision_cost CASE N` sets up CASE, then makes N decisions; run it with N and with 0 under
//! callgrind, and the difference of the two totals divided by N is the cost of one decision.
//! `scripts/decision-cost` does exactly that for every case.
//!
//! Cases: `gcra_final`, `gcra`, `sliding_final`, `sliding` (one unkeyed limit, `_final` meaning
//! `refundable(false)`), `gcra_check` and `sliding_check` (`Limiter::check`, no permit),
//! `gcra_handle` and `sliding_handle` (`LimitHandle::check_now`), the same with a `keyed_`
//! prefix (10,000 keys of a per-key limit), and `governor_direct` and
//! `governor_keyed` (governor's limiters, the same quota and keys). The tollgate limiters read
//! `MonotonicClock`, whose cost in instructions is the same in every run.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    Algorithm, Limit, LimitHandle, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig,
    MonotonicClock, PermitSecret, Policy, Priority, Request, Reserve,
};

const UNITS_PER_SECOND: u64 = 1_000_000_000;
const KEYS: usize = 10_000;

fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// How a case asks.
enum Ask {
    Handle(LimitHandle),
    Check,
    /// `try_acquire`, refundable or not.
    Acquire {
        refundable: bool,
    },
}

/// One decision on `key`, which must be a grant.
fn decide(limiter: &Limiter, ask: &Ask, key: Option<&str>) {
    let request = || match key {
        Some(key) => Request::new("api").key(key),
        None => Request::new("api"),
    };
    let verdict = match ask {
        Ask::Handle(handle) => Some(
            handle
                .check_now(key, 1, Priority::Normal)
                .expect("decided on the spot"),
        ),
        Ask::Check => now_or_never(limiter.check(&request())),
        Ask::Acquire { refundable } => {
            let request = request().refundable(*refundable);
            let outcome = now_or_never(limiter.try_acquire(&request))
                .expect("the memory store answers at once")
                .expect("a valid request");
            assert!(outcome.is_granted(), "a limit this large never denies");
            drop(black_box(outcome));
            return;
        }
    };
    let verdict = verdict
        .expect("the memory store answers at once")
        .expect("a valid request");
    assert!(verdict.is_allowed(), "a limit this large never denies");
    drop(black_box(verdict));
}

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_else(|| "gcra_final".to_owned());
    let decisions: usize = args
        .next()
        .map(|n| n.parse().expect("N: a number of decisions"))
        .unwrap_or(100_000);
    let keys: Vec<String> = (0..KEYS).map(|index| format!("user-{index:05}")).collect();
    let quota = Quota::per_second(NonZeroU32::new(UNITS_PER_SECOND as u32).expect("non-zero"));

    if case == "governor_direct" {
        let governor: DefaultDirectRateLimiter = RateLimiter::direct(quota);
        for _ in 0..decisions {
            assert!(black_box(governor.check()).is_ok());
        }
        return;
    }
    if case == "governor_keyed" {
        let governor: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(quota);
        for key in &keys {
            assert!(governor.check_key(key).is_ok());
        }
        for index in 0..decisions {
            assert!(black_box(governor.check_key(&keys[index % KEYS])).is_ok());
        }
        return;
    }

    let keyed = case.starts_with("keyed_");
    let shape = case.trim_start_matches("keyed_");
    let (algorithm_name, ask_name) = shape.split_once('_').unwrap_or((shape, ""));
    let algorithm = match algorithm_name {
        "gcra" => Algorithm::Gcra {
            burst: UNITS_PER_SECOND,
        },
        "sliding" => Algorithm::Sliding,
        other => panic!("unknown case {other:?}"),
    };
    let store = MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000_000,
            keys_per_limit_max: 1_000_000,
        },
        // Not `TscClock`: it calibrates at start for as long as the wall clock says, a number
        // of instructions that changes from run to run and would not cancel out.
        Arc::new(MonotonicClock::new()),
    );
    let config = LimiterConfig {
        wait_max: Duration::from_secs(60),
        permit_secret: PermitSecret::random(),
        pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
        ..LimiterConfig::default()
    };
    let limiter = Limiter::new(Arc::new(store), config);
    // GCRA at one a second with a burst of a million: never denying in a run, and every grant
    // puts a second on the key's backlog, so a key stays tracked between visits even at
    // callgrind's pace, as governor's keys do (see the bench).
    let (algorithm, limit) = match algorithm {
        Algorithm::Gcra { .. } => (Algorithm::Gcra { burst: 1_000_000 }, 1),
        Algorithm::Sliding | Algorithm::Fixed => (algorithm, UNITS_PER_SECOND),
    };
    let policy =
        Policy::rate(limit, 1_000_000, 0, algorithm, Reserve::default()).expect("valid policy");
    let per = keyed.then_some("user");
    limiter.set_limit(Limit::new("api", policy, per).expect("valid limit"));
    let ask = match ask_name {
        "handle" => Ask::Handle(limiter.handle("api").expect("a limit in force")),
        "check" => Ask::Check,
        "final" => Ask::Acquire { refundable: false },
        "" => Ask::Acquire { refundable: true },
        other => panic!("unknown case {other:?}"),
    };
    if keyed {
        for key in &keys {
            decide(&limiter, &ask, Some(key));
        }
        for index in 0..decisions {
            decide(&limiter, &ask, Some(&keys[index % KEYS]));
        }
    } else {
        for _ in 0..decisions {
            decide(&limiter, &ask, None);
        }
    }
}
