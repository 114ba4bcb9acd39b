//! The behaviour every store must show through the limiter, as one suite that each store's tests
//! run (`conformance_tests!`), so the memory store, the Redis store and a store written outside
//! the workspace (`crates/engine/tests/external_store.rs`) are held to the same cases rather
//! than to copies that drift apart. A crate of its own, apart from the engine: the suite is
//! only ever a dev-dependency, and the engine library ships none of it.
//!
//! The suite runs on the wall clock (a shared store has its own clock, which no test can pause),
//! so it asserts safety exactly and timing only with generous room: never more than a limit,
//! never a double release; a wait ends "well before" a deadline that would only be reached if a
//! wake-up were lost. Counting is done from the grants' own decision times (`decided_at_us`, the
//! deciding clock of G1), by the test, never from the store's numbers: a committed grant counts
//! the units its caller said it used, not the cost less what the store says it refunded.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::store::{Ask, Decision, Forward, Store, StoreFuture};
use tollgate::{
    Algorithm, Check, DenyReason, Error, Limit, Limiter, LimiterConfig, Outcome, PermitError,
    PermitSecret, Policy, Priority, Request, Reserve, Used,
};

/// Two views of one shared state: two handles a store's users would open (for the memory store,
/// the same store twice; for Redis, two connections on one namespace).
#[derive(Debug, Clone)]
pub struct Stores {
    pub first: Arc<dyn Store>,
    pub second: Arc<dyn Store>,
}

const MS: u64 = 1_000;

fn limiter(store: &Arc<dyn Store>, secret: PermitSecret) -> Limiter {
    Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: secret,
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    )
}

fn pair(stores: &Stores) -> (Limiter, Limiter) {
    let secret = PermitSecret::random();
    (
        limiter(&stores.first, secret),
        limiter(&stores.second, secret),
    )
}

fn rate(limit: u64, period_ms: u64, algorithm: Algorithm) -> Policy {
    Policy::rate(limit, period_ms * MS, 0, algorithm, Reserve::default()).expect("valid policy")
}

fn add(limiters: &[&Limiter], name: &str, policy: Policy, per: Option<&str>) {
    for limiter in limiters {
        limiter.set_limit(Limit::new(name, policy, per).expect("valid limit"));
    }
}

fn denied(outcome: Outcome) -> tollgate::Denied {
    match outcome {
        Outcome::Denied(denied) => denied,
        Outcome::Granted(permit) => panic!("expected a denial, got {:?}", permit.limits()),
    }
}

/// Grant up to the limit, then deny with a hint that is honest: after waiting it out, granted.
pub async fn rate_limits_grant_to_the_limit_and_hint_honestly(stores: Stores) {
    let (limiter, _) = pair(&stores);
    for (name, algorithm) in [
        ("sliding", Algorithm::Sliding),
        ("fixed", Algorithm::Fixed),
        ("gcra", Algorithm::Gcra { burst: 3 }),
    ] {
        add(&[&limiter], name, rate(3, 400, algorithm), None);
        let request = Request::new(name);
        let mut granted = 0;
        let denial = loop {
            match limiter.try_acquire(&request).await.expect("store answers") {
                Outcome::Granted(_) => granted += 1,
                Outcome::Denied(denial) => break denial,
            }
            // A fixed window may roll over mid-loop; more than two windows' worth is a bug.
            assert!(granted <= 6, "{name}: {granted} grants without a denial");
        };
        assert!(granted >= 1, "{name}: nothing granted on a fresh limit");
        assert_eq!(denial.reason, DenyReason::Capacity, "{name}");
        assert!(
            !denial.retry_after.is_zero() && denial.retry_after <= Duration::from_millis(400),
            "{name}: retry after {:?}",
            denial.retry_after
        );
        tokio::time::sleep(denial.retry_after).await;
        let outcome = limiter.try_acquire(&request).await.expect("store answers");
        assert!(
            outcome.is_granted(),
            "{name}: still denied after the hinted wait"
        );
    }
}

/// A request over several limits takes from all of them or from none.
pub async fn several_limits_are_all_or_nothing(stores: Stores) {
    let (limiter, _) = pair(&stores);
    add(&[&limiter], "a", rate(5, 60_000, Algorithm::Sliding), None);
    add(&[&limiter], "b", rate(5, 60_000, Algorithm::Sliding), None);
    add(&[&limiter], "c", rate(1, 60_000, Algorithm::Sliding), None);
    let _c = limiter
        .try_acquire(&Request::new("c"))
        .await
        .expect("answers");
    let denial = denied(
        limiter
            .try_acquire(&Request::all(&["a", "b", "c"]))
            .await
            .expect("answers"),
    );
    assert_eq!(denial.limits[0].remaining, 5);
    assert_eq!(denial.limits[1].remaining, 5);
    let both = limiter
        .try_acquire(&Request::all(&["a", "b"]).cost(5))
        .await
        .expect("answers");
    assert!(
        both.is_granted(),
        "the failed request took units from a or b"
    );
}

/// `commit(used)` gives back `cost - used`, once: judged by what can be taken afterwards, the
/// limit being full before the commit.
pub async fn commit_refunds_unused_units_once(stores: Stores) {
    let (limiter, other) = pair(&stores);
    let (cost, used) = (10, 4);
    add(
        &[&limiter, &other],
        "vendor",
        rate(cost, 60_000, Algorithm::Sliding),
        None,
    );
    let permit = limiter
        .try_acquire(&Request::new("vendor").cost(cost))
        .await
        .expect("answers")
        .granted()
        .expect("room");
    let id = permit.detach();
    assert!(
        !limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers")
            .is_granted()
    );
    // Committed through the other handle: a permit id is good in every process.
    let committed = other.commit(id.as_str(), used).await.expect("commit");
    assert_eq!(committed.refunded, cost - used);
    let again = limiter.commit(id.as_str(), used).await;
    assert!(
        matches!(
            again,
            Err(Error::Permit {
                source: PermitError::Gone
            })
        ),
        "{again:?}"
    );
    let unused = limiter
        .try_acquire(&Request::new("vendor").cost(cost - used))
        .await
        .expect("answers");
    assert!(unused.is_granted(), "the unused units did not come back");
    assert!(
        !limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers")
            .is_granted(),
        "more came back than the permit left unused"
    );
}

