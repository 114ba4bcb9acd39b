//! What a vendor teaches a limiter, through its public API, on the in-memory store with tokio's
//! paused clock: grants are counted here, against the policy a test states, never read back
//! from the limiter's own view.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    AdvertisedQuota, Algorithm, Error, LearnConfig, Limit, Limiter, Policy, Request, Reserve,
};

const SECOND_US: u64 = 1_000_000;

fn limiter_with(name: &str, limit: u64) -> Limiter {
    let limiter = Limiter::in_memory();
    let policy =
        Policy::rate(limit, SECOND_US, 0, Algorithm::Sliding, Reserve::default()).expect("policy");
    limiter.set_limit(Limit::new(name, policy, None).expect("limit"));
    limiter
}

/// Grants taken now without waiting, until the first denial.
async fn burst(limiter: &Limiter, name: &str) -> u64 {
    let mut granted = 0;
    while limiter
        .try_acquire(&Request::new(name).refundable(false))
        .await
        .expect("asked")
        .is_granted()
    {
        granted += 1;
        assert!(granted <= 1_000, "no end to the grants");
    }
    granted
}

fn advertised(quota: u64) -> [AdvertisedQuota; 1] {
    [AdvertisedQuota {
        quota,
        window: None,
    }]
}

fn lesson(quotas: &[AdvertisedQuota], rate_limited: bool) -> tollgate::Lesson<'_> {
    tollgate::Lesson {
        source: "x-ratelimit-limit from vendor.test",
        quotas,
        rate_limited,
    }
}

#[tokio::test(start_paused = true)]
async fn an_advertised_limit_is_what_is_granted_until_it_expires() {
    let limiter = limiter_with("vendor", 20);
    let learned = limiter
        .learn("vendor", &lesson(&advertised(10), false))
        .expect("learned");
    assert_eq!((learned.configured, learned.effective), (20, 10));
    assert_eq!(
        burst(&limiter, "vendor").await,
        10,
        "the vendor's limit, not ours"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(burst(&limiter, "vendor").await, 10);
    // Past the learned value's life, the configured limit is back in force by itself.
    tokio::time::advance(LearnConfig::default().ttl).await;
    tokio::task::yield_now().await;
    assert_eq!(limiter.learned("vendor").expect("rate").effective, 20);
    assert_eq!(burst(&limiter, "vendor").await, 20);
}

#[tokio::test(start_paused = true)]
async fn more_advertised_puts_the_configured_limit_back_and_never_above_it() {
    let limiter = limiter_with("vendor", 20);
    limiter
        .learn("vendor", &lesson(&advertised(5), false))
        .expect("learned");
    assert_eq!(burst(&limiter, "vendor").await, 5);
    limiter
        .learn("vendor", &lesson(&advertised(500), false))
        .expect("learned");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        burst(&limiter, "vendor").await,
        20,
        "never above the configured"
    );
}

#[tokio::test(start_paused = true)]
async fn rate_limit_answers_without_a_quota_halve_once_and_climb_back() {
    let limiter = limiter_with("vendor", 20);
    for _ in 0..5 {
        limiter
            .learn("vendor", &lesson(&[], true))
            .expect("learned");
    }
    assert_eq!(
        burst(&limiter, "vendor").await,
        10,
        "one burst of answers, one halving"
    );
    let every = LearnConfig::default().raise_every;
    tokio::time::advance(every).await;
    tokio::task::yield_now().await;
    assert_eq!(burst(&limiter, "vendor").await, 11, "a step back up");
    tokio::time::advance(every * 20).await;
    tokio::task::yield_now().await;
    assert_eq!(limiter.learned("vendor").expect("rate").effective, 20);
}

#[tokio::test(start_paused = true)]
async fn a_delay_reported_widens_the_window_counted() {
    let limiter = limiter_with("vendor", 10);
    let permit = limiter
        .acquire(&Request::new("vendor"))
        .await
        .expect("asked")
        .granted()
        .expect("room");
    let id = permit.id().to_string();
    permit.commit(1).await.expect("committed");
    limiter
        .note_sent(&id, Duration::from_millis(12))
        .expect("noted");
    let learned = limiter.learned("vendor").expect("rate");
    assert_eq!(learned.delay, Duration::from_millis(12));
    assert_eq!(
        learned.margin,
        Duration::from_millis(25),
        "12 ms + 10 ms, in 5 ms steps"
    );
    assert_eq!(burst(&limiter, "vendor").await, 9);
    // A period after the first grant, its unit is still counted: the margin holds it.
    tokio::time::advance(Duration::from_millis(1_010)).await;
    assert_eq!(burst(&limiter, "vendor").await, 0);
    tokio::time::advance(Duration::from_millis(20)).await;
    assert_eq!(burst(&limiter, "vendor").await, 10);
    assert!(limiter.note_sent("not-a-permit", Duration::ZERO).is_err());
}

