//! The limiter's behaviour through its public API, on the in-memory store, with time driven by
//! tokio's paused clock (decisions and waiting share it, so every run is the same).

use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    Algorithm, DenyReason, Error, Limit, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig,
    MonotonicClock, Outcome, PermitError, PermitSecret, Policy, Priority, Request, Reserve, Used,
};

const SECOND_US: u64 = 1_000_000;

fn limiter_with(keys_tracked_max: u64) -> Limiter {
    store_and_limiter(keys_tracked_max).1
}

/// A limiter on a memory store, and the store, for tests that look into it.
fn store_and_limiter(keys_tracked_max: u64) -> (Arc<MemoryStore>, Limiter) {
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max,
            // The store-wide cap alone: these cases are about it.
            keys_per_limit_max: u64::MAX,
        },
        Arc::new(MonotonicClock::new()),
    ));
    let limiter = Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    (store, limiter)
}

fn rate(limit: u64, period_us: u64, algorithm: Algorithm) -> Policy {
    Policy::rate(limit, period_us, 0, algorithm, Reserve::default()).expect("valid policy")
}

fn add(limiter: &Limiter, name: &str, policy: Policy, per: Option<&str>) {
    limiter.set_limit(Limit::new(name, policy, per).expect("valid limit"));
}

async fn granted(limiter: &Limiter, request: &Request<'_>) -> bool {
    limiter.try_acquire(request).await.expect("ok").is_granted()
}

fn denied(outcome: Outcome) -> tollgate::Denied {
    match outcome {
        Outcome::Denied(denied) => denied,
        Outcome::Granted(permit) => panic!("expected a denial, got {:?}", permit.limits()),
    }
}

#[tokio::test(start_paused = true)]
async fn a_denial_says_exactly_when_to_come_back() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(2, SECOND_US, Algorithm::Sliding),
        None,
    );
    let request = Request::new("vendor");
    let first = limiter
        .try_acquire(&request)
        .await
        .expect("ok")
        .granted()
        .expect("room");
    assert_eq!(first.limits()[0].remaining, 1);
    tokio::time::advance(Duration::from_millis(300)).await;
    let _second = limiter
        .try_acquire(&request)
        .await
        .expect("ok")
        .granted()
        .expect("room");
    let denial = denied(limiter.try_acquire(&request).await.expect("ok"));
    assert_eq!(denial.reason, DenyReason::Capacity);
    assert_eq!(denial.retry_after, Duration::from_millis(700));
    tokio::time::advance(Duration::from_millis(699)).await;
    assert!(!granted(&limiter, &request).await);
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(granted(&limiter, &request).await);
}

#[tokio::test(start_paused = true)]
async fn a_request_over_several_limits_takes_all_or_nothing() {
    let limiter = Limiter::in_memory();
    add(&limiter, "a", rate(5, SECOND_US, Algorithm::Fixed), None);
    add(&limiter, "b", rate(5, SECOND_US, Algorithm::Fixed), None);
    add(&limiter, "c", rate(1, SECOND_US, Algorithm::Fixed), None);
    let _c = limiter
        .try_acquire(&Request::new("c"))
        .await
        .expect("ok")
        .granted()
        .expect("room");
    // Fails on the third limit: the first two must not lose a unit.
    let denial = denied(
        limiter
            .try_acquire(&Request::all(&["a", "b", "c"]))
            .await
            .expect("ok"),
    );
    assert_eq!(denial.limits.len(), 3);
    assert_eq!(denial.limits[0].remaining, 5);
    assert_eq!(denial.limits[2].remaining, 0);
    let both = limiter
        .try_acquire(&Request::all(&["a", "b"]).cost(5))
        .await
        .expect("ok")
        .granted()
        .expect("a and b are untouched");
    assert_eq!(
        both.limits()
            .iter()
            .map(|l| l.remaining)
            .collect::<Vec<_>>(),
        vec![0, 0]
    );
}

