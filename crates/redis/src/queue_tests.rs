//! The queue across the fleet, through two limiters on two stores of one namespace (two
//! processes, as far as Redis can tell): a lower priority in one leaves a higher priority
//! waiting in the other the units it waits for; a waiter cancelled gives its place up at once;
//! a waiter whose process died holds no one back past its place's expiry. Judged on Redis's
//! clock (every decision's `now`), never on this test's timing.
//!
//! Needs `TOLLGATE_TEST_REDIS`; skipped (loudly) without it.

use std::sync::Arc;
use std::time::Duration;

use tollgate::store::{Ask, CounterId, Store, Take, WaiterId};
use tollgate::{DenyReason, Limit, Limiter, LimiterConfig, Outcome, PermitSecret, Policy};
use tollgate::{Priority, Request, Reserve};

use crate::{RedisStore, RedisStoreConfig};

fn redis_url(test: &str) -> Option<String> {
    match std::env::var("TOLLGATE_TEST_REDIS") {
        Ok(url) => Some(url),
        Err(_) => {
            tollgate::conformance::skipped(&format!(
                "{test}: TOLLGATE_TEST_REDIS is unset, so the queue across processes was not tried"
            ));
            None
        }
    }
}

/// Two stores on one fresh namespace, places living `place_ttl_us`.
async fn two_processes(url: &str, test: &str, place_ttl_us: u64) -> (RedisStore, RedisStore) {
    let namespace = format!("queue-{test}-{}", std::process::id());
    let connect = || async {
        let mut store = RedisStore::connect(RedisStoreConfig {
            url: url.to_owned(),
            namespace: namespace.clone(),
            fail_open: false,
            allow_eviction: false,
            module: crate::Module::Auto,
            timeout: Duration::from_secs(5),
            keys_per_limit_max: 1_000,
        })
        .await
        .expect("connect to Redis");
        store.place_ttl_us = place_ttl_us;
        store
    };
    let first = connect().await;
    let _ = first.begin_new_namespace().await.expect("a new namespace");
    (first, connect().await)
}

fn limiter(store: Arc<RedisStore>, policy: Policy) -> Limiter {
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            ..LimiterConfig::default()
        },
    );
    limiter.set_limit(Limit::new("pool", policy, None).expect("a limit"));
    limiter
}

