//! Minimum shares (`LimiterConfig::shares`) on tokio's paused clock: closed-loop callers at
//! each priority saturate a rate limit, and the grants are counted here, by the second of the
//! test's own clock they were made in, never read back from the limiter. Strict priority
//! starves the lower levels; with shares each waiting level gets its share of every period,
//! and otherwise priority is as strict as before.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{
    Algorithm, Limit, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, MonotonicClock,
    Policy, Priority, Request, Reserve, Shares,
};

const SECOND_US: u64 = 1_000_000;
const LIMIT: u64 = 20;
const SECONDS: u64 = 12;

fn limiter(shares: Shares, algorithm: Algorithm) -> Limiter {
    let config = LimiterConfig {
        shares,
        ..LimiterConfig::default()
    };
    let store = MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000,
            keys_per_limit_max: 1_000,
        },
        Arc::new(MonotonicClock::new()),
    );
    let limiter = Limiter::new(Arc::new(store), config);
    let policy = Policy::rate(LIMIT, SECOND_US, 0, algorithm, Reserve::default()).expect("policy");
    limiter.set_limit(Limit::new("vendor", policy, None).expect("limit"));
    limiter
}

/// Grants per second of the run, per level (high, normal, low), of one closed-loop caller per
/// level in `callers` that asks again `gap` after each answer (its own work, and its next
/// request's way to the limiter), waiting up to a minute.
async fn run(limiter: &Limiter, callers: &[Priority], gap: Duration) -> Vec<[u64; 3]> {
    let start = Instant::now();
    let grants: Arc<Mutex<Vec<[u64; 3]>>> = Arc::new(Mutex::new(vec![
        [0; 3];
        usize::try_from(SECONDS)
            .expect("small")
    ]));
    let mut tasks = Vec::new();
    for &priority in callers {
        let (limiter, grants) = (limiter.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let level = match priority {
                Priority::High => 0,
                Priority::Normal => 1,
                Priority::Low => 2,
            };
            loop {
                let request = Request::new("vendor")
                    .priority(priority)
                    .refundable(false)
                    .wait(Duration::from_secs(60));
                let granted = limiter
                    .acquire(&request)
                    .await
                    .expect("asked")
                    .granted()
                    .is_some();
                let second = start.elapsed().as_secs();
                if second >= SECONDS {
                    return;
                }
                if granted {
                    grants.lock().expect("grants")[usize::try_from(second).expect("small")]
                        [level] += 1;
                }
                if !gap.is_zero() {
                    tokio::time::sleep(gap).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("caller");
    }
    grants.lock().expect("grants").clone()
}

/// Every second of the run after the first, for the limit's window to fill.
fn steady(grants: &[[u64; 3]]) -> &[[u64; 3]] {
    &grants[1..]
}

#[tokio::test(start_paused = true)]
async fn strict_priority_gives_the_lower_levels_nothing_while_high_keeps_the_limit_busy() {
    let limiter = limiter(Shares::default(), Algorithm::Sliding);
    let grants = run(
        &limiter,
        &[Priority::High, Priority::Normal, Priority::Low],
        Duration::ZERO,
    )
    .await;
    for (second, [high, normal, low]) in steady(&grants).iter().enumerate() {
        assert!(high + normal + low <= LIMIT, "second {second}: {grants:?}");
        assert_eq!((*normal, *low), (0, 0), "second {second}: {grants:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn each_waiting_level_gets_its_share_of_every_period_and_high_the_rest() {
    for algorithm in [
        Algorithm::Sliding,
        Algorithm::Fixed,
        Algorithm::Gcra { burst: LIMIT },
    ] {
        let limiter = limiter(Shares::new(20, 10).expect("shares"), algorithm);
        let grants = run(
            &limiter,
            &[Priority::High, Priority::Normal, Priority::Low],
            Duration::ZERO,
        )
        .await;
        println!("{algorithm:?}: grants per second (high, normal, low): {grants:?}");
        for (second, [high, normal, low]) in steady(&grants).iter().enumerate() {
            let context = format!("{algorithm:?}, second {second}: {grants:?}");
            assert!(high + normal + low <= LIMIT, "over the limit: {context}");
            // 20 % and 10 % of 20 a second.
            assert!(*normal >= 4, "normal short of its share: {context}");
            assert!(*low >= 2, "low short of its share: {context}");
            // Past their shares, priority is strict: high takes what is left.
            assert!(*normal <= 5 && *low <= 3, "more than a share: {context}");
            assert!(
                *high >= LIMIT - 4 - 2 - 2,
                "high kept from the rest: {context}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn with_no_lower_level_waiting_high_gets_every_unit() {
    let limiter = limiter(Shares::new(20, 10).expect("shares"), Algorithm::Sliding);
    let grants = run(&limiter, &[Priority::High, Priority::High], Duration::ZERO).await;
    for (second, [high, normal, low]) in steady(&grants).iter().enumerate() {
        assert_eq!(
            (*high, *normal, *low),
            (LIMIT, 0, 0),
            "second {second}: {grants:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_level_past_its_share_waits_behind_higher_levels_again() {
    let limiter = limiter(Shares::new(0, 10).expect("shares"), Algorithm::Sliding);
    // The low level takes its two units of this period at once, nobody else asking.
    for _ in 0..2 {
        let request = Request::new("vendor")
            .priority(Priority::Low)
            .refundable(false);
        assert!(
            limiter
                .try_acquire(&request)
                .await
                .expect("asked")
                .is_granted()
        );
    }
    // Normal has no share: beside high it is strict priority, and low has had its share.
    let grants = run(
        &limiter,
        &[Priority::High, Priority::Normal, Priority::Low],
        Duration::ZERO,
    )
    .await;
    for (second, [high, normal, low]) in steady(&grants).iter().enumerate() {
        assert!(high + normal + low <= LIMIT, "second {second}: {grants:?}");
        assert_eq!(
            *normal, 0,
            "normal has no share: second {second}: {grants:?}"
        );
        assert!((2..=3).contains(low), "second {second}: {grants:?}");
    }
}

#[test]
fn shares_over_the_whole_period_are_refused_naming_the_field() {
    let error = Shares::new(60, 50).expect_err("110 %");
    assert!(error.to_string().contains("shares"), "{error}");
    assert!(Shares::new(50, 50).is_ok());
    assert!(Shares::default().is_off());
}

/// Callers that take a millisecond between answer and next request, as over a network:
/// more `high` callers than a period's units keep the limit busy at every instant, and the
/// levels below still get their shares.
#[tokio::test(start_paused = true)]
async fn many_callers_a_millisecond_apart_keep_the_shares_and_the_order() {
    let mut callers = vec![Priority::High; 24];
    // As many as their shares' units: a level is served what it has waiting.
    callers.extend([Priority::Normal; 4]);
    callers.extend([Priority::Low; 2]);
    for (shares, least) in [
        (Shares::default(), [16, 0, 0]),
        (Shares::new(20, 10).expect("shares"), [12, 4, 2]),
    ] {
        let limiter = limiter(shares, Algorithm::Sliding);
        let grants = run(&limiter, &callers, Duration::from_millis(1)).await;
        println!("{shares:?}: grants per second (high, normal, low): {grants:?}");
        for (second, counts) in steady(&grants).iter().enumerate() {
            let context = format!("{shares:?}, second {second}: {grants:?}");
            assert!(
                counts.iter().sum::<u64>() <= LIMIT,
                "over the limit: {context}"
            );
            for (level, count) in counts.iter().enumerate() {
                assert!(*count >= least[level], "level {level} short: {context}");
            }
        }
    }
}