#[tokio::test(start_paused = true)]
async fn commit_refunds_unused_units_once() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(10, SECOND_US, Algorithm::Sliding),
        None,
    );
    let permit = limiter
        .try_acquire(&Request::new("vendor").cost(10))
        .await
        .expect("ok")
        .granted()
        .expect("room");
    let id = permit.detach();
    assert!(!granted(&limiter, &Request::new("vendor")).await);
    let committed = limiter.commit(id.as_str(), 4).await.expect("first commit");
    assert_eq!(committed.refunded, 6);
    let again = limiter.commit(id.as_str(), 4).await;
    assert!(
        matches!(
            again,
            Err(Error::Permit {
                source: PermitError::Gone
            })
        ),
        "{again:?}"
    );
    let six = limiter
        .try_acquire(&Request::new("vendor").cost(6))
        .await
        .expect("ok");
    assert!(six.is_granted());
    let over = limiter.commit(id.as_str(), 11).await;
    assert!(over.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_permit_that_is_not_refundable_counts_the_same_and_refunds_nothing() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(4, SECOND_US, Algorithm::Sliding),
        None,
    );
    add(
        &limiter,
        "pool",
        Policy::concurrency(1, 10 * SECOND_US, Reserve::default()).expect("valid policy"),
        None,
    );
    let both = Request::all(&["vendor", "pool"]).cost(1).refundable(false);
    let first = limiter
        .try_acquire(&both)
        .await
        .expect("ok")
        .granted()
        .expect("room");
    let id = first.id();
    // Its units count like any other grant's: three more fit, not four.
    let rest = limiter
        .try_acquire(&Request::new("vendor").cost(3).refundable(false))
        .await
        .expect("ok")
        .granted()
        .expect("room");
    assert!(!granted(&limiter, &Request::new("vendor")).await);
    // Committing refunds nothing, but the lease part is released as always.
    let committed = first.commit(0).await.expect("commit");
    assert_eq!((committed.refunded, committed.released), (0, 1));
    assert!(!granted(&limiter, &Request::new("vendor")).await);
    assert!(granted(&limiter, &Request::new("pool")).await);
    // By id, the store has no reservation to give back: a clear error, not a silent refund.
    let by_id = limiter.commit(id.as_str(), 0).await;
    assert!(
        matches!(
            by_id,
            Err(Error::Permit {
                source: PermitError::Gone
            })
        ),
        "{by_id:?}"
    );
    assert_eq!(rest.commit(0).await.expect("commit").refunded, 0);
    assert!(!granted(&limiter, &Request::new("vendor")).await);
}

