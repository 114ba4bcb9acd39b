//! `Limiter::check`, the permit-less decision: it must decide exactly as `try_acquire` with
//! `refundable(false)` does, on every path (the one-counter fast path of an in-process store,
//! and the general path for several limits, waits and other stores).

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    Algorithm, Check, DenialReason, Error, Limit, Limiter, LimiterConfig, ManualClock, MemoryStore,
    MemoryStoreConfig, Outcome, PermitSecret, Policy, Priority, Request, Reserve,
};

const SECOND_US: u64 = 1_000_000;

/// A poll of a future that the memory store answers at once.
fn now<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("the memory store answers at once"),
    }
}

fn limiter_on(clock: Arc<ManualClock>, keys_tracked_max: u64) -> Limiter {
    let store = MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max,
            recover_on_start: false,
        },
        clock,
    );
    Limiter::new(
        Arc::new(store),
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
        },
    )
}

fn rate(limit: u64, period_us: u64, algorithm: Algorithm, reserve: Reserve) -> Policy {
    Policy::rate(limit, period_us, 0, algorithm, reserve).expect("valid policy")
}

fn add(limiter: &Limiter, name: &str, policy: Policy, per: Option<&str>) {
    limiter.set_limit(Limit::new(name, policy, per).expect("valid limit"));
}

#[test]
fn check_counts_units_and_says_when_to_come_back() {
    let clock = Arc::new(ManualClock::new(1_000 * SECOND_US));
    let limiter = limiter_on(clock.clone(), 100);
    let policy = rate(2, SECOND_US, Algorithm::Sliding, Reserve::default());
    add(&limiter, "vendor", policy, None);
    let request = Request::new("vendor");

    let Check::Allowed(statuses) = now(limiter.check(&request)).expect("ok") else {
        panic!("room for the first");
    };
    assert_eq!(statuses[0].remaining, 1);
    assert_eq!(statuses[0].reset_after, Duration::from_secs(1));
    clock.advance_us(300_000);
    assert!(now(limiter.check(&request)).expect("ok").is_allowed());
    let Check::Denied(denied) = now(limiter.check(&request)).expect("ok") else {
        panic!("the third is over the limit");
    };
    assert_eq!(denied.reason, DenialReason::Capacity);
    assert_eq!(denied.retry_after, Duration::from_millis(700));
    assert_eq!(denied.limits[0].name, "vendor");
    assert_eq!(denied.limits[0].remaining, 0);
    // A check and an acquire count on the same counter.
    assert!(!now(limiter.try_acquire(&request)).expect("ok").is_granted());
    clock.advance_us(700_000);
    assert!(now(limiter.check(&request)).expect("ok").is_allowed());
}

#[test]
fn check_refuses_what_it_cannot_decide_with_the_field_named() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let limiter = limiter_on(clock, 100);
    let lease = Policy::concurrency(2, 10 * SECOND_US, Reserve::default()).expect("valid");
    add(&limiter, "pool", lease, None);
    let per_user = rate(5, SECOND_US, Algorithm::Fixed, Reserve::default());
    add(&limiter, "api", per_user, Some("user"));

    let field = |result: tollgate::Result<Check>| match result {
        Err(Error::InvalidRequest { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(field(now(limiter.check(&Request::new("pool")))), "limits");
    let both = Request::all(&["api", "pool"]).key("ada");
    assert_eq!(field(now(limiter.check(&both))), "limits");
    assert_eq!(field(now(limiter.check(&Request::new("api")))), "key");
    let long_key = "k".repeat(300);
    let request = Request::new("api").key(&long_key);
    assert_eq!(field(now(limiter.check(&request))), "key");
    let request = Request::new("api").key("ada").cost(0);
    assert_eq!(field(now(limiter.check(&request))), "cost");
    assert!(matches!(
        now(limiter.check(&Request::new("nope"))),
        Err(Error::UnknownLimit { name }) if name == "nope"
    ));
    // A cost above what the limit can ever grant is an error, not a denial to wait out.
    let request = Request::new("api").key("ada").cost(6);
    assert!(matches!(
        now(limiter.check(&request)),
        Err(Error::Cost { limit, .. }) if limit == "api"
    ));
}

#[test]
fn check_of_several_limits_takes_all_or_nothing() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let limiter = limiter_on(clock, 100);
    add(
        &limiter,
        "user",
        rate(5, SECOND_US, Algorithm::Sliding, Reserve::default()),
        Some("user"),
    );
    add(
        &limiter,
        "endpoint",
        rate(1, SECOND_US, Algorithm::Fixed, Reserve::default()),
        None,
    );
    let request = Request::all(&["user", "endpoint"]).key("ada");
    let Check::Allowed(statuses) = now(limiter.check(&request)).expect("ok") else {
        panic!("room on both");
    };
    assert_eq!(
        statuses.iter().map(|s| s.remaining).collect::<Vec<_>>(),
        [4, 0]
    );
    let Check::Denied(denied) = now(limiter.check(&request)).expect("ok") else {
        panic!("the endpoint is spent");
    };
    assert_eq!(
        denied.limits[0].remaining, 4,
        "the user's unit was not taken"
    );
    let Check::Allowed(statuses) =
        now(limiter.check(&Request::new("user").key("ada"))).expect("ok")
    else {
        panic!("room on the user");
    };
    assert_eq!(statuses[0].remaining, 3);
}

#[test]
fn check_stops_at_a_pause() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let limiter = limiter_on(clock.clone(), 100);
    add(
        &limiter,
        "api",
        rate(
            100,
            SECOND_US,
            Algorithm::Gcra { burst: 10 },
            Reserve::default(),
        ),
        Some("user"),
    );
    let request = Request::new("api").key("ada");
    assert!(now(limiter.check(&request)).expect("ok").is_allowed());
    // A pause of the whole limit, then of one key.
    now(limiter.pause("api", None, Duration::from_millis(200))).expect("paused");
    let Check::Denied(denied) = now(limiter.check(&request)).expect("ok") else {
        panic!("paused");
    };
    assert_eq!(denied.reason, DenialReason::Paused);
    assert_eq!(denied.retry_after, Duration::from_millis(200));
    clock.advance_us(200_000);
    assert!(now(limiter.check(&request)).expect("ok").is_allowed());
    now(limiter.pause("api", Some("ada"), Duration::from_millis(50))).expect("paused");
    let Check::Denied(denied) = now(limiter.check(&request)).expect("ok") else {
        panic!("the key is paused");
    };
    assert_eq!(denied.reason, DenialReason::Paused);
    assert_eq!(denied.retry_after, Duration::from_millis(50));
    assert!(
        now(limiter.check(&Request::new("api").key("bob")))
            .expect("ok")
            .is_allowed()
    );
}