/// Leases: fences grow, renewals extend, a release frees a slot once, a dropped guard releases.
pub async fn leases_fence_renew_and_release_once(stores: Stores) {
    let (limiter, other) = pair(&stores);
    let policy = Policy::concurrency(1, 30_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter, &other], "pool", policy, None);
    let first = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("answers");
    let first = first.granted().expect("a free slot");
    let first_fence = first.fence().expect("a lease has a fence");
    assert!(
        !other
            .try_acquire(&Request::new("pool"))
            .await
            .expect("answers")
            .is_granted()
    );
    let id = first.detach();
    let renewed = other.renew(id.as_str()).await.expect("renews");
    assert!(renewed > Duration::from_secs(25), "{renewed:?}");
    assert_eq!(
        other
            .commit(id.as_str(), 0)
            .await
            .expect("release")
            .released,
        1
    );
    assert_eq!(
        limiter
            .commit(id.as_str(), 0)
            .await
            .expect("idempotent")
            .released,
        0
    );
    let second = other
        .try_acquire(&Request::new("pool"))
        .await
        .expect("answers");
    let second = second.granted().expect("released slot");
    assert!(second.fence().expect("fence") > first_fence);
    // The old holder's second release must not free the new holder's slot.
    assert_eq!(
        limiter
            .commit(id.as_str(), 0)
            .await
            .expect("idempotent")
            .released,
        0
    );
    assert!(
        !limiter
            .try_acquire(&Request::new("pool"))
            .await
            .expect("answers")
            .is_granted()
    );
    let renew_released = limiter.renew(id.as_str()).await;
    assert!(matches!(
        renew_released,
        Err(Error::Permit {
            source: PermitError::LeaseExpired
        })
    ));
    // A dropped guard releases (at once in process, from a task for a remote store).
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if limiter
            .try_acquire(&Request::new("pool"))
            .await
            .expect("answers")
            .is_granted()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a dropped lease was never released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Pauses stop every key of a limit (or one key), only extend, and end on time.
pub async fn pauses_stop_grants_and_only_extend(stores: Stores) {
    let (limiter, other) = pair(&stores);
    let policy = rate(100, 1_000, Algorithm::Sliding);
    add(&[&limiter, &other], "vendor", policy, Some("account"));
    let acme = Request::new("vendor").key("acme");
    assert!(
        limiter
            .try_acquire(&acme)
            .await
            .expect("answers")
            .is_granted()
    );
    // Taken before the pause is asked for, so the pause ends at least 3 s after it.
    let paused_at = Instant::now();
    let left = other
        .pause("vendor", None, Duration::from_secs(3))
        .await
        .expect("pause");
    assert!(left > Duration::from_secs(1));
    let left = limiter
        .pause("vendor", None, Duration::from_millis(10))
        .await
        .expect("pause");
    assert!(
        left > Duration::from_secs(1),
        "a shorter pause shortened it: {left:?}"
    );
    let denial = denied(limiter.try_acquire(&acme).await.expect("answers"));
    assert_eq!(denial.reason, DenyReason::Paused);
    assert!(denial.retry_after > Duration::from_secs(1));
    let other_key = Request::new("vendor").key("globex");
    assert_eq!(
        denied(limiter.try_acquire(&other_key).await.expect("answers")).reason,
        DenyReason::Paused
    );
    let waited = limiter
        .acquire(&acme.clone().wait(Duration::from_secs(30)))
        .await
        .expect("answers");
    assert!(waited.is_granted());
    assert!(
        paused_at.elapsed() >= Duration::from_millis(2_990),
        "granted {:?} into a 3 s pause",
        paused_at.elapsed()
    );
    // One key alone.
    other
        .pause("vendor", Some("acme"), Duration::from_secs(30))
        .await
        .expect("pause");
    assert!(
        !limiter
            .try_acquire(&acme)
            .await
            .expect("answers")
            .is_granted()
    );
    assert!(
        limiter
            .try_acquire(&other_key)
            .await
            .expect("answers")
            .is_granted()
    );
}