/// A permit with a cost per limit, some not refundable, beside a lease: its commit by limit names
/// every rate limit, refunds what was recorded, and releases the lease.
#[tokio::test(start_paused = true)]
async fn a_commit_by_limit_settles_every_part_of_a_permit_with_costs() {
    let limiter = limiter_with(1_000);
    add(
        &limiter,
        "calls",
        rate(10, SECOND_US, Algorithm::Sliding),
        None,
    );
    add(
        &limiter,
        "tokens",
        rate(100, SECOND_US, Algorithm::Sliding),
        None,
    );
    let pool = Policy::concurrency(1, 30 * SECOND_US, Reserve::default()).expect("valid");
    add(&limiter, "pool", pool, None);
    for refundable in [true, false] {
        let permit = limiter
            .try_acquire(
                &Request::all(&["calls", "tokens", "pool"])
                    .costs(&[1, 60, 1])
                    .refundable(refundable),
            )
            .await
            .expect("ok")
            .granted()
            .expect("room");
        let committed = permit
            .commit_used(Used::Each(&[("calls", 1), ("tokens", 20)]))
            .await
            .expect("every rate limit named");
        let refunded = if refundable { 40 } else { 0 };
        assert_eq!((committed.refunded, committed.released), (refunded, 1));
        assert!(
            granted(&limiter, &Request::new("pool")).await,
            "refundable {refundable}: the lease was released"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_rate_permit_keeps_its_units_used() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(1, SECOND_US, Algorithm::Sliding),
        None,
    );
    drop(
        limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("ok"),
    );
    assert!(!granted(&limiter, &Request::new("vendor")).await);
}

#[tokio::test(start_paused = true)]
async fn leases_fence_renew_expire_and_release_once() {
    let limiter = Limiter::in_memory();
    let policy = Policy::concurrency(1, SECOND_US, Reserve::default()).expect("valid");
    add(&limiter, "pool", policy, None);
    let first = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok")
        .granted()
        .expect("room");
    let first_fence = first.fence().expect("a lease has a fence");
    assert!(!granted(&limiter, &Request::new("pool")).await);
    let id = first.detach();
    tokio::time::advance(Duration::from_millis(900)).await;
    assert_eq!(
        limiter.renew(id.as_str()).await.expect("renews"),
        Duration::from_secs(1)
    );
    tokio::time::advance(Duration::from_millis(900)).await;
    assert!(!granted(&limiter, &Request::new("pool")).await);
    // Not renewed: it expires, and the next holder gets a larger fence.
    tokio::time::advance(Duration::from_millis(100)).await;
    let second = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok")
        .granted()
        .expect("expired");
    assert!(second.fence().expect("fence") > first_fence);
    let renew_expired = limiter.renew(id.as_str()).await;
    assert!(matches!(
        renew_expired,
        Err(Error::Permit {
            source: PermitError::LeaseExpired
        })
    ));
    // The expired holder's release must not free the current holder's slot.
    let stale = limiter
        .commit(id.as_str(), 0)
        .await
        .expect("release is idempotent");
    assert_eq!(stale.released, 0);
    assert!(!granted(&limiter, &Request::new("pool")).await);
    let second_id = second.detach();
    assert_eq!(
        limiter
            .commit(second_id.as_str(), 0)
            .await
            .expect("release")
            .released,
        1
    );
    assert_eq!(
        limiter
            .commit(second_id.as_str(), 0)
            .await
            .expect("again")
            .released,
        0
    );
    let third = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok")
        .granted()
        .expect("room");
    let fourth = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok");
    assert!(
        !fourth.is_granted(),
        "a second release handed out a slot twice"
    );
    drop(third);
}

/// A part that cannot be settled does not stop the others: the lease after it is released,
/// and the first error is what the caller hears.
#[tokio::test(start_paused = true)]
async fn settling_a_permit_settles_every_part_and_reports_the_first_error() {
    let pool = || Policy::concurrency(1, 60 * SECOND_US, Reserve::default()).expect("valid");
    for settle in ["commit", "commit by id", "release"] {
        let limiter = Limiter::in_memory();
        // The part that fails comes first: a rate limit for a commit, a lease for a release.
        let first = if settle == "release" {
            pool()
        } else {
            rate(10, SECOND_US, Algorithm::Sliding)
        };
        add(&limiter, "first", first, None);
        add(&limiter, "pool", pool(), None);
        let Outcome::Granted(permit) = limiter
            .try_acquire(&Request::all(&["first", "pool"]))
            .await
            .expect("ok")
        else {
            panic!("{settle}: the first request is granted");
        };
        // The first part's limit is gone: settling it fails.
        assert!(limiter.remove_limit("first"));
        let settled = match settle {
            "commit" => permit.commit(0).await,
            "release" => permit.release().await,
            _ => limiter.commit(permit.detach().as_str(), 0).await,
        };
        assert!(
            matches!(
                settled,
                Err(Error::Permit {
                    source: PermitError::Gone
                })
            ),
            "{settle}: {settled:?}"
        );
        assert!(
            granted(&limiter, &Request::new("pool")).await,
            "{settle}: the lease after the failing part was left held"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_lease_is_released() {
    let limiter = Limiter::in_memory();
    let policy = Policy::concurrency(1, 60 * SECOND_US, Reserve::default()).expect("valid");
    add(&limiter, "pool", policy, None);
    let lease = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok");
    assert!(lease.is_granted());
    drop(lease);
    assert!(granted(&limiter, &Request::new("pool")).await);
}

#[tokio::test(start_paused = true)]
async fn pauses_stop_every_key_and_only_extend() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(100, SECOND_US, Algorithm::Sliding),
        Some("account"),
    );
    let request = Request::new("vendor").key("acme");
    assert!(granted(&limiter, &request).await);
    let left = limiter
        .pause("vendor", None, Duration::from_secs(15))
        .await
        .expect("pause");
    assert_eq!(left, Duration::from_secs(15));
    // A shorter pause does not shorten it.
    let left = limiter
        .pause("vendor", None, Duration::from_secs(1))
        .await
        .expect("pause");
    assert_eq!(left, Duration::from_secs(15));
    let denial = denied(limiter.try_acquire(&request).await.expect("ok"));
    assert_eq!(denial.reason, DenyReason::Paused);
    assert_eq!(denial.retry_after, Duration::from_secs(15));
    let other = denied(
        limiter
            .try_acquire(&Request::new("vendor").key("other"))
            .await
            .expect("ok"),
    );
    assert_eq!(other.reason, DenyReason::Paused);
    // One key alone.
    tokio::time::advance(Duration::from_secs(15)).await;
    limiter
        .pause("vendor", Some("acme"), Duration::from_secs(2))
        .await
        .expect("pause");
    assert!(!granted(&limiter, &request).await);
    assert!(granted(&limiter, &Request::new("vendor").key("other")).await);
    // A waiter sleeps through the pause and is granted when it ends.
    let waited = limiter
        .acquire(&request.clone().wait(Duration::from_secs(5)))
        .await
        .expect("ok");
    assert!(waited.is_granted());
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_with_the_field_named() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(10, SECOND_US, Algorithm::Sliding),
        Some("user"),
    );
    add(
        &limiter,
        "flat",
        rate(10, SECOND_US, Algorithm::Sliding),
        None,
    );
    let field = |result: Result<Outcome, Error>| match result {
        Err(Error::InvalidRequest { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        field(limiter.try_acquire(&Request::new("vendor")).await),
        "key"
    );
    let long_key = "k".repeat(tollgate::KEY_BYTES_MAX + 1);
    assert_eq!(
        field(
            limiter
                .try_acquire(&Request::new("vendor").key(&long_key))
                .await
        ),
        "key"
    );
    assert_eq!(
        field(limiter.try_acquire(&Request::new("flat").cost(0)).await),
        "cost"
    );
    assert_eq!(
        field(limiter.try_acquire(&Request::all(&["flat", "flat"])).await),
        "limits"
    );
    assert_eq!(
        field(limiter.try_acquire(&Request::all(&[])).await),
        "limits"
    );
    assert!(matches!(
        limiter.try_acquire(&Request::new("nope")).await,
        Err(Error::UnknownLimit { .. })
    ));
    assert!(matches!(
        limiter.try_acquire(&Request::new("flat").cost(11)).await,
        Err(Error::Cost { .. })
    ));
    assert!(matches!(
        limiter.commit("not-a-permit", 0).await,
        Err(Error::InvalidRequest {
            field: "permit",
            ..
        })
    ));
    assert!(matches!(
        limiter
            .pause("flat", Some("u"), Duration::from_secs(1))
            .await,
        Err(Error::InvalidRequest { field: "key", .. })
    ));
    assert!(matches!(
        limiter.pause("flat", None, Duration::ZERO).await,
        Err(Error::InvalidRequest {
            field: "retry_after_ms",
            ..
        })
    ));
    assert!(Limit::new("Upper", rate(1, SECOND_US, Algorithm::Fixed), None).is_err());
    assert!(Limit::new(&"a".repeat(129), rate(1, SECOND_US, Algorithm::Fixed), None).is_err());
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_highest_priority_first_then_in_arrival_order() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(1, SECOND_US, Algorithm::Fixed),
        None,
    );
    let _taken = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("ok");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, priority) in [
        ("low-1", Priority::Low),
        ("normal-1", Priority::Normal),
        ("high-1", Priority::High),
        ("normal-2", Priority::Normal),
        ("high-2", Priority::High),
    ] {
        let limiter = limiter.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let request = Request::new("vendor")
                .priority(priority)
                .wait(Duration::from_secs(30));
            let outcome = limiter.acquire(&request).await.expect("ok");
            assert!(outcome.is_granted(), "{name} waited in vain");
            order.lock().expect("lock").push(name);
        }));
        // Arrive in the listed order.
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(
        *order.lock().expect("lock"),
        vec!["high-1", "high-2", "normal-1", "normal-2", "low-1"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_higher_priority_is_never_delayed_by_lower_waiters_or_reserves() {
    let limiter = Limiter::in_memory();
    let policy = Policy::rate(
        5,
        SECOND_US,
        0,
        Algorithm::Sliding,
        Reserve { high: 2, normal: 0 },
    )
    .expect("valid");
    add(&limiter, "vendor", policy, None);
    // Bulk work takes what it may: 3 units, and then waits.
    for _ in 0..3 {
        let outcome = limiter
            .try_acquire(&Request::new("vendor").priority(Priority::Low))
            .await;
        assert!(outcome.expect("ok").is_granted());
    }
    let bulk = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new("vendor")
                .priority(Priority::Low)
                .wait(Duration::from_secs(10));
            limiter.acquire(&request).await.expect("ok").is_granted()
        })
    };
    tokio::task::yield_now().await;
    // High finds its reserve at once, despite the waiting bulk request.
    let high = limiter
        .try_acquire(&Request::new("vendor").priority(Priority::High).cost(2))
        .await
        .expect("ok");
    assert!(high.is_granted());
    assert!(bulk.await.expect("task"));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_by_a_release_not_a_timer() {
    let limiter = Limiter::in_memory();
    let policy = Policy::concurrency(1, 3600 * SECOND_US, Reserve::default()).expect("valid");
    add(&limiter, "pool", policy, None);
    let held = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok")
        .granted()
        .expect("room");
    let start = tokio::time::Instant::now();
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new("pool").wait(Duration::from_secs(60));
            let permit = limiter
                .acquire(&request)
                .await
                .expect("ok")
                .granted()
                .expect("granted");
            (tokio::time::Instant::now(), permit.fence())
        })
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    held.release().await.expect("release");
    let (granted_at, fence) = waiter.await.expect("task");
    assert_eq!(granted_at - start, Duration::from_millis(250));
    assert!(fence.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_holds_nothing_and_passes_the_turn_on() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(1, SECOND_US, Algorithm::Fixed),
        None,
    );
    let _taken = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("ok");
    let first = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new("vendor").wait(Duration::from_secs(30));
            limiter
                .acquire(&request)
                .await
                .map(|outcome| outcome.is_granted())
        })
    };
    tokio::task::yield_now().await;
    let second = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new("vendor").wait(Duration::from_secs(30));
            limiter
                .acquire(&request)
                .await
                .map(|outcome| outcome.is_granted())
        })
    };
    tokio::task::yield_now().await;
    first.abort();
    assert!(first.await.is_err());
    assert!(second.await.expect("task").expect("ok"));
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_ends_reports_the_remaining_retry() {
    let limiter = Limiter::in_memory();
    // Sliding, not fixed: a fixed window is aligned on the clock's epoch, which would make the
    // outcome depend on when the test runs.
    add(
        &limiter,
        "vendor",
        rate(1, 10 * SECOND_US, Algorithm::Sliding),
        None,
    );
    let _taken = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("ok");
    let start = tokio::time::Instant::now();
    let outcome = limiter
        .acquire(&Request::new("vendor").wait(Duration::from_secs(2)))
        .await
        .expect("ok");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    let denial = denied(outcome);
    assert_eq!(denial.retry_after, Duration::from_secs(8), "{denial:?}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_waits_with_a_clear_error() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(1, 10 * SECOND_US, Algorithm::Fixed),
        None,
    );
    let _taken = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("ok");
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            limiter
                .acquire(&Request::new("vendor").wait(Duration::from_secs(5)))
                .await
        })
    };
    tokio::task::yield_now().await;
    limiter.shutdown();
    assert!(matches!(
        waiter.await.expect("task"),
        Err(Error::ShuttingDown)
    ));
}