#[tokio::test(start_paused = true)]
async fn check_queues_behind_waiters_and_can_wait_itself() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(1, SECOND_US, Algorithm::Sliding, Reserve::default()),
        None,
    );
    assert!(
        limiter
            .check(&Request::new("vendor"))
            .await
            .expect("ok")
            .is_allowed()
    );
    let waiting = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new("vendor").wait(Duration::from_secs(5));
            limiter.acquire(&request).await.expect("ok").is_granted()
        })
    };
    tokio::task::yield_now().await;
    // A waiter of the same priority is ahead: the check does not jump the queue.
    let Check::Denied(denied) = limiter.check(&Request::new("vendor")).await.expect("ok") else {
        panic!("someone waits ahead");
    };
    assert_eq!(denied.reason, DenialReason::Queued);
    assert!(
        waiting.await.expect("joined"),
        "the waiter got the next unit"
    );
    // A check that may wait is served when the unit comes back.
    let request = Request::new("vendor").wait(Duration::from_secs(5));
    let started = tokio::time::Instant::now();
    assert!(limiter.check(&request).await.expect("ok").is_allowed());
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[test]
fn check_answers_too_many_keys_at_the_cap() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let limiter = limiter_on(clock.clone(), 2);
    add(
        &limiter,
        "api",
        rate(
            5,
            SECOND_US,
            Algorithm::Gcra { burst: 5 },
            Reserve::default(),
        ),
        Some("user"),
    );
    for user in ["a", "b"] {
        assert!(
            now(limiter.check(&Request::new("api").key(user)))
                .expect("ok")
                .is_allowed()
        );
    }
    assert!(matches!(
        now(limiter.check(&Request::new("api").key("c"))),
        Err(Error::TooManyKeys {
            keys_tracked_max: 2
        })
    ));
    // Once the first keys can no longer affect a decision, their places are free again.
    clock.advance_us(SECOND_US);
    assert!(
        now(limiter.check(&Request::new("api").key("c")))
            .expect("ok")
            .is_allowed()
    );
}