/// An administrator lifts a pause (the limit-wide one, or one key's) through any handle; a
/// pause is cut to the limiter's `pause_max`; a limit removed, or changed to another kind, and
/// made again under its old name starts unpaused.
pub async fn pauses_are_lifted_cut_and_not_inherited(stores: Stores) {
    let (limiter, other) = pair(&stores);
    let policy = rate(100, 60_000, Algorithm::Sliding);
    add(&[&limiter, &other], "vendor", policy, Some("account"));
    add(&[&limiter, &other], "solo", policy, None);
    let acme = Request::new("vendor").key("acme");
    let globex = Request::new("vendor").key("globex");
    let granted = async |limiter: &Limiter, request: &Request<'_>| {
        limiter
            .try_acquire(request)
            .await
            .expect("answers")
            .is_granted()
    };

    limiter
        .pause("vendor", None, Duration::from_secs(600))
        .await
        .expect("pause");
    assert!(!granted(&limiter, &acme).await);
    assert!(other.resume("vendor", None).await.expect("resume"));
    assert!(
        granted(&limiter, &acme).await,
        "lifted through another handle"
    );
    assert!(
        !other.resume("vendor", None).await.expect("resume"),
        "none on"
    );

    other
        .pause("vendor", Some("acme"), Duration::from_secs(600))
        .await
        .expect("pause");
    assert!(!granted(&limiter, &acme).await);
    assert!(granted(&limiter, &globex).await, "one key alone");
    assert!(
        limiter
            .resume("vendor", Some("acme"))
            .await
            .expect("resume")
    );
    assert!(granted(&limiter, &acme).await);
    assert!(
        !limiter
            .resume("vendor", Some("acme"))
            .await
            .expect("resume")
    );
    assert!(
        !limiter
            .resume("vendor", Some("nobody"))
            .await
            .expect("resume")
    );

    // Cut to the limiter's longest pause.
    let short = Limiter::new(
        stores.first.clone(),
        LimiterConfig {
            wait_max: Duration::from_secs(1),
            permit_secret: PermitSecret::random(),
            pause_max: Duration::from_secs(5),
            ..LimiterConfig::default()
        },
    );
    add(&[&short], "solo", policy, None);
    let left = short
        .pause("solo", None, Duration::from_secs(3_600))
        .await
        .expect("pause");
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(5),
        "not cut to pause_max: {left:?}"
    );
    assert!(!granted(&short, &Request::new("solo")).await);
    assert!(short.resume("solo", None).await.expect("resume"));

    // Gone and made again, or made another kind: no pause inherited (a shared store is told
    // by the limiter that saw the change, and may lift it a moment later).
    let solo = Request::new("solo");
    limiter
        .pause("solo", None, Duration::from_secs(600))
        .await
        .expect("pause");
    assert!(limiter.remove_limit("solo"));
    add(&[&limiter], "solo", policy, None);
    eventually_granted(&limiter, &solo, "a limit removed and made again").await;
    limiter
        .pause("solo", None, Duration::from_secs(600))
        .await
        .expect("pause");
    let leases = Policy::concurrency(5, 60_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter], "solo", leases, None);
    let lease = Request::new("solo");
    eventually_granted(&limiter, &lease, "a limit that changed kind").await;
}

/// Ask until granted; fail after a few seconds.
async fn eventually_granted(limiter: &Limiter, request: &Request<'_>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match limiter.try_acquire(request).await.expect("answers") {
            Outcome::Granted(permit) => {
                permit.release().await.expect("release");
                return;
            }
            Outcome::Denied(denied) => assert!(
                Instant::now() < deadline,
                "{what}: still denied, {denied:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A store that counts the denials it answered while a request was queued on `limit` in the
/// limiter watching it: such a denial is the last thing a waiter hears before it sleeps until
/// woken (or until its hint runs out), so after one, only a wake-up grants it soon.
#[derive(Debug)]
struct Watched {
    inner: Arc<dyn Store>,
    limit: &'static str,
    /// Set once the limiter over this store exists; taken at the end (the two hold each other).
    limiter: Mutex<Option<Limiter>>,
    denied_while_queued: AtomicU64,
}

impl Watched {
    fn queued(&self) -> usize {
        self.limiter
            .lock()
            .expect("lock")
            .as_ref()
            .map_or(0, |limiter| limiter.waiting(self.limit))
    }
}

/// Counts denials while a request waits; everything else is the inner store's.
impl Forward for Watched {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        StoreFuture::boxed(async move {
            let queued = self.queued();
            let decision = self.inner.acquire(ask).await?;
            if queued > 0 && !decision.is_granted() {
                self.denied_while_queued
                    .fetch_add(1, AtomicOrdering::SeqCst);
            }
            Ok(decision)
        })
    }
}

/// Wait until `done`, polling the state it reads; fail after a deadline only a lost request
/// would reach.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Wait until `count` requests are queued on `limit` in `limiter` (its waiters gauge).
async fn until_waiting(limiter: &Limiter, limit: &str, count: usize) {
    until(&format!("{count} requests queued on {limit:?}"), || {
        limiter.waiting(limit) >= count
    })
    .await;
    assert_eq!(limiter.waiting(limit), count, "queued on {limit:?}");
}

/// A waiter is woken when another handle gives capacity back, not when its hint runs out.
pub async fn waiters_wake_when_another_handle_releases(stores: Stores) {
    let watched = Arc::new(Watched {
        inner: stores.first.clone(),
        limit: "pool",
        limiter: Mutex::new(None),
        denied_while_queued: AtomicU64::new(0),
    });
    let secret = PermitSecret::random();
    let limiter = limiter(&(watched.clone() as Arc<dyn Store>), secret);
    let other = self::limiter(&stores.second, secret);
    *watched.limiter.lock().expect("lock") = Some(limiter.clone());
    // The lease would expire only after a minute: a waiter granted sooner was woken.
    let policy = Policy::concurrency(1, 60_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter, &other], "pool", policy, None);
    let held = other
        .try_acquire(&Request::new("pool"))
        .await
        .expect("answers")
        .granted()
        .expect("free");
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new("pool").wait(Duration::from_secs(50));
            limiter
                .acquire(&request)
                .await
                .map(|outcome| outcome.is_granted())
        })
    };
    // Queued and told no: from here it sleeps until a wake-up or its one-minute hint.
    until("the waiter is queued and denied", || {
        watched.denied_while_queued.load(AtomicOrdering::SeqCst) > 0
    })
    .await;
    assert_eq!(limiter.waiting("pool"), 1, "one request waits");
    let started = Instant::now();
    held.release().await.expect("release");
    assert!(waiter.await.expect("task").expect("answers"));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the waiter slept out its hint instead of being woken"
    );
    assert_eq!(
        limiter.waiting("pool"),
        0,
        "the granted waiter left the queue"
    );
    watched.limiter.lock().expect("lock").take();
}