#[tokio::test(start_paused = true)]
async fn idle_keys_are_forgotten_and_the_cap_is_enforced() {
    let (store, limiter) = store_and_limiter(100);
    add(
        &limiter,
        "per-user",
        rate(1, SECOND_US, Algorithm::Sliding),
        Some("user"),
    );
    for user in 0..100 {
        let key = format!("user-{user}");
        let outcome = limiter
            .try_acquire(&Request::new("per-user").key(&key))
            .await;
        assert!(outcome.expect("ok").is_granted());
    }
    assert_eq!(store.len(), 100);
    let full = limiter
        .try_acquire(&Request::new("per-user").key("one-more"))
        .await;
    assert!(
        matches!(
            full,
            Err(Error::TooManyKeys {
                keys_tracked_max: 100
            })
        ),
        "{full:?}"
    );
    // One period later every counter is idle; new keys push the old ones out.
    tokio::time::advance(Duration::from_secs(1)).await;
    for user in 100..200 {
        let key = format!("user-{user}");
        let outcome = limiter
            .try_acquire(&Request::new("per-user").key(&key))
            .await;
        assert!(outcome.expect("room after eviction").is_granted());
    }
    assert_eq!(store.len(), 100);
    // The new ones are live: the cap holds.
    let full = limiter
        .try_acquire(&Request::new("per-user").key("one-more"))
        .await;
    assert!(matches!(full, Err(Error::TooManyKeys { .. })), "{full:?}");
}