#[tokio::test(start_paused = true)]
async fn bad_lessons_are_refused_naming_the_field() {
    let limiter = limiter_with("vendor", 10);
    let field = |error: Error| match error {
        Error::InvalidRequest { field, .. } => field,
        other => panic!("unexpected {other}"),
    };
    let mut bad = lesson(&[], true);
    bad.source = "";
    assert_eq!(
        field(limiter.learn("vendor", &bad).expect_err("empty")),
        "source"
    );
    bad.source = "tab\there";
    assert_eq!(
        field(limiter.learn("vendor", &bad).expect_err("control")),
        "source"
    );
    let zero = advertised(0);
    assert_eq!(
        field(
            limiter
                .learn("vendor", &lesson(&zero, false))
                .expect_err("zero")
        ),
        "quotas"
    );
    let many = [AdvertisedQuota {
        quota: 1,
        window: None,
    }; 9];
    assert_eq!(
        field(
            limiter
                .learn("vendor", &lesson(&many, false))
                .expect_err("many")
        ),
        "quotas"
    );
    assert!(matches!(
        limiter.learn("nope", &lesson(&[], true)),
        Err(Error::UnknownLimit { .. })
    ));
    let lease = Policy::concurrency(2, SECOND_US, Reserve::default()).expect("policy");
    limiter.set_limit(Limit::new("conn", lease, None).expect("limit"));
    assert_eq!(
        field(
            limiter
                .learn("conn", &lesson(&[], true))
                .expect_err("lease")
        ),
        "limit"
    );
}

proptest! {
    /// Whatever lessons come, in whatever order and at whatever times, the limit granted is
    /// never above the configured one nor below the floor, and with no lesson for long enough
    /// it is the configured one again.
    #[test]
    fn what_is_learned_stays_within_bounds_and_runs_out(
        configured in 1u64..200,
        lessons in proptest::collection::vec((0u64..3, 0u64..400, 0u64..5_000), 0..30),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let limiter = limiter_with("vendor", configured);
            let floor = (configured / 10).max(1);
            for (kind, quota, gap_ms) in lessons {
                tokio::time::advance(Duration::from_millis(gap_ms)).await;
                let quotas = advertised(quota.max(1));
                let lesson = match kind {
                    0 => lesson(&quotas, false),
                    _ => lesson(&[], true),
                };
                let learned = limiter.learn("vendor", &lesson).expect("learned");
                prop_assert!(learned.effective <= configured);
                prop_assert!(learned.effective >= floor);
                // What is granted is what the limiter says is in force.
                tokio::time::advance(Duration::from_secs(2)).await;
                let granted = burst(&limiter, "vendor").await;
                prop_assert!(granted <= configured && granted >= floor.min(configured),
                    "granted {granted} of {configured}, floor {floor}");
            }
            tokio::time::advance(Duration::from_secs(3_600)).await;
            tokio::task::yield_now().await;
            prop_assert_eq!(limiter.learned("vendor").expect("rate").effective, configured);
            Ok(())
        })?;
    }
}

#[tokio::test(start_paused = true)]
async fn grants_taken_before_a_lesson_count_against_the_limit_it_lowers() {
    for algorithm in [
        Algorithm::Sliding,
        Algorithm::Fixed,
        Algorithm::Gcra { burst: 20 },
    ] {
        let limiter = Limiter::in_memory();
        let policy = Policy::rate(20, SECOND_US, 0, algorithm, Reserve::default()).expect("policy");
        limiter.set_limit(Limit::new("vendor", policy, None).expect("limit"));
        let mut held = Vec::new();
        for _ in 0..9 {
            held.push(
                limiter
                    .try_acquire(&Request::new("vendor"))
                    .await
                    .expect("asked")
                    .granted()
                    .expect("room"),
            );
        }
        limiter
            .learn("vendor", &lesson(&advertised(10), false))
            .expect("learned");
        assert!(limiter.note_delay("vendor", Duration::from_millis(5)));
        assert_eq!(
            burst(&limiter, "vendor").await,
            1,
            "{algorithm:?}: nine of the vendor's ten were taken before the lesson"
        );
    }
}