/// Waiters are served highest priority first, then in arrival order. The one lease is held
/// until all four are queued (the waiters gauge says so), and each waiter, once granted, notes
/// its turn and releases, so the order depends on nothing but the queue.
pub async fn waiters_are_served_by_priority_then_arrival(stores: Stores) {
    let (limiter, _) = pair(&stores);
    let policy = Policy::concurrency(1, 60_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter], "pool", policy, None);
    let held = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("answers")
        .granted()
        .expect("free");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (queued, (name, priority)) in [
        ("low", Priority::Low),
        ("normal-1", Priority::Normal),
        ("high", Priority::High),
        ("normal-2", Priority::Normal),
    ]
    .into_iter()
    .enumerate()
    {
        let limiter_for_task = limiter.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let request = Request::new("pool")
                .priority(priority)
                .wait(Duration::from_secs(50));
            let outcome = limiter_for_task.acquire(&request).await.expect("answers");
            let permit = outcome
                .granted()
                .unwrap_or_else(|| panic!("{name} waited in vain"));
            order.lock().expect("lock").push(name);
            permit.release().await.expect("release");
        }));
        // It has its place in the queue before the next one arrives.
        until_waiting(&limiter, "pool", queued + 1).await;
    }
    held.release().await.expect("release");
    for task in tasks {
        task.await.expect("task");
    }
    let order = order.lock().expect("lock").clone();
    assert_eq!(order, ["high", "normal-1", "normal-2", "low"]);
}