/// After a crash, only the limits the previous run had are held, from when it was last known
/// to grant, with their own reason; a limit created since is not held at all.
#[tokio::test(start_paused = true)]
async fn a_hold_after_a_crash_covers_the_old_limits_from_their_last_grant() {
    let clock = Arc::new(MonotonicClock::new());
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1000,
            keys_per_limit_max: 1000,
        },
        clock.clone(),
    ));
    let limiter = Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    let hourly =
        Limit::new("hourly", rate(10, 3600 * SECOND_US, Algorithm::Fixed), None).expect("valid");
    limiter.set_limit(hourly.clone());
    // The previous run was last heard of 59 minutes ago: one minute of the hour is left.
    let last_heard = tollgate::Clock::now_us(&*clock) - 59 * 60 * SECOND_US;
    store.hold(last_heard, [&hourly]);
    let denial = denied(
        limiter
            .try_acquire(&Request::new("hourly"))
            .await
            .expect("ok"),
    );
    assert_eq!(denial.reason, DenyReason::Recovering);
    assert_eq!(denial.retry_after, Duration::from_secs(60));
    // A pause asked for on top, longer than the hold, is a pause.
    limiter
        .pause("hourly", None, Duration::from_secs(120))
        .await
        .expect("paused");
    let denial = denied(
        limiter
            .try_acquire(&Request::new("hourly"))
            .await
            .expect("ok"),
    );
    assert_eq!(denial.reason, DenyReason::Paused);
    // A limit the previous run never had is not held.
    add(
        &limiter,
        "new",
        rate(10, 3600 * SECOND_US, Algorithm::Fixed),
        None,
    );
    assert!(granted(&limiter, &Request::new("new")).await);
    tokio::time::advance(Duration::from_secs(121)).await;
    assert!(granted(&limiter, &Request::new("hourly")).await);
}

/// A snapshot put back in a new store resumes exactly: what was used stays used, leases stay
/// held, pauses go on, and nothing is held back.
#[tokio::test(start_paused = true)]
async fn a_snapshot_restored_resumes_exactly() {
    let (old_store, old) = store_and_limiter(1000);
    let limits = [
        Limit::new(
            "sliding",
            rate(3, 3600 * SECOND_US, Algorithm::Sliding),
            None,
        ),
        Limit::new(
            "fixed",
            rate(3, 3600 * SECOND_US, Algorithm::Fixed),
            Some("user"),
        ),
        Limit::new(
            "gcra",
            rate(3, 3600 * SECOND_US, Algorithm::Gcra { burst: 3 }),
            None,
        ),
        Limit::new(
            "pool",
            Policy::concurrency(2, 3600 * SECOND_US, Reserve::default()).expect("valid"),
            None,
        ),
        Limit::new(
            "paused",
            rate(3, 3600 * SECOND_US, Algorithm::Sliding),
            None,
        ),
    ]
    .map(|limit| limit.expect("valid"));
    for limit in &limits {
        old.set_limit(limit.clone());
    }
    for name in ["sliding", "gcra"] {
        assert!(granted(&old, &Request::new(name)).await);
        assert!(granted(&old, &Request::new(name).cost(2)).await);
    }
    assert!(granted(&old, &Request::new("fixed").key("ann").cost(3)).await);
    let Outcome::Granted(lease) = old.try_acquire(&Request::new("pool")).await.expect("ok") else {
        panic!("lease not granted");
    };
    // Kept past its guard, as a holder that goes on working across the restart would.
    let _ = lease.detach();
    old.pause("paused", None, Duration::from_secs(600))
        .await
        .expect("paused");
    let snapshot = old_store.snapshot();
    assert!(!snapshot.counters.is_empty());

    // A new process: a new store on the same clock, the same limits.
    let (store, limiter) = store_and_limiter(1000);
    for limit in &limits {
        limiter.set_limit(limit.clone());
    }
    let restored = store.restore(&snapshot, |name| {
        limits
            .iter()
            .find(|limit| limit.name() == name)
            .map(|limit| *limit.policy())
    });
    assert_eq!(restored.counters, snapshot.counters.len(), "{restored:?}");
    assert!(restored.held.is_empty());
    for name in ["sliding", "gcra"] {
        let denial = denied(limiter.try_acquire(&Request::new(name)).await.expect("ok"));
        assert_eq!(denial.reason, DenyReason::Capacity, "{name}");
    }
    assert!(!granted(&limiter, &Request::new("fixed").key("ann")).await);
    assert!(granted(&limiter, &Request::new("fixed").key("bob")).await);
    let second = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok");
    assert!(second.is_granted());
    assert!(
        !granted(&limiter, &Request::new("pool")).await,
        "the old lease is held"
    );
    drop(second);
    let denial = denied(
        limiter
            .try_acquire(&Request::new("paused"))
            .await
            .expect("ok"),
    );
    assert_eq!(denial.reason, DenyReason::Paused);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(granted(&limiter, &Request::new("sliding")).await);
}