#[test]
fn a_handle_decides_as_check_and_follows_changed_limits() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let limiter = limiter_on(clock, 100);
    let one = rate(1, SECOND_US, Algorithm::Fixed, Reserve::default());
    add(&limiter, "api", one, Some("user"));
    let handle = limiter.handle("api").expect("a limit in force");
    assert_eq!(handle.name(), "api");
    assert!(now(handle.check(Some("ada"))).expect("ok").is_allowed());
    assert!(!now(handle.check(Some("ada"))).expect("ok").is_allowed());
    assert!(
        !now(limiter.check(&Request::new("api").key("ada")))
            .expect("ok")
            .is_allowed()
    );
    assert!(matches!(
        now(handle.check(None)),
        Err(Error::InvalidRequest { field: "key", .. })
    ));
    assert!(matches!(
        now(handle.check_with(Some("ada"), 0, Priority::Normal)),
        Err(Error::InvalidRequest { field: "cost", .. })
    ));
    // Another limit changing leaves this one as it was, and the handle as it was.
    add(&limiter, "other", one, None);
    assert!(!now(handle.check(Some("ada"))).expect("ok").is_allowed());
    assert!(now(handle.check(Some("bob"))).expect("ok").is_allowed());
    // A new policy applies to the handle made before it; what was granted stays counted.
    let three = rate(3, SECOND_US, Algorithm::Fixed, Reserve::default());
    add(&limiter, "api", three, Some("user"));
    let Check::Allowed(statuses) = now(handle.check(Some("ada"))).expect("ok") else {
        panic!("room under the new policy");
    };
    assert_eq!(statuses[0].remaining, 1);
    assert!(limiter.remove_limit("api"));
    assert!(matches!(
        now(handle.check(Some("ada"))),
        Err(Error::UnknownLimit { name }) if name == "api"
    ));
    assert!(matches!(
        limiter.handle("api"),
        Err(Error::UnknownLimit { .. })
    ));
}

#[derive(Clone, Debug)]
enum Step {
    Ask { user: u8, cost: u64, high: bool },
    Advance(u64),
    Pause { user: Option<u8>, ms: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..3u8, 1..4u64, any::<bool>()).prop_map(|(user, cost, high)| Step::Ask {
            user,
            cost,
            high
        }),
        2 => (0..400_000u64).prop_map(Step::Advance),
        1 => (proptest::option::of(0..3u8), 1..300u64).prop_map(|(user, ms)| Step::Pause { user, ms }),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::Sliding),
        Just(Algorithm::Fixed),
        (3..8u64).prop_map(|burst| Algorithm::Gcra { burst }),
    ]
}

proptest! {
    /// The same steps on three limiters with clocks in step: one asks by `check`, one by a
    /// `LimitHandle`, the last by `try_acquire(refundable(false))`. Every answer must match,
    /// field by field.
    #[test]
    fn check_decides_as_a_final_acquire(
        algorithm in algorithm(),
        limit in 3..8u64,
        kept_for_high in 0..2u64,
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let clocks: Vec<Arc<ManualClock>> =
            (0..3).map(|_| Arc::new(ManualClock::new(SECOND_US))).collect();
        let limiters: Vec<Limiter> =
            clocks.iter().map(|clock| limiter_on(clock.clone(), 100)).collect();
        let reserve = Reserve { high: kept_for_high, ..Reserve::default() };
        let limit = match algorithm { Algorithm::Gcra { burst } => burst.max(limit), _ => limit };
        let policy = Policy::rate(limit, SECOND_US, 0, algorithm, reserve).expect("valid");
        for limiter in &limiters {
            add(limiter, "api", policy, Some("user"));
        }
        let handle = limiters[2].handle("api").expect("a limit in force");
        let users = ["ada", "bob", "cy"];
        for step in steps {
            match step {
                Step::Ask { user, cost, high } => {
                    let priority = if high { Priority::High } else { Priority::Normal };
                    let request = Request::new("api")
                        .key(users[usize::from(user)])
                        .cost(cost)
                        .priority(priority)
                        .refundable(false);
                    let checked = now(limiters[0].check(&request));
                    let acquired = now(limiters[1].try_acquire(&request));
                    let key = Some(users[usize::from(user)]);
                    let handled = now(handle.check_with(key, cost, priority));
                    prop_assert_eq!(
                        format!("{handled:?}"),
                        format!("{checked:?}"),
                        "a handle decides as check does"
                    );
                    match (checked, acquired) {
                        (Ok(Check::Allowed(statuses)), Ok(Outcome::Granted(permit))) => {
                            let limits = permit.limits();
                            prop_assert_eq!(statuses[0].remaining, limits[0].remaining);
                            prop_assert_eq!(statuses[0].reset_after, limits[0].reset_after);
                        }
                        (Ok(Check::Denied(checked)), Ok(Outcome::Denied(acquired))) => {
                            prop_assert_eq!(checked, acquired);
                        }
                        (Err(checked), Err(acquired)) => {
                            prop_assert_eq!(checked.to_string(), acquired.to_string());
                        }
                        (checked, acquired) => {
                            prop_assert!(false, "check {checked:?} but acquire {acquired:?}");
                        }
                    }
                }
                Step::Advance(us) => {
                    for clock in &clocks {
                        clock.advance_us(us);
                    }
                }
                Step::Pause { user, ms } => {
                    let key = user.map(|user| users[usize::from(user)]);
                    for limiter in &limiters {
                        now(limiter.pause("api", key, Duration::from_millis(ms))).expect("paused");
                    }
                }
            }
        }
    }
}