/// Tasks acquiring and committing at random never put more than the limit in any window, as
/// counted from the grants' decision times by this test, each committed grant counting the
/// units its caller said it used.
pub async fn random_traffic_never_exceeds_the_limit(stores: Stores) {
    let (limiter, other) = pair(&stores);
    for (name, algorithm) in [("sliding", Algorithm::Sliding), ("fixed", Algorithm::Fixed)] {
        let limit = 5;
        let period_us = 200 * MS;
        add(&[&limiter, &other], name, rate(limit, 200, algorithm), None);
        // (decided_at_us, units the caller may have spent): the cost, or once committed what
        // it said it used. Never what the store says it refunded: a store that gives back too
        // much frees capacity for grants that this count then shows past the limit.
        let log = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
        let end = Instant::now() + Duration::from_millis(2_500);
        let mut tasks = Vec::new();
        for task in 0..8u64 {
            let limiter = if task % 2 == 0 {
                limiter.clone()
            } else {
                other.clone()
            };
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut state = task.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut next = move || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state
                };
                while Instant::now() < end {
                    let cost = 1 + next() % 3;
                    let request = Request::new(name)
                        .cost(cost)
                        .wait(Duration::from_millis(next() % 300));
                    if let Some(permit) =
                        limiter.acquire(&request).await.expect("answers").granted()
                    {
                        let used = next() % (cost + 1);
                        let index = {
                            let mut log = log.lock().expect("log");
                            log.push((permit.decided_at_us(), cost));
                            log.len() - 1
                        };
                        if next() % 2 == 0 {
                            let committed = permit.commit(used).await.expect("commit");
                            assert!(
                                committed.refunded <= cost - used,
                                "{name}: {} refunded for a cost of {cost} of which {used} used",
                                committed.refunded
                            );
                            log.lock().expect("log")[index].1 = used;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(next() % 20)).await;
                }
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
        let mut log = log.lock().expect("log").clone();
        assert!(!log.is_empty(), "{name}: nothing was granted");
        log.sort_unstable();
        match algorithm {
            Algorithm::Fixed => {
                let mut per_window = BTreeMap::new();
                for (at, units) in &log {
                    *per_window.entry(at / period_us).or_insert(0) += units;
                }
                for (window, units) in per_window {
                    assert!(
                        units <= limit,
                        "{name}: window {window} has {units} > {limit}"
                    );
                }
            }
            _ => {
                for (start, (at, _)) in log.iter().enumerate() {
                    let units: u64 = log[start..]
                        .iter()
                        .take_while(|(later, _)| *later < at + period_us)
                        .map(|(_, units)| units)
                        .sum();
                    assert!(
                        units <= limit,
                        "{name}: {units} units in [{at}, +period) > {limit}"
                    );
                }
            }
        }
    }
}

/// The shared call counter (docs/models.md) on the wall clock: a bulk caller and three
/// priority callers on N in 5..=7 per period; never an overshoot, and every priority call is
/// served.
pub async fn bulk_and_priority_callers_never_overshoot(stores: Stores) {
    let (limiter, other) = pair(&stores);
    for limit in 5..=7u64 {
        let name = format!("vendor-quota-{limit}");
        let period_us = 100 * MS;
        let policy = Policy::rate(
            limit,
            period_us,
            0,
            Algorithm::Sliding,
            Reserve { high: 2, normal: 0 },
        )
        .expect("valid");
        add(&[&limiter, &other], &name, policy, None);
        let log = Arc::new(Mutex::new(Vec::<u64>::new()));
        let end = Instant::now() + Duration::from_millis(2_000);
        let bulk = {
            let limiter = limiter.clone();
            let log = log.clone();
            let name = name.clone();
            tokio::spawn(async move {
                while Instant::now() < end {
                    let request = Request::new(&name)
                        .priority(Priority::Low)
                        .wait(Duration::from_secs(1));
                    if let Some(permit) =
                        limiter.acquire(&request).await.expect("answers").granted()
                    {
                        log.lock().expect("log").push(permit.decided_at_us());
                        permit.commit(1).await.expect("commit");
                    }
                }
            })
        };
        let mut callers = Vec::new();
        for caller in 0..3u64 {
            let limiter = other.clone();
            let log = log.clone();
            let name = name.clone();
            callers.push(tokio::spawn(async move {
                let mut calls = 0;
                while Instant::now() < end {
                    tokio::time::sleep(Duration::from_millis(50 + 37 * caller)).await;
                    let cost = 1 + (calls + caller) % 2;
                    let request = Request::new(&name)
                        .priority(Priority::High)
                        .cost(cost)
                        .wait(Duration::from_secs(10));
                    let permit = limiter
                        .acquire(&request)
                        .await
                        .expect("answers")
                        .granted()
                        .expect("a priority call is served");
                    {
                        let mut log = log.lock().expect("log");
                        for _ in 0..cost {
                            log.push(permit.decided_at_us());
                        }
                    }
                    calls += 1;
                    permit.commit(cost).await.expect("commit");
                }
                calls
            }));
        }
        bulk.await.expect("bulk");
        for caller in callers {
            assert!(caller.await.expect("caller") > 0);
        }
        let mut calls = log.lock().expect("log").clone();
        calls.sort_unstable();
        let mut start = 0;
        for end in 0..calls.len() {
            while calls[end] - calls[start] >= period_us {
                start += 1;
            }
            let count = (end - start + 1) as u64;
            assert!(count <= limit, "N={limit}: {count} calls within one period");
        }
    }
}

/// Bad input is refused with the field named, whatever the store.
pub async fn bad_input_is_refused_with_the_field_named(stores: Stores) {
    let (limiter, _) = pair(&stores);
    add(
        &[&limiter],
        "per-user",
        rate(10, 1_000, Algorithm::Sliding),
        Some("user"),
    );
    add(
        &[&limiter],
        "flat",
        rate(10, 1_000, Algorithm::Sliding),
        None,
    );
    let field = |result: Result<Outcome, Error>| match result {
        Err(Error::InvalidRequest { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        field(limiter.try_acquire(&Request::new("per-user")).await),
        "key"
    );
    let long_key = "k".repeat(tollgate::KEY_BYTES_MAX + 1);
    let long = Request::new("per-user").key(&long_key);
    assert_eq!(field(limiter.try_acquire(&long).await), "key");
    assert_eq!(
        field(limiter.try_acquire(&Request::new("flat").cost(0)).await),
        "cost"
    );
    assert!(matches!(
        limiter.try_acquire(&Request::new("flat").cost(11)).await,
        Err(Error::Cost { .. })
    ));
    assert!(matches!(
        limiter.try_acquire(&Request::new("missing")).await,
        Err(Error::UnknownLimit { .. })
    ));
    assert!(matches!(
        limiter.commit("00", 0).await,
        Err(Error::InvalidRequest {
            field: "permit",
            ..
        })
    ));
}

/// A period no case outlives: units granted under it still count when the case ends, whatever
/// the store's clock reads, so a case that counts units need not race the clock.
const HOUR_MS: u64 = 3_600_000;

/// `refundable(false)` changes what a store records, never what it counts: the same requests on
/// two equal limits, one refundable and one not, are granted alike and denied at the same point;
/// committing the unrefundable permit gives nothing back (by id, the store has no reservation:
/// `Gone`), and a lease in it is released as always. Sliding and GCRA only: a fixed window is
/// aligned to the store's clock, so even an hour's could roll over mid-case.
pub async fn unrefundable_grants_count_the_same_and_refund_nothing(stores: Stores) {
    let (limiter, other) = pair(&stores);
    let lease = Policy::concurrency(1, 30_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter, &other], "pool", lease, None);
    for (name, algorithm) in [
        ("sliding", Algorithm::Sliding),
        ("gcra", Algorithm::Gcra { burst: 4 }),
    ] {
        let refundable = format!("{name}-refundable");
        let unrefundable = format!("{name}-unrefundable");
        let with_lease = format!("{name}-with-lease");
        for limit in [&refundable, &unrefundable, &with_lease] {
            add(
                &[&limiter, &other],
                limit,
                rate(4, HOUR_MS, algorithm),
                None,
            );
        }
        let mut refundable_permits = Vec::new();
        let mut unrefundable_permits = Vec::new();
        for cost in [2, 1, 1] {
            let kept = limiter
                .try_acquire(&Request::new(&refundable).cost(cost))
                .await
                .expect("answers")
                .granted()
                .expect("room on the refundable limit");
            let unrefundable_request = Request::new(&unrefundable).cost(cost).refundable(false);
            let not_kept = limiter
                .try_acquire(&unrefundable_request)
                .await
                .expect("answers")
                .granted()
                .unwrap_or_else(|| panic!("{name}: denied where a refundable grant was not"));
            assert_eq!(
                not_kept.limits()[0].remaining,
                kept.limits()[0].remaining,
                "{name}: cost {cost} left a different remainder"
            );
            refundable_permits.push(kept);
            unrefundable_permits.push(not_kept);
        }
        for (limit, flag) in [(&refundable, true), (&unrefundable, false)] {
            let request = Request::new(limit).refundable(flag);
            let denial = denied(limiter.try_acquire(&request).await.expect("answers"));
            assert_eq!(denial.reason, DenyReason::Capacity, "{limit}");
            assert_eq!(denial.limits[0].remaining, 0, "{limit}");
            assert!(!denial.retry_after.is_zero(), "{limit}: no retry hint");
        }
        // The newest grants (the only ones GCRA can take back exactly), committed unused.
        let newest = refundable_permits.pop().expect("three permits");
        assert_eq!(newest.commit(0).await.expect("commit").refunded, 1);
        let newest = unrefundable_permits.pop().expect("three permits");
        let committed = newest.commit(0).await.expect("commit");
        assert_eq!(
            (committed.refunded, committed.released),
            (0, 0),
            "{name}: an unrefundable permit gave units back"
        );
        // By id, through the other handle: nothing was recorded, so nothing is given back.
        let id = unrefundable_permits.pop().expect("two permits").detach();
        let by_id = other.commit(id.as_str(), 0).await;
        assert!(
            matches!(
                by_id,
                Err(Error::Permit {
                    source: PermitError::Gone
                })
            ),
            "{name}: {by_id:?}"
        );
        let oldest = unrefundable_permits.pop().expect("one permit");
        assert_eq!(oldest.commit(1).await.expect("commit").refunded, 0);
        assert!(
            limiter
                .try_acquire(&Request::new(&refundable))
                .await
                .expect("answers")
                .is_granted(),
            "{name}: the refunded unit did not come back"
        );
        assert!(
            !limiter
                .try_acquire(&Request::new(&unrefundable).refundable(false))
                .await
                .expect("answers")
                .is_granted(),
            "{name}: committing unrefundable permits freed units"
        );
        // A lease in an unrefundable request is a lease: held, then released by the commit.
        let both = Request::all(&[with_lease.as_str(), "pool"]).refundable(false);
        let permit = limiter
            .try_acquire(&both)
            .await
            .expect("answers")
            .granted()
            .expect("room on both");
        assert!(
            !other
                .try_acquire(&Request::new("pool"))
                .await
                .expect("answers")
                .is_granted(),
            "{name}: the lease was not held"
        );
        let committed = permit.commit(0).await.expect("commit");
        assert_eq!((committed.refunded, committed.released), (0, 1), "{name}");
        other
            .try_acquire(&Request::new("pool"))
            .await
            .expect("answers")
            .granted()
            .expect("the lease was released")
            .release()
            .await
            .expect("release");
        let Check::Allowed(statuses) = limiter
            .check(&Request::new(&with_lease))
            .await
            .expect("answers")
        else {
            panic!("{name}: no room left after one unit");
        };
        // Four, less the unrefundable grant's unit, less this check's own.
        assert_eq!(statuses[0].remaining, 2, "{name}");
    }
}

/// `Limiter::check` is a grant without a permit: it counts units on the same counter as
/// `acquire`, denies past the limit with a retry hint (waiting or not), and refuses a
/// concurrency limit (naming `limits`: its lease would need a permit to be released), taking
/// nothing then.
pub async fn check_counts_rate_units_and_refuses_leases(stores: Stores) {
    let (limiter, other) = pair(&stores);
    add(
        &[&limiter, &other],
        "vendor",
        rate(4, HOUR_MS, Algorithm::Sliding),
        None,
    );
    let lease = Policy::concurrency(2, 30_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter, &other], "pool", lease, None);
    let field = |result: Result<Check, Error>| match result {
        Err(Error::InvalidRequest { field, .. }) => field,
        answer => panic!("expected a refusal, got {answer:?}"),
    };
    assert_eq!(field(limiter.check(&Request::new("pool")).await), "limits");
    let both = Request::all(&["vendor", "pool"]);
    assert_eq!(field(limiter.check(&both).await), "limits");
    let waiting = Request::new("pool").wait(Duration::from_secs(5));
    assert_eq!(field(limiter.check(&waiting).await), "limits");
    // The refusals took nothing: both slots are free, and (below) all four units.
    limiter
        .try_acquire(&Request::new("pool").cost(2))
        .await
        .expect("answers")
        .granted()
        .expect("a refused check held a slot")
        .release()
        .await
        .expect("release");

    let remaining = |check: Check| match check {
        Check::Allowed(statuses) => statuses[0].remaining,
        Check::Denied(denied) => panic!("expected room, got {denied:?}"),
    };
    let refusal = |check: Check| match check {
        Check::Denied(denied) => denied,
        Check::Allowed(statuses) => panic!("expected a denial, got {statuses:?}"),
    };
    let permit = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("answers")
        .granted()
        .expect("room");
    assert_eq!(permit.limits()[0].remaining, 3);
    let two = Request::new("vendor").cost(2);
    assert_eq!(remaining(other.check(&two).await.expect("answers")), 1);
    let denial = refusal(limiter.check(&two).await.expect("answers"));
    assert_eq!(denial.reason, DenyReason::Capacity);
    assert_eq!(denial.limits[0].name, "vendor");
    assert_eq!(denial.limits[0].remaining, 1);
    let one = Request::new("vendor");
    assert_eq!(remaining(limiter.check(&one).await.expect("answers")), 0);
    let denial = refusal(other.check(&one).await.expect("answers"));
    assert_eq!(denial.reason, DenyReason::Capacity);
    assert_eq!(denial.limits[0].remaining, 0);
    assert!(
        !denial.retry_after.is_zero() && denial.retry_after <= Duration::from_millis(HOUR_MS),
        "retry after {:?}",
        denial.retry_after
    );
    // Checks and acquires count on one counter.
    let acquired = limiter.try_acquire(&one).await.expect("answers");
    assert!(!acquired.is_granted(), "granted past four checked units");
    // The acquire's unit comes back on commit; what the checks counted stays counted.
    assert_eq!(permit.commit(0).await.expect("commit").refunded, 1);
    assert_eq!(remaining(limiter.check(&one).await.expect("answers")), 0);
    assert!(!limiter.check(&one).await.expect("answers").is_allowed());
    // Waiting changes nothing while the units count (no time is asserted).
    let waiting = one.clone().wait(Duration::from_millis(50));
    let denial = refusal(other.check(&waiting).await.expect("answers"));
    assert_eq!(denial.limits[0].remaining, 0);
    let handle = limiter.handle("vendor").expect("a handle");
    let from_handle = handle
        .check(None, 1, Priority::Normal)
        .await
        .expect("answers");
    assert!(!from_handle.is_allowed(), "{from_handle:?}");
}

/// `usage` reads what a counter holds, through either handle, and counts nothing: the units
/// granted (for every algorithm), leases held until released, a pause of the limit, nothing on
/// a counter never used; and every unit it saw stays grantable after it looked.
pub async fn usage_shows_what_is_counted_and_takes_nothing(stores: Stores) {
    let (limiter, other) = pair(&stores);
    let usage = async |limiter: &Limiter, name: &str, key: Option<&str>| {
        limiter.usage(name, key).await.expect("usage")
    };
    for (name, algorithm) in [
        ("sliding", Algorithm::Sliding),
        ("fixed", Algorithm::Fixed),
        ("gcra", Algorithm::Gcra { burst: 5 }),
    ] {
        add(&[&limiter, &other], name, rate(5, HOUR_MS, algorithm), None);
        assert_eq!(usage(&other, name, None).await.used, 0, "{name}");
        let permit = limiter
            .try_acquire(&Request::new(name).cost(3))
            .await
            .expect("answers")
            .granted()
            .expect("room");
        for _ in 0..2 {
            let seen = usage(&other, name, None).await;
            assert_eq!(seen.used, 3, "{name}: {seen:?}");
            assert!(
                seen.reset_after_us > 0 && seen.reset_after_us <= HOUR_MS * MS,
                "{name}: {seen:?}"
            );
            assert_eq!(seen.paused_for_us, 0, "{name}: {seen:?}");
        }
        // Looking took nothing: the other two units are still there.
        let rest = limiter
            .try_acquire(&Request::new(name).cost(2))
            .await
            .expect("answers");
        assert!(rest.is_granted(), "{name}: usage took units");
        assert_eq!(usage(&limiter, name, None).await.used, 5, "{name}");
        assert_eq!(permit.commit(3).await.expect("commit").refunded, 0);
    }

    let lease = Policy::concurrency(2, 30_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter, &other], "pool", lease, None);
    let held = limiter
        .try_acquire(&Request::new("pool"))
        .await
        .expect("answers")
        .granted()
        .expect("a slot");
    let seen = usage(&other, "pool", None).await;
    assert_eq!(seen.used, 1, "{seen:?}");
    assert!(
        seen.reset_after_us > 0 && seen.reset_after_us <= 30_000 * MS,
        "{seen:?}"
    );
    held.release().await.expect("release");
    assert_eq!(usage(&other, "pool", None).await.used, 0);

    add(
        &[&limiter, &other],
        "per-user",
        rate(5, HOUR_MS, Algorithm::Sliding),
        Some("user"),
    );
    let _alice = limiter
        .try_acquire(&Request::new("per-user").key("alice"))
        .await
        .expect("answers")
        .granted()
        .expect("room");
    assert_eq!(usage(&other, "per-user", Some("alice")).await.used, 1);
    assert_eq!(usage(&other, "per-user", Some("bob")).await.used, 0);
    match other.usage("per-user", None).await {
        Err(Error::InvalidRequest { field: "key", .. }) => {}
        answer => panic!("a per-key limit without its key: {answer:?}"),
    }

    limiter
        .pause("sliding", None, Duration::from_secs(600))
        .await
        .expect("pause");
    let seen = usage(&other, "sliding", None).await;
    assert!(
        seen.paused_for_us > 0 && seen.paused_for_us <= 600_000 * MS,
        "{seen:?}"
    );
    assert_eq!(seen.used, 5, "{seen:?}");
    match other.usage("nowhere", None).await {
        Err(Error::UnknownLimit { .. }) => {}
        answer => panic!("an unknown limit: {answer:?}"),
    }
}