fn pool() -> Policy {
    Policy::concurrency(1, 60_000_000, Reserve::default()).expect("a policy")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The pool's one lease, taken at normal priority: it must be free.
async fn hold(limiter: &Limiter) -> tollgate::Permit {
    let answer = limiter.try_acquire(&Request::new("pool")).await;
    answer
        .expect("answers")
        .granted()
        .expect("the pool is free")
}

/// A high request on the pool, waiting up to a minute, in a task of its own.
fn wait_high(limiter: &Limiter) -> tokio::task::JoinHandle<tollgate::Result<Outcome>> {
    let limiter = limiter.clone();
    tokio::spawn(async move {
        let request = Request::new("pool")
            .priority(Priority::High)
            .wait(Duration::from_secs(60));
        limiter.acquire(&request).await
    })
}

/// Until `limiter` has a request waiting on `pool` (it registered, or is about to).
async fn until_waiting(limiter: &Limiter) {
    for _ in 0..3_000 {
        if limiter.waiting("pool") > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the high request never queued");
}

/// The places `store` holds in the queue of the pool's counter.
async fn places(store: &RedisStore) -> Vec<tollgate_redis_protocol::queue::Place> {
    let counter = CounterId {
        limit: "pool",
        key: None,
    };
    let key = store
        .keys
        .counter_queue(store.keys.counter_slot(counter), counter);
    let raw: Option<Vec<u8>> = store
        .caller
        .backend
        .query(&redis::cmd("GET").arg(&key).clone())
        .await
        .ok()
        .and_then(|value| redis::from_redis_value(value).ok());
    tollgate_redis_protocol::queue::decode(raw.as_deref().unwrap_or_default())
}

#[test]
fn a_lower_priority_elsewhere_leaves_a_waiting_higher_one_the_unit() {
    let Some(url) = redis_url("a_lower_priority_elsewhere_leaves_a_waiting_higher_one_the_unit")
    else {
        return;
    };
    runtime().block_on(async {
        // Places that would outlive the test: only a grant or a leave may end them.
        let (one, two) = two_processes(&url, "lower", 600_000_000).await;
        let two = Arc::new(two);
        let bulk = limiter(Arc::new(one), pool());
        let interactive = limiter(two.clone(), pool());
        let policy = pool();
        let takes = [Take {
            counter: CounterId {
                limit: "pool",
                key: None,
            },
            policy: &policy,
        }];
        let high = WaiterId::new(5).expect("an id");
        let low = Request::new("pool").priority(Priority::Low);

        // A high request in the other process waits (it asked while the pool was held, and
        // will ask again when it is woken): the unit freed is kept for it.
        let held = hold(&bulk).await;
        let asked = two.acquire(Ask::new(&takes, 1, Priority::High).waiter(high));
        assert!(!asked.await.expect("answers").is_granted());
        held.release().await.expect("release");
        for _ in 0..3 {
            match bulk.try_acquire(&low).await.expect("answers") {
                Outcome::Denied(denied) => assert_eq!(denied.reason, DenyReason::Queued),
                Outcome::Granted(_) => panic!("a low request took the unit a high one waits for"),
            }
        }
        let asked = two.acquire(Ask::new(&takes, 1, Priority::High).waiter(high));
        let decision = asked.await.expect("answers");
        assert!(decision.is_granted(), "the high waiter is served");
        assert!(
            places(&two).await.is_empty(),
            "a grant takes its place away"
        );
        let seq = match decision.outcomes()[0] {
            tollgate::store::CounterOutcome::Granted(grant) => grant.seq,
            other => panic!("{other:?}"),
        };
        two.commit(takes[0], seq, 0).await.expect("release");

        // The same through the limiter's waiting: its place is in the store while it waits,
        // and whichever of the two asks first once the pool is free, the low request is not
        // served before the high one.
        let held = hold(&bulk).await;
        let waiting = wait_high(&interactive);
        let mut stood = false;
        for _ in 0..3_000 {
            if places(&two).await.len() == 1 {
                stood = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            stood,
            "a request waiting in a limiter has no place in the store"
        );
        held.release().await.expect("release");
        if let Outcome::Granted(_) = bulk.try_acquire(&low).await.expect("answers") {
            panic!("a low request took the unit a high one waits for");
        }
        let granted = waiting.await.expect("the waiter ran").expect("answers");
        let permit = granted.granted().expect("the high request is granted");
        permit.release().await.expect("release");
        let low_waits = low.wait(Duration::from_secs(30));
        let permit = bulk.acquire(&low_waits).await.expect("answers").granted();
        assert!(permit.is_some(), "the low request was never served");
    });
}

#[test]
fn a_cancelled_waiter_gives_its_place_up_at_once() {
    let Some(url) = redis_url("a_cancelled_waiter_gives_its_place_up_at_once") else {
        return;
    };
    runtime().block_on(async {
        let (one, two) = two_processes(&url, "cancel", 600_000_000).await;
        let bulk = limiter(Arc::new(one), pool());
        let interactive = limiter(Arc::new(two), pool());
        let held = hold(&bulk).await;
        let waiting = wait_high(&interactive);
        until_waiting(&interactive).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        waiting.abort();
        let _ = waiting.await;
        held.release().await.expect("release");
        // The place (which would live ten minutes) went with the cancelled request: the low
        // request is served long before it could have expired.
        let low = Request::new("pool")
            .priority(Priority::Low)
            .wait(Duration::from_secs(30));
        let permit = bulk.acquire(&low).await.expect("answers").granted();
        assert!(permit.is_some(), "a cancelled waiter kept its place");
    });
}

#[test]
fn a_dead_waiter_holds_no_one_back_past_its_place_s_expiry() {
    let Some(url) = redis_url("a_dead_waiter_holds_no_one_back_past_its_place_s_expiry") else {
        return;
    };
    runtime().block_on(async {
        let ttl_us = 400_000;
        let (one, two) = two_processes(&url, "dead", ttl_us).await;
        let policy = pool();
        let counter = CounterId {
            limit: "pool",
            key: None,
        };
        let takes = [Take {
            counter,
            policy: &policy,
        }];
        // Another process's high request asks, as a waiter does, while the pool is held, and
        // is never heard of again (its process died): its place stays until it expires.
        let bulk = limiter(Arc::new(one), policy);
        let held = hold(&bulk).await;
        let dead = two
            .acquire(Ask::new(&takes, 1, Priority::High).waiter(WaiterId::new(99).expect("an id")))
            .await
            .expect("answers");
        assert!(!dead.is_granted());
        let stood_at_us = dead.now_us;
        held.release().await.expect("release");
        let low = Request::new("pool").priority(Priority::Low);
        let mut denied_queued = 0;
        let granted_at_us = loop {
            match bulk.try_acquire(&low).await.expect("answers") {
                Outcome::Granted(permit) => break permit.decided_at_us(),
                Outcome::Denied(denied) => {
                    assert_eq!(denied.reason, DenyReason::Queued, "{denied:?}");
                    denied_queued += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            denied_queued > 0,
            "the dead waiter's place held nobody back"
        );
        // Held back exactly until the place expired, on Redis's clock: never granted before.
        assert!(
            granted_at_us >= stood_at_us + ttl_us,
            "granted at {granted_at_us}, before the place expired at {}",
            stood_at_us + ttl_us
        );
    });
}

/// What waiting requests can make Redis hold for one counter: at most `PLACES_MAX` places,
/// however many wait, and the best by rank (a high request still gets in when it is full).
#[test]
fn a_counter_s_queue_keeps_its_best_places_and_no_more() {
    let Some(url) = redis_url("a_counter_s_queue_keeps_its_best_places_and_no_more") else {
        return;
    };
    runtime().block_on(async {
        let (one, _) = two_processes(&url, "full", 600_000_000).await;
        let one = Arc::new(one);
        let bulk = limiter(one.clone(), pool());
        let _held = hold(&bulk).await;
        let policy = pool();
        let takes = [Take {
            counter: CounterId {
                limit: "pool",
                key: None,
            },
            policy: &policy,
        }];
        let max = tollgate_redis_protocol::queue::PLACES_MAX as u64;
        for id in 1..=max + 8 {
            let waiter = WaiterId::new(id).expect("an id");
            let asked = one.acquire(Ask::new(&takes, 1, Priority::Low).waiter(waiter));
            assert!(!asked.await.expect("answers").is_granted());
        }
        let kept = places(&one).await;
        assert_eq!(kept.len() as u64, max, "the queue is bounded");
        assert!(
            kept.iter().all(|place| place.rank.id <= max),
            "the first come are kept"
        );
        let high = WaiterId::new(10_000).expect("an id");
        let asked = one.acquire(Ask::new(&takes, 1, Priority::High).waiter(high));
        assert!(!asked.await.expect("answers").is_granted());
        let kept = places(&one).await;
        assert_eq!(kept.len() as u64, max);
        assert_eq!(kept[0].rank.id, 10_000, "a high request gets in, first");
        assert!(
            !kept.iter().any(|place| place.rank.id == max),
            "the last low one made room"
        );
    });
}

/// A waiter asking each counter its own cost stands in each counter's queue for that counter's
/// cost: a request on one of them alone leaves room for that cost, not for another counter's.
#[test]
fn a_waiter_s_place_on_each_counter_holds_that_counter_s_cost() {
    let Some(url) = redis_url("a_waiter_s_place_on_each_counter_holds_that_counter_s_cost") else {
        return;
    };
    runtime().block_on(async {
        let (one, two) = two_processes(&url, "costs", 600_000_000).await;
        let hour = 3_600_000_000;
        let policy = Policy::rate(10, hour, 0, tollgate::Algorithm::Fixed, Reserve::default())
            .expect("a policy");
        let take = |limit| Take {
            counter: CounterId { limit, key: None },
            policy: &policy,
        };
        let (calls, tokens) = (take("calls"), take("tokens"));
        let spent = one.acquire(Ask::new(&[tokens], 9, Priority::High)).await;
        assert!(spent.expect("answers").is_granted());
        let waiter = WaiterId::new(5).expect("an id");
        let both = [calls, tokens];
        let asked = two
            .acquire(
                Ask::new(&both, 1, Priority::Normal)
                    .costs(&[1, 5])
                    .waiter(waiter),
            )
            .await
            .expect("answers");
        assert!(!asked.is_granted(), "tokens has 1 left, the waiter asks 5");
        let queue = |counter: CounterId<'_>| {
            let key = one
                .keys
                .counter_queue(one.keys.counter_slot(counter), counter);
            let backend = one.caller.backend.clone();
            async move {
                let raw: Option<Vec<u8>> = backend
                    .query(&redis::cmd("GET").arg(&key).clone())
                    .await
                    .ok()
                    .and_then(|value| redis::from_redis_value(value).ok());
                tollgate_redis_protocol::queue::decode(raw.as_deref().unwrap_or_default())
                    .into_iter()
                    .map(|place| (place.rank.id, place.cost))
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(queue(calls.counter).await, vec![(5, 1)]);
        assert_eq!(queue(tokens.counter).await, vec![(5, 5)]);
        // Calls alone, at the waiter's priority and behind it: 10 leaves no room for its 1, 9
        // does (a place of 5 would have held 9 back too).
        let ten = one.acquire(Ask::new(&[calls], 10, Priority::Normal)).await;
        match ten.expect("answers").outcomes()[0] {
            tollgate::store::CounterOutcome::Denied(denial) => {
                assert_eq!(denial.reason, DenyReason::Queued, "{denial:?}")
            }
            other => panic!("10 of calls behind a place of 1: {other:?}"),
        }
        let nine = one.acquire(Ask::new(&[calls], 9, Priority::Normal)).await;
        assert!(
            nine.expect("answers").is_granted(),
            "9 of calls leaves the place its 1"
        );
    });
}