/// A saved counter that cannot be read back (a row edited by hand, or from another version)
/// loses nothing: its limit is held from the snapshot's time, as after a crash, and named.
#[tokio::test(start_paused = true)]
async fn a_saved_counter_that_cannot_be_read_holds_its_limit() {
    let (old_store, old) = store_and_limiter(1000);
    let hourly = Limit::new(
        "hourly",
        rate(3, 3600 * SECOND_US, Algorithm::Sliding),
        None,
    )
    .expect("valid");
    old.set_limit(hourly.clone());
    assert!(granted(&old, &Request::new("hourly")).await);
    let mut snapshot = old_store.snapshot();
    assert_eq!(snapshot.counters.len(), 1);
    snapshot.counters[0].state.truncate(2);

    let (store, limiter) = store_and_limiter(1000);
    limiter.set_limit(hourly.clone());
    let restored = store.restore(&snapshot, |name| {
        (name == "hourly").then(|| *hourly.policy())
    });
    assert_eq!(restored.counters, 0);
    assert_eq!(restored.held, ["hourly"]);
    let denial = denied(
        limiter
            .try_acquire(&Request::new("hourly"))
            .await
            .expect("ok"),
    );
    assert_eq!(denial.reason, DenyReason::Recovering);
    // Each store's clock reads wall time from its start: the two differ by the instant between.
    assert!(
        denial.retry_after <= Duration::from_secs(3600)
            && denial.retry_after > Duration::from_secs(3599),
        "{denial:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_changed_policy_keeps_what_was_granted() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(3, SECOND_US, Algorithm::Sliding),
        None,
    );
    for _ in 0..3 {
        assert!(granted(&limiter, &Request::new("vendor")).await);
    }
    add(
        &limiter,
        "vendor",
        rate(5, SECOND_US, Algorithm::Sliding),
        None,
    );
    for _ in 0..2 {
        assert!(granted(&limiter, &Request::new("vendor")).await);
    }
    assert!(!granted(&limiter, &Request::new("vendor")).await);
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_keys_gives_its_memory_back_once_idle() {
    let (store, limiter) = store_and_limiter(1_000_000);
    add(
        &limiter,
        "per-user",
        rate(5, SECOND_US, Algorithm::Fixed),
        Some("user"),
    );
    let empty = store.capacity();
    for user in 0..50_000 {
        let key = format!("user-{user}");
        let request = Request::new("per-user").key(&key);
        assert!(limiter.check(&request).await.expect("ok").is_allowed());
    }
    assert_eq!(store.len(), 50_000);
    let loaded = store.capacity();
    assert!(loaded >= 50_000, "{loaded}");
    // One period later every counter is idle: a sweep drops them, and the maps shrink with
    // them instead of keeping the burst's size.
    tokio::time::advance(Duration::from_secs(1)).await;
    while store.sweep(1_000) > 0 {}
    assert_eq!(store.len(), 0);
    let swept = store.capacity();
    assert!(
        swept <= empty.max(64 * 64),
        "capacity {swept} after the sweep, {loaded} loaded, {empty} empty"
    );
    // The store still works, and grows again as needed.
    for user in 0..1_000 {
        let key = format!("again-{user}");
        let request = Request::new("per-user").key(&key);
        assert!(limiter.check(&request).await.expect("ok").is_allowed());
    }
    assert_eq!(store.len(), 1_000);
}

/// At the key cap, a request over two counters of one shard must not sweep away the counter it
/// has just made for its first limit while it makes room for its second. Which shard a counter
/// lands in depends on the store's random seed, so many stores are tried: two counters share a
/// shard in one store of 64, and 2,000 stores leave no chance of missing it.
#[tokio::test(start_paused = true)]
async fn a_request_at_the_key_cap_never_loses_its_own_counters() {
    for _ in 0..2_000 {
        let limiter = limiter_with(1);
        for name in ["per-user-a", "per-user-b"] {
            add(
                &limiter,
                name,
                rate(5, SECOND_US, Algorithm::Fixed),
                Some("user"),
            );
        }
        let request = Request::all(&["per-user-a", "per-user-b"]).key("ada");
        let answer = limiter.try_acquire(&request).await;
        assert!(
            matches!(
                answer,
                Err(Error::TooManyKeys {
                    keys_tracked_max: 1
                })
            ),
            "two counters cannot fit under a cap of one: {answer:?}"
        );
    }
}

/// Waiting is bounded per limit and overall: a request that finds a cap full is decided at
/// once, its denial says which cap, and the other limits' waiters still queue.
#[tokio::test(start_paused = true)]
async fn full_waiting_lines_answer_at_once_naming_the_cap() {
    let limiter = Limiter::new(
        Arc::new(MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 1_000,
                keys_per_limit_max: 1_000,
            },
            Arc::new(MonotonicClock::new()),
        )),
        LimiterConfig {
            waiters_max: 3,
            waiters_per_limit_max: 2,
            ..LimiterConfig::default()
        },
    );
    for name in ["flooded", "other", "third"] {
        add(
            &limiter,
            name,
            rate(1, 3600 * SECOND_US, Algorithm::Sliding),
            Some("user"),
        );
        // Used up for every key asked below.
        for user in ["u0", "u1", "u2", "u3"] {
            assert!(granted(&limiter, &Request::new(name).key(user)).await);
        }
    }
    let wait = |name: &'static str, user: &'static str| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            limiter
                .acquire(&Request::new(name).key(user).wait(Duration::from_secs(30)))
                .await
        })
    };
    // Two users of one limit fill its line: keys count together.
    let first = wait("flooded", "u0");
    let second = wait("flooded", "u1");
    tokio::time::sleep(Duration::from_millis(1)).await;
    let started = tokio::time::Instant::now();
    let overflow = denied(
        limiter
            .acquire(
                &Request::new("flooded")
                    .key("u2")
                    .wait(Duration::from_secs(30)),
            )
            .await
            .expect("an answer"),
    );
    assert_eq!(started.elapsed(), Duration::ZERO, "decided at once");
    assert_eq!(overflow.reason, DenyReason::Capacity);
    assert_eq!(
        overflow.not_queued,
        Some(tollgate::QueueFull::Limit {
            limit: "flooded".into(),
            waiters_per_limit_max: 2,
        })
    );
    assert!(
        overflow
            .not_queued
            .expect("full")
            .to_string()
            .contains("waiters_per_limit_max")
    );
    // Another limit still queues, until the overall cap is full too.
    let third = wait("other", "u0");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!third.is_finished(), "the other limit's waiter queues");
    let overall = denied(
        limiter
            .acquire(
                &Request::new("third")
                    .key("u0")
                    .wait(Duration::from_secs(30)),
            )
            .await
            .expect("an answer"),
    );
    assert_eq!(
        overall.not_queued,
        Some(tollgate::QueueFull::Overall { waiters_max: 3 })
    );
    // A waiter leaving makes room again.
    first.abort();
    let _ = first.await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let fourth = wait("third", "u1");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!fourth.is_finished(), "queued once there was room");
    for task in [second, third, fourth] {
        task.abort();
    }
}