/// A reset forgets one counter in every process sharing the store, and nothing else: another
/// key of the limit, and other limits, count on; a reset counter grants again from nothing,
/// its own pause lifted, and a permit granted before it refunds nothing. A concurrency limit
/// is refused, and a per-key limit needs its key.
pub async fn a_reset_forgets_one_counter_and_nothing_else(stores: Stores) {
    let (limiter, other) = pair(&stores);
    for (name, algorithm) in [
        ("sliding", Algorithm::Sliding),
        ("fixed", Algorithm::Fixed),
        ("gcra", Algorithm::Gcra { burst: 3 }),
    ] {
        add(
            &[&limiter, &other],
            name,
            rate(3, HOUR_MS, algorithm),
            Some("user"),
        );
        let mut before = None;
        for user in ["alice", "bob"] {
            for _ in 0..3 {
                let permit = limiter
                    .try_acquire(&Request::new(name).key(user))
                    .await
                    .expect("answers")
                    .granted()
                    .expect("room");
                before.get_or_insert(permit);
            }
            let outcome = limiter
                .try_acquire(&Request::new(name).key(user))
                .await
                .expect("answers");
            assert!(!outcome.is_granted(), "{name}: {user} past the limit");
        }
        limiter
            .pause(name, Some("alice"), Duration::from_secs(600))
            .await
            .expect("pause");
        assert!(
            other.reset(name, Some("alice")).await.expect("reset"),
            "{name}: the counter was there"
        );
        for _ in 0..3 {
            let outcome = limiter
                .try_acquire(&Request::new(name).key("alice"))
                .await
                .expect("answers");
            assert!(outcome.is_granted(), "{name}: alice after her reset");
        }
        let outcome = limiter
            .try_acquire(&Request::new(name).key("alice"))
            .await
            .expect("answers");
        assert!(!outcome.is_granted(), "{name}: alice past the limit again");
        let outcome = limiter
            .try_acquire(&Request::new(name).key("bob"))
            .await
            .expect("answers");
        assert!(!outcome.is_granted(), "{name}: bob was not reset");
        if let Some(permit) = before {
            // Granted before the reset: nothing of it is left to refund.
            let _ = permit.commit(0).await;
            let outcome = limiter
                .try_acquire(&Request::new(name).key("alice"))
                .await
                .expect("answers");
            assert!(
                !outcome.is_granted(),
                "{name}: a refund from before the reset"
            );
        }
        assert!(
            !other.reset(name, Some("carol")).await.expect("reset"),
            "{name}: carol had no counter"
        );
        match other.reset(name, None).await {
            Err(Error::InvalidRequest { field: "key", .. }) => {}
            answer => panic!("{name}: a per-key limit without its key: {answer:?}"),
        }
    }
    let lease = Policy::concurrency(2, 30_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter, &other], "pool", lease, None);
    match other.reset("pool", None).await {
        Err(Error::InvalidRequest { field: "limit", .. }) => {}
        answer => panic!("a concurrency limit: {answer:?}"),
    }
    match other.reset("nowhere", None).await {
        Err(Error::UnknownLimit { .. }) => {}
        answer => panic!("an unknown limit: {answer:?}"),
    }
}

