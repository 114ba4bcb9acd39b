//! `Limiter::check`, the permit-less decision: it must decide exactly as `try_acquire` with
//! `refundable(false)` does, on every path (the one-counter fast path of an in-process store,
//! and the general path for several limits, waits and other stores).

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::store::{CounterId, Store, Take};
use tollgate::{
    Algorithm, Check, DenyReason, Error, Limit, LimitHandle, Limiter, LimiterConfig, ManualClock,
    MemoryStore, MemoryStoreConfig, Outcome, PermitSecret, Policy, Priority, Request, Reserve,
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

fn memory_store(clock: Arc<ManualClock>, keys_tracked_max: u64) -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max,
            // The store-wide cap alone: these cases are about it.
            keys_per_limit_max: u64::MAX,
        },
        clock,
    ))
}

fn limiter_over(store: Arc<MemoryStore>) -> Limiter {
    Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    )
}

fn limiter_on(clock: Arc<ManualClock>, keys_tracked_max: u64) -> Limiter {
    limiter_over(memory_store(clock, keys_tracked_max))
}

fn rate(limit: u64, period_us: u64, algorithm: Algorithm, reserve: Reserve) -> Policy {
    Policy::rate(limit, period_us, 0, algorithm, reserve).expect("valid policy")
}

/// A GCRA limit of `limit` a second, `burst` at once.
fn gcra_per_second(limit: u64, burst: u64) -> Policy {
    rate(
        limit,
        SECOND_US,
        Algorithm::Gcra { burst },
        Reserve::default(),
    )
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
    assert_eq!(denied.reason, DenyReason::Capacity);
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
    add(&limiter, "api", gcra_per_second(100, 10), Some("user"));
    let request = Request::new("api").key("ada");
    assert!(now(limiter.check(&request)).expect("ok").is_allowed());
    // A pause of the whole limit, then of one key.
    now(limiter.pause("api", None, Duration::from_millis(200))).expect("paused");
    let Check::Denied(denied) = now(limiter.check(&request)).expect("ok") else {
        panic!("paused");
    };
    assert_eq!(denied.reason, DenyReason::Paused);
    assert_eq!(denied.retry_after, Duration::from_millis(200));
    clock.advance_us(200_000);
    assert!(now(limiter.check(&request)).expect("ok").is_allowed());
    now(limiter.pause("api", Some("ada"), Duration::from_millis(50))).expect("paused");
    let Check::Denied(denied) = now(limiter.check(&request)).expect("ok") else {
        panic!("the key is paused");
    };
    assert_eq!(denied.reason, DenyReason::Paused);
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
    assert_eq!(denied.reason, DenyReason::Queued);
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
    add(&limiter, "api", gcra_per_second(5, 5), Some("user"));
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
    assert!(
        now(handle.check(Some("ada"), 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    assert!(
        !now(handle.check(Some("ada"), 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    assert!(
        !now(limiter.check(&Request::new("api").key("ada")))
            .expect("ok")
            .is_allowed()
    );
    assert!(matches!(
        now(handle.check(None, 1, Priority::Normal)),
        Err(Error::InvalidRequest { field: "key", .. })
    ));
    assert!(matches!(
        now(handle.check(Some("ada"), 0, Priority::Normal)),
        Err(Error::InvalidRequest { field: "cost", .. })
    ));
    // Another limit changing leaves this one as it was, and the handle as it was.
    add(&limiter, "other", one, None);
    assert!(
        !now(handle.check(Some("ada"), 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    assert!(
        now(handle.check(Some("bob"), 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    // The same, decided on the spot: the memory store needs no waiting.
    assert!(matches!(
        handle.check_now(Some("cy"), 1, Priority::Normal),
        Some(Ok(Check::Allowed(_)))
    ));
    // A new policy applies to the handle made before it; what was granted stays counted.
    let three = rate(3, SECOND_US, Algorithm::Fixed, Reserve::default());
    add(&limiter, "api", three, Some("user"));
    // The limit changed under the handle: decided by the limit in force, found by name.
    let Some(Ok(Check::Allowed(statuses))) = handle.check_now(Some("ada"), 1, Priority::Normal)
    else {
        panic!("room under the new policy");
    };
    assert_eq!(statuses[0].remaining, 1);
    assert!(limiter.remove_limit("api"));
    assert!(matches!(
        now(handle.check(Some("ada"), 1, Priority::Normal)),
        Err(Error::UnknownLimit { name }) if name == "api"
    ));
    assert!(matches!(
        limiter.handle("api"),
        Err(Error::UnknownLimit { .. })
    ));
}

/// A handle on an unkeyed GCRA limit grants on the counter's hot word, without the store's
/// lock; the store must count those grants all the same. A sweep keeps the counter while a
/// handle holds it (else the handle would lose its hot word), and once none does, judges it
/// idle by the handle's last grant, not by the store's own last decision.
#[test]
fn a_handle_s_lock_free_grants_survive_the_store_s_sweeps() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let store = memory_store(clock.clone(), 100);
    let limiter = limiter_over(store.clone());
    // One unit every 100 ms, five at once.
    let policy = gcra_per_second(10, 5);
    add(&limiter, "vendor", policy, None);
    let request = Request::new("vendor");
    let remaining = |check: Check| match check {
        Check::Allowed(statuses) => Some(statuses[0].remaining),
        Check::Denied(_) => None,
    };

    let handle = limiter.handle("vendor").expect("a limit in force");
    for _ in 0..5 {
        assert!(
            now(handle.check(None, 1, Priority::Normal))
                .expect("ok")
                .is_allowed()
        );
    }
    assert!(
        !now(handle.check(None, 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    clock.advance_us(150_000);
    // The store's own way sees the handle's grants: room for one.
    assert!(now(limiter.check(&request)).expect("ok").is_allowed());
    assert!(!now(limiter.check(&request)).expect("ok").is_allowed());
    // Two more by the handle alone, then it goes; the store last decided 300 ms before.
    clock.advance_us(300_000);
    assert!(
        now(handle.check(None, 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    assert!(
        now(handle.check(None, 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    drop(handle);
    clock.advance_us(250_000);
    store.sweep(1_000);
    assert_eq!(store.len(), 1, "the handle's backlog still counts");
    let after = now(limiter.check(&request)).expect("ok");
    assert_eq!(
        remaining(after),
        Some(3),
        "one unit of backlog left, one granted now"
    );

    // Idle, but held by a handle: kept, so the handle keeps deciding by itself.
    let handle = limiter.handle("vendor").expect("a limit in force");
    clock.advance_us(10 * SECOND_US);
    store.sweep(1_000);
    assert_eq!(store.len(), 1, "kept while a handle holds it");
    assert_eq!(
        remaining(now(handle.check(None, 1, Priority::Normal)).expect("ok")),
        Some(4)
    );
    drop(handle);
    clock.advance_us(10 * SECOND_US);
    store.sweep(1_000);
    assert_eq!(store.len(), 0, "dropped once idle and held by none");
}

/// A keyed handle's grants on a counter the store has (taken without the general way's
/// checks) keep the counter as long as they count: a sweep after a grant in a new window or
/// on a longer backlog must not forget it, or the next request would find a fresh counter and
/// go over the limit.
#[test]
fn a_keyed_handle_s_grants_keep_their_counter_through_sweeps() {
    for algorithm in [
        Algorithm::Fixed,
        Algorithm::Sliding,
        Algorithm::Gcra { burst: 1 },
    ] {
        let clock = Arc::new(ManualClock::new(SECOND_US));
        let store = memory_store(clock.clone(), 100);
        let limiter = limiter_over(store.clone());
        // One a second.
        let policy = rate(1, SECOND_US, algorithm, Reserve::default());
        add(&limiter, "user-freq", policy, Some("user"));
        let handle = limiter.handle("user-freq").expect("a limit in force");
        let allowed = |handle: &LimitHandle| {
            now(handle.check(Some("ada"), 1, Priority::Normal))
                .expect("a valid check")
                .is_allowed()
        };

        assert!(
            allowed(&handle),
            "{algorithm:?}: the first, which makes the counter"
        );
        assert!(!allowed(&handle), "{algorithm:?}: one a second");
        clock.advance_us(1_500_000);
        assert!(allowed(&handle), "{algorithm:?}: the next second's one");
        clock.advance_us(100_000);
        store.sweep(1_000);
        assert_eq!(store.len(), 1, "{algorithm:?}: the last grant still counts");
        assert!(
            !allowed(&handle),
            "{algorithm:?}: still one a second after the sweep"
        );
        clock.advance_us(10 * SECOND_US);
        store.sweep(1_000);
        assert_eq!(store.len(), 0, "{algorithm:?}: dropped once idle");
    }
}

/// A key handle decides on its key's word while the counter allows it: the store keeps the
/// counter through sweeps for as long as the handle holds the word, even idle (the handle would
/// go on deciding on a counter the store had forgotten, and a fresh one would open the limit
/// again), and gives it back once the handle is dropped. A limit-wide pause stops it at once,
/// though nothing seizes its word; a pause of its own key too.
/// New keys pay for sweeping out old ones: a stream of users, each seen once, keeps the store
/// near the users seen within one period, with no `sweep` from outside. (A store that only
/// swept on a timer, or examined fewer counters than it took in, would grow with the stream.)
#[test]
fn a_stream_of_new_keys_keeps_the_store_near_its_live_keys() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let store = memory_store(clock.clone(), 1_000_000);
    let limiter = limiter_over(store.clone());
    let policy = rate(5, SECOND_US, Algorithm::Fixed, Reserve::default());
    add(&limiter, "api", policy, Some("user"));
    let handle = limiter.handle("api").expect("a limit in force");
    // One new user a millisecond: a thousand live at any time, a window being one second.
    let mut largest = 0;
    for user in 0..30_000u32 {
        clock.advance_us(1_000);
        let key = format!("user-{user}");
        assert!(
            now(handle.check(Some(&key), 1, Priority::Normal))
                .expect("ok")
                .is_allowed()
        );
        // A repeat visit finds its counter and examines nothing; it must not break the bound.
        assert!(
            now(handle.check(Some(&key), 1, Priority::Normal))
                .expect("ok")
                .is_allowed()
        );
        largest = largest.max(store.len());
    }
    // Live: the thousand users of the current window (a counter lives to its window's end).
    // The bound is k/(k-1) times that for k = 4 examined per new counter; with one examined
    // per new counter the cursor never catches up with the stream, and all 30,000 stay.
    assert!(largest <= 1_400, "the store grew to {largest} counters");
    assert!(largest >= 1_000, "{largest}: the live keys must be counted");
}

/// A decision that resolved a limit before its policy changed may reach the store after a
/// handle under the new policy exists. It must not hand that handle a backlog counted under
/// the old interval: ten units granted at one a millisecond still count as ten at one every
/// 100 ms, so the new handle is denied, as the store's own way denies.
#[test]
fn a_decision_under_a_policy_just_replaced_cannot_open_the_new_one_s_hot_word() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let store = memory_store(clock, 100);
    let limiter = limiter_over(store.clone());
    let fast = gcra_per_second(1_000, 10);
    let slow = gcra_per_second(10, 5);
    add(&limiter, "vendor", fast, None);
    let before = limiter.handle("vendor").expect("a limit in force");
    for _ in 0..10 {
        assert!(
            now(before.check(None, 1, Priority::Normal))
                .expect("ok")
                .is_allowed()
        );
    }
    add(&limiter, "vendor", slow, None);
    let after = limiter.handle("vendor").expect("a limit in force");
    // The straggler, decided under the old policy (denied: its burst is spent).
    let takes = [Take {
        counter: CounterId {
            limit: "vendor",
            key: None,
        },
        policy: &fast,
    }];
    let straggler = now(store.acquire(tollgate::store::Ask::new(&takes, 1, Priority::Normal)))
        .expect("answers");
    assert!(!straggler.is_granted());
    assert!(
        !now(after.check(None, 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    assert!(
        !now(limiter.check(&Request::new("vendor")))
            .expect("ok")
            .is_allowed()
    );
}

/// Bad input on a handle's lock-free path gets the same clear errors as every other path.
#[test]
fn a_hot_handle_refuses_bad_input_with_the_field_named() {
    let limiter = limiter_on(Arc::new(ManualClock::new(SECOND_US)), 100);
    add(&limiter, "vendor", gcra_per_second(10, 5), None);
    let handle = limiter.handle("vendor").expect("a limit in force");
    assert!(
        now(handle.check(None, 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    for cost in [0, 6, u64::MAX] {
        assert!(matches!(
            now(handle.check(None, cost, Priority::Normal)),
            Err(Error::InvalidRequest { field: "cost", .. } | Error::Cost { .. })
        ));
    }
    // A key means nothing to an unkeyed limit, as on every path, but a malformed one is refused.
    assert!(
        now(handle.check(Some("ada"), 1, Priority::Normal))
            .expect("ok")
            .is_allowed()
    );
    let oversized = "k".repeat(tollgate::KEY_BYTES_MAX + 1);
    for key in ["bad\nkey", oversized.as_str()] {
        assert!(matches!(
            now(handle.check(Some(key), 1, Priority::Normal)),
            Err(Error::InvalidRequest { field: "key", .. })
        ));
    }
}

/// On a per-key limit the memory store checks a key only before it makes the key's counter
/// (a tracked counter's key was checked then). Every malformed key is still refused, with the
/// field named and the same words as the general way, and leaves no counter behind; a valid
/// key near the bounds is served.
#[test]
fn a_per_key_check_refuses_every_malformed_key_and_tracks_none_of_them() {
    let clock = Arc::new(ManualClock::new(SECOND_US));
    let store = memory_store(clock, 100);
    let limiter = limiter_over(store.clone());
    add(&limiter, "api", gcra_per_second(10, 5), Some("user"));
    add(&limiter, "plain", gcra_per_second(10, 5), None);
    let handle = limiter.handle("api").expect("a limit in force");
    let oversized = "k".repeat(tollgate::KEY_BYTES_MAX + 1);
    let bad = [
        "",
        "bad\nkey",
        "tab\tbetween-16",
        "\u{7f}delete",
        "\u{85}next-line",
        oversized.as_str(),
    ];
    for key in bad {
        let by_handle = now(handle.check(Some(key), 1, Priority::Normal));
        let Err(Error::InvalidRequest {
            field: "key",
            reason,
        }) = by_handle
        else {
            panic!("{key:?}: {by_handle:?}");
        };
        // The general way (two limits, so not the one-counter path) says the same.
        let general = now(limiter.check(&Request::all(&["api", "plain"]).key(key)));
        assert!(
            matches!(&general, Err(Error::InvalidRequest { field: "key", reason: r }) if *r == reason),
            "{key:?}: {general:?} against {reason:?}"
        );
    }
    assert_eq!(store.len(), 0, "no counter for a malformed key");
    let longest = "k".repeat(tollgate::KEY_BYTES_MAX);
    for key in [
        "a",
        "sixteen-bytes-ok",
        "seventeen-bytes-k",
        "naïve",
        longest.as_str(),
    ] {
        assert!(
            now(handle.check(Some(key), 1, Priority::Normal))
                .expect("ok")
                .is_allowed(),
            "{key:?}"
        );
        // Found now: decided without a check, and as allowed.
        assert!(
            now(handle.check(Some(key), 1, Priority::Normal))
                .expect("ok")
                .is_allowed(),
            "{key:?}"
        );
    }
    assert_eq!(store.len(), 5);
}

#[derive(Clone, Debug)]
enum Step {
    Ask {
        user: u8,
        cost: u64,
        high: bool,
    },
    Advance(u64),
    Pause {
        user: Option<u8>,
        ms: u64,
    },
    /// A refundable `try_acquire`, whose permit a later `Commit` settles.
    Reserve {
        user: u8,
        cost: u64,
    },
    Commit {
        permit: usize,
        used: u64,
    },
    /// A final `try_acquire` of this limit and another at once.
    Both {
        user: u8,
    },
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
        1 => (0..3u8, 1..3u64).prop_map(|(user, cost)| Step::Reserve { user, cost }),
        1 => (any::<usize>(), 0..3u64).prop_map(|(permit, used)| Step::Commit { permit, used }),
        1 => (0..3u8).prop_map(|user| Step::Both { user }),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::Sliding),
        Just(Algorithm::Fixed),
        (3..8u64).prop_map(|burst| Algorithm::Gcra { burst }),
    ]
}

/// Whether a grant or a denial, and the answer's hints, as text to compare across limiters.
fn outcome_text(outcome: &tollgate::Result<Outcome>) -> String {
    match outcome {
        Ok(Outcome::Granted(permit)) => format!("granted {:?}", permit.limits()),
        Ok(Outcome::Denied(denied)) => format!("denied {denied:?}"),
        Err(error) => format!("error {error}"),
    }
}

proptest! {
    /// The same steps on four limiters with clocks in step: one asks by `check`, one by
    /// `try_acquire(refundable(false))`, one by a `LimitHandle`'s `check`, the last by another
    /// handle's `check_now`. Every answer must match, field by field. The limit is counted per
    /// key or not: an unkeyed GCRA handle decides on the counter's hot word, so refundable
    /// grants, commits, pauses (of a key or of the whole limit) and requests over two limits
    /// between its decisions take the counter back and forth between it and the store.
    #[test]
    fn check_decides_as_a_final_acquire(
        algorithm in algorithm(),
        limit in 3..8u64,
        kept_for_high in 0..2u64,
        keyed in any::<bool>(),
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let clocks: Vec<Arc<ManualClock>> =
            (0..4).map(|_| Arc::new(ManualClock::new(SECOND_US))).collect();
        let limiters: Vec<Limiter> =
            clocks.iter().map(|clock| limiter_on(clock.clone(), 100)).collect();
        let reserve = Reserve { high: kept_for_high, ..Reserve::default() };
        let limit = match algorithm { Algorithm::Gcra { burst } => burst.max(limit), _ => limit };
        let policy = Policy::rate(limit, SECOND_US, 0, algorithm, reserve).expect("valid");
        let other = Policy::rate(2, SECOND_US, 0, Algorithm::Sliding, Reserve::default())
            .expect("valid");
        for limiter in &limiters {
            add(limiter, "api", policy, keyed.then_some("user"));
            add(limiter, "other", other, None);
        }
        let handle = limiters[2].handle("api").expect("a limit in force");
        let users = ["ada", "bob", "cy"];
        let handle_now = limiters[3].handle("api").expect("a limit in force");
        let key_of = |user: u8| keyed.then(|| users[usize::from(user)]);
        let request_of = |user: u8| match key_of(user) {
            Some(key) => Request::new("api").key(key),
            None => Request::new("api"),
        };
        let mut permits: Vec<Vec<tollgate::Permit>> = (0..4).map(|_| Vec::new()).collect();
        for step in steps {
            match step {
                Step::Ask { user, cost, high } => {
                    let priority = if high { Priority::High } else { Priority::Normal };
                    let request = request_of(user).cost(cost).priority(priority).refundable(false);
                    let checked = now(limiters[0].check(&request));
                    let acquired = now(limiters[1].try_acquire(&request));
                    let handled = now(handle.check(key_of(user), cost, priority));
                    prop_assert_eq!(
                        format!("{handled:?}"),
                        format!("{checked:?}"),
                        "a handle decides as check does"
                    );
                    let on_the_spot = handle_now
                        .check_now(key_of(user), cost, priority)
                        .ok_or_else(|| TestCaseError::fail("the memory store answers now"))?;
                    prop_assert_eq!(
                        format!("{on_the_spot:?}"),
                        format!("{checked:?}"),
                        "check_now decides as check does"
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
                    let key = user.and_then(key_of);
                    for limiter in &limiters {
                        now(limiter.pause("api", key, Duration::from_millis(ms))).expect("paused");
                    }
                }
                Step::Reserve { user, cost } => {
                    let request = request_of(user).cost(cost);
                    let outcomes: Vec<_> =
                        limiters.iter().map(|limiter| now(limiter.try_acquire(&request))).collect();
                    prop_assert_eq!(outcome_text(&outcomes[0]), outcome_text(&outcomes[2]));
                    prop_assert_eq!(outcome_text(&outcomes[0]), outcome_text(&outcomes[3]));
                    for (held, outcome) in permits.iter_mut().zip(outcomes) {
                        if let Ok(Outcome::Granted(permit)) = outcome {
                            held.push(permit);
                        }
                    }
                }
                Step::Commit { permit, used } => {
                    let mut committed = Vec::new();
                    for held in &mut permits {
                        if !held.is_empty() {
                            let permit = held.swap_remove(permit % held.len());
                            committed.push(format!("{:?}", now(permit.commit(used))));
                        }
                    }
                    prop_assert!(committed.windows(2).all(|pair| pair[0] == pair[1]), "{committed:?}");
                }
                Step::Both { user } => {
                    let request = match key_of(user) {
                        Some(key) => Request::all(&["api", "other"]).key(key),
                        None => Request::all(&["api", "other"]),
                    }
                    .refundable(false);
                    let outcomes: Vec<_> =
                        limiters.iter().map(|limiter| now(limiter.try_acquire(&request))).collect();
                    prop_assert_eq!(outcome_text(&outcomes[0]), outcome_text(&outcomes[2]));
                    prop_assert_eq!(outcome_text(&outcomes[0]), outcome_text(&outcomes[3]));
                }
            }
        }
    }
}