/// Each limit counted per key has its own budget of keys (the store's, or its own
/// `keys_max`): a flood of one takes no room from another, an unkeyed limit is never refused
/// for any cap, and idle keys give their places back to their limit.
#[tokio::test(start_paused = true)]
async fn every_keyed_limit_has_its_own_budget_of_keys() {
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 12,
            keys_per_limit_max: 4,
        },
        Arc::new(MonotonicClock::new()),
    ));
    let limiter = Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            pause_max: Duration::from_secs(60),
            ..LimiterConfig::default()
        },
    );
    let policy = rate(5, SECOND_US, Algorithm::Sliding);
    add(&limiter, "a", policy, Some("user"));
    add(&limiter, "b", policy, Some("user"));
    let big = Limit::new("big", policy, Some("user"))
        .and_then(|limit| limit.with_keys_max(Some(100)))
        .expect("valid");
    limiter.set_limit(big);
    for user in ["u0", "u1", "u2", "u3"] {
        assert!(granted(&limiter, &Request::new("a").key(user)).await);
    }
    let full = limiter.try_acquire(&Request::new("a").key("u4")).await;
    match full {
        Err(Error::TooManyKeysForLimit { limit, keys_max: 4 }) => assert_eq!(limit, "a"),
        other => panic!("a's budget: {other:?}"),
    }
    assert_eq!(store.keys_of("a"), 4);
    assert!(granted(&limiter, &Request::new("b").key("u4")).await);
    // A pause of a new key takes a place like any other key.
    for user in ["p0", "p1", "p2"] {
        limiter
            .pause("b", Some(user), Duration::from_secs(600))
            .await
            .expect("paused");
    }
    let full = limiter
        .pause("b", Some("p3"), Duration::from_secs(600))
        .await;
    assert!(
        matches!(full, Err(Error::TooManyKeysForLimit { .. })),
        "{full:?}"
    );
    // Its own budget lets `big` reach the store's cap, and only then does the cap refuse.
    for user in ["u0", "u1", "u2", "u3"] {
        assert!(granted(&limiter, &Request::new("big").key(user)).await);
    }
    let capped = limiter.try_acquire(&Request::new("big").key("u4")).await;
    assert!(
        matches!(
            capped,
            Err(Error::TooManyKeys {
                keys_tracked_max: 12
            })
        ),
        "{capped:?}"
    );
    // An unkeyed limit's one counter is made even at the cap.
    add(&limiter, "solo", policy, None);
    assert!(granted(&limiter, &Request::new("solo")).await);
    // Idle keys give their places back to their own limit (the paused ones are not idle: a
    // pause was cut to a minute).
    tokio::time::advance(Duration::from_secs(2)).await;
    store.sweep(1_000);
    assert_eq!(store.keys_of("a"), 0);
    assert_eq!(store.keys_of("b"), 3);
    assert!(granted(&limiter, &Request::new("a").key("u4")).await);
    tokio::time::advance(Duration::from_secs(60)).await;
    store.sweep(1_000);
    assert_eq!(store.keys_of("b"), 0);
}