/// A request with a cost per limit takes each limit's own cost, all or none, and its commit
/// gives back what each limit did not use, by name; a commit that names a limit wrongly settles
/// nothing. Judged through the other handle's usage, not the permit's answer.
pub async fn costs_are_taken_per_limit_all_or_nothing(stores: Stores) {
    let (limiter, other) = pair(&stores);
    let hour = rate(100, HOUR_MS, Algorithm::Sliding);
    add(
        &[&limiter, &other],
        "calls",
        rate(10, HOUR_MS, Algorithm::Sliding),
        None,
    );
    add(&[&limiter, &other], "tokens", hour, None);
    let used = |limit: &'static str| {
        let other = &other;
        async move { other.usage(limit, None).await.expect("usage").used }
    };
    let both = Request::all(&["calls", "tokens"]);
    let permit = limiter
        .try_acquire(&both.clone().costs(&[1, 60]))
        .await
        .expect("answers")
        .granted()
        .expect("room on both");
    assert_eq!((used("calls").await, used("tokens").await), (1, 60));
    let denial = denied(
        limiter
            .try_acquire(&both.clone().costs(&[1, 41]))
            .await
            .expect("answers"),
    );
    assert_eq!(denial.reason, DenyReason::Capacity);
    assert_eq!(
        (used("calls").await, used("tokens").await),
        (1, 60),
        "a denied request took from one limit"
    );
    let id = permit.detach();
    match other
        .commit_used(&id.to_string(), Used::Each(&[("calls", 1), ("nowhere", 0)]))
        .await
    {
        Err(Error::InvalidRequest { field: "used", .. }) => {}
        answer => panic!("a commit naming a limit not in the permit: {answer:?}"),
    }
    match other
        .commit_used(&id.to_string(), Used::Each(&[("tokens", 10)]))
        .await
    {
        Err(Error::InvalidRequest { field: "used", .. }) => {}
        answer => panic!("a commit leaving a rate limit out: {answer:?}"),
    }
    assert_eq!(
        (used("calls").await, used("tokens").await),
        (1, 60),
        "a refused commit gave something back"
    );
    let committed = other
        .commit_used(&id.to_string(), Used::Each(&[("tokens", 25), ("calls", 1)]))
        .await
        .expect("commit");
    assert_eq!(committed.refunded, 35);
    assert_eq!((used("calls").await, used("tokens").await), (1, 25));
    match limiter.try_acquire(&both.clone().costs(&[1])).await {
        Err(Error::InvalidRequest { field: "costs", .. }) => {}
        answer => panic!("one cost for two limits: {answer:?}"),
    }
    match limiter.try_acquire(&both.costs(&[1, 0])).await {
        Err(Error::InvalidRequest { field: "costs", .. }) => {}
        answer => panic!("a cost of 0: {answer:?}"),
    }
}