/// A waiter its store cannot serve before its deadline holds nobody back: a caller that keeps
/// one unit of an hourly limit and waits a minute for all ten does not queue the others.
#[tokio::test(start_paused = true)]
async fn a_waiter_that_cannot_be_served_in_time_holds_nobody_back() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "hourly",
        rate(10, 3_600 * SECOND_US, Algorithm::Sliding),
        None,
    );
    assert!(granted(&limiter, &Request::new("hourly")).await);
    let greedy = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new("hourly")
                .cost(10)
                .wait(Duration::from_secs(60));
            limiter.acquire(&request).await.expect("ok").is_granted()
        })
    };
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_eq!(limiter.waiting("hourly"), 1, "the greedy request waits");
    for _ in 0..9 {
        let outcome = limiter
            .try_acquire(&Request::new("hourly"))
            .await
            .expect("ok");
        assert!(
            outcome.is_granted(),
            "held back behind a waiter that cannot be served: {:?}",
            denied(outcome).reason
        );
    }
    assert!(!greedy.await.expect("task"), "ten units were never free");
}

/// A waiter that can be served holds its queue, but for one lease TTL at most: a caller that
/// renews one lease of five and waits for all five is let go after a TTL, and asking again
/// with the same cost does not buy it another hold.
#[tokio::test(start_paused = true)]
async fn a_waiter_holds_its_queue_for_one_lease_ttl_at_most() {
    let limiter = Limiter::in_memory();
    let ttl = Duration::from_secs(10);
    let policy = Policy::concurrency(5, ttl.as_micros() as u64, Reserve::default()).expect("valid");
    add(&limiter, "pool", policy, None);
    let held = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok")
        .granted()
        .expect("room")
        .detach();
    let renewer = {
        let limiter = limiter.clone();
        let held = held.as_str().to_owned();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(4)).await;
                limiter.renew(&held).await.expect("renews");
            }
        })
    };
    let waits = |limiter: Limiter| {
        tokio::spawn(async move {
            let request = Request::new("pool").cost(5).wait(Duration::from_secs(60));
            limiter.acquire(&request).await.expect("ok").is_granted()
        })
    };
    let first = waits(limiter.clone());
    tokio::time::advance(Duration::from_millis(10)).await;
    // Within its hold bound the waiter goes first: a lease might still expire for it.
    let outcome = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok");
    assert_eq!(denied(outcome).reason, DenyReason::Queued);
    // A second at a time, so that the renewals keep the lease.
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    // The waiter's turn to run: it woke at its bound, was denied again and was let go.
    tokio::time::advance(Duration::from_millis(10)).await;
    let taken = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("ok")
        .granted()
        .expect("let go after one TTL, the waiter holds nobody back");
    drop(taken);
    assert!(
        !first.await.expect("task"),
        "its own renewed lease never freed"
    );
    // The same cost asked again starts let go.
    let second = waits(limiter.clone());
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_eq!(limiter.waiting("pool"), 1);
    assert!(
        limiter
            .try_acquire(&Request::new("pool"))
            .await
            .expect("ok")
            .is_granted(),
        "asking again bought a new hold"
    );
    // Let go, it still waits: once the lease is no longer renewed, it is served.
    renewer.abort();
    assert!(
        second.await.expect("task"),
        "a waiter let go is still served"
    );
}

/// A waiter that can be served in time keeps its place: the large request is granted before
/// the small ones that came after it.
#[tokio::test(start_paused = true)]
async fn a_waiter_that_can_be_served_keeps_its_place_ahead_of_later_callers() {
    let limiter = Limiter::in_memory();
    add(
        &limiter,
        "vendor",
        rate(10, SECOND_US, Algorithm::Sliding),
        None,
    );
    assert!(granted(&limiter, &Request::new("vendor").cost(5)).await);
    let large = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new("vendor").cost(10).wait(Duration::from_secs(5));
            limiter.acquire(&request).await.expect("ok").is_granted()
        })
    };
    tokio::time::advance(Duration::from_millis(10)).await;
    let outcome = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("ok");
    assert_eq!(denied(outcome).reason, DenyReason::Queued);
    assert!(large.await.expect("task"), "served within one window");
}