/// A charge counts units past the limit, in every process, up to one capacity past it, and
/// every later grant waits it out; leases cannot be charged.
pub async fn charges_count_past_the_limit_and_are_paid_first(stores: Stores) {
    let (limiter, other) = pair(&stores);
    for (name, algorithm) in [
        ("sliding", Algorithm::Sliding),
        ("fixed", Algorithm::Fixed),
        ("gcra", Algorithm::Gcra { burst: 10 }),
    ] {
        add(
            &[&limiter, &other],
            name,
            rate(10, HOUR_MS, algorithm),
            Some("user"),
        );
        let _spent = limiter
            .try_acquire(&Request::new(name).key("alice").cost(8))
            .await
            .expect("answers")
            .granted()
            .expect("room");
        let charged = other
            .charge(&Request::new(name).key("alice").cost(5))
            .await
            .expect("charge");
        assert_eq!(charged.len(), 1);
        assert_eq!(charged[0].charged, 5, "{name}");
        assert_eq!(charged[0].usage.used, 13, "{name}");
        let denial = denied(
            limiter
                .try_acquire(&Request::new(name).key("alice").priority(Priority::High))
                .await
                .expect("answers"),
        );
        assert_eq!(denial.reason, DenyReason::Capacity, "{name}");
        let charged = other
            .charge(&Request::new(name).key("alice").cost(1_000))
            .await
            .expect("charge");
        assert_eq!(
            charged[0].charged, 7,
            "{name}: one capacity past the limit at most"
        );
        assert_eq!(
            limiter
                .usage(name, Some("alice"))
                .await
                .expect("usage")
                .used,
            20,
            "{name}"
        );
        let fresh = other
            .charge(&Request::new(name).key("bob").cost(3))
            .await
            .expect("a charge on a counter never used");
        assert_eq!(fresh[0].charged, 3, "{name}");
        let permit = limiter
            .try_acquire(&Request::new(name).key("bob").cost(7))
            .await
            .expect("answers");
        assert!(permit.is_granted(), "{name}: bob's debt leaves 7");
    }
    let lease = Policy::concurrency(2, 30_000 * MS, Reserve::default()).expect("valid");
    add(&[&limiter, &other], "pool", lease, None);
    match other.charge(&Request::new("pool")).await {
        Err(Error::InvalidRequest {
            field: "limits", ..
        }) => {}
        answer => panic!("a concurrency limit charged: {answer:?}"),
    }
}

/// One `#[tokio::test]` per conformance case, each given fresh stores by `$factory`, an
/// `async fn(&'static str) -> Option<Stores>` (None: skipped, having said why).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:path) => {
        $crate::conformance_tests!(@each $factory,
            rate_limits_grant_to_the_limit_and_hint_honestly,
            several_limits_are_all_or_nothing,
            commit_refunds_unused_units_once,
            leases_fence_renew_and_release_once,
            pauses_stop_grants_and_only_extend,
            pauses_are_lifted_cut_and_not_inherited,
            waiters_wake_when_another_handle_releases,
            waiters_are_served_by_priority_then_arrival,
            random_traffic_never_exceeds_the_limit,
            bulk_and_priority_callers_never_overshoot,
            bad_input_is_refused_with_the_field_named,
            unrefundable_grants_count_the_same_and_refund_nothing,
            check_counts_rate_units_and_refuses_leases,
            usage_shows_what_is_counted_and_takes_nothing,
            a_reset_forgets_one_counter_and_nothing_else,
            costs_are_taken_per_limit_all_or_nothing,
            charges_count_past_the_limit_and_are_paid_first,
        );
    };
    (@each $factory:path, $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if let Some(stores) = $factory(stringify!($name)).await {
                    $crate::$name(stores).await;
                }
            }
        )*
    };
}
