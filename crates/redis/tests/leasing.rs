//! Quota leasing across two leasing stores on one namespace (two processes' worth): blocks are
//! handed out locally, and in no window of one period do the callers, together, receive more
//! than the limit. Counted from the instants the callers received their grants.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Limit, Limiter, LimiterConfig, PermitSecret, Policy, Request, Reserve};
use tollgate_redis::{LeasingConfig, LeasingStore};

/// A leasing store on `namespace` (blocks of at most 16 units living `block_lifetime`) and a
/// limiter over it with the limit "vendor" under `policy`.
async fn leasing_vendor(
    url: &str,
    namespace: &str,
    policy: Policy,
    block_lifetime: Duration,
    wait_max: Duration,
    permit_secret: PermitSecret,
) -> (Arc<LeasingStore>, Limiter) {
    let store = LeasingStore::new(
        Arc::new(common::connect(url, namespace).await),
        LeasingConfig {
            block_lifetime,
            block_units_max: 16,
        },
    );
    let limiter = Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max,
            permit_secret,
        },
    );
    limiter.set_limit(Limit::new("vendor", policy, None).expect("valid"));
    (store, limiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_blocks_never_put_more_than_the_limit_in_a_period() {
    let Some(url) = common::redis_url("leased_blocks_never_put_more_than_the_limit_in_a_period")
    else {
        return;
    };
    let namespace = common::namespace("leasing");
    common::declare_fresh(&url, &namespace).await;
    let limit = 40;
    let period = Duration::from_millis(200);
    let policy = Policy::rate(
        limit,
        period.as_micros() as u64,
        50_000,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid");
    let secret = PermitSecret::random();
    let mut stores = Vec::new();
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let (store, limiter) = leasing_vendor(
            &url,
            &namespace,
            policy,
            Duration::from_millis(50),
            Duration::from_secs(10),
            secret,
        )
        .await;
        stores.push(store);
        limiters.push(limiter);
    }
    let origin = Instant::now();
    let end = origin + Duration::from_secs(4);
    let received = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let grants = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..16 {
        let limiter = limiters[task % 2].clone();
        let received = received.clone();
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let request = Request::new("vendor").wait(Duration::from_millis(500));
                if let Some(permit) = limiter.acquire(&request).await.expect("answers").granted() {
                    grants.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    received.lock().expect("log").push(origin.elapsed());
                    // Every fifth call turns out not to be needed: give its unit back.
                    let used = u64::from(task % 5 != 0);
                    permit.commit(used).await.expect("commit");
                    if used == 0 {
                        received.lock().expect("log").pop();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let mut received = received.lock().expect("log").clone();
    received.sort_unstable();
    let mut start = 0;
    let mut most = 0;
    for end in 0..received.len() {
        while received[end] - received[start] >= period {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    let (local, acquires, returns) = stores
        .iter()
        .map(|store| store.counts())
        .fold((0, 0, 0), |sum, counts| {
            (sum.0 + counts.0, sum.1 + counts.1, sum.2 + counts.2)
        });
    let grants = grants.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "leasing: {grants} grants ({} used), {local} from blocks, {acquires} store acquires, \
         {returns} returns, at most {most} used in a period",
        received.len()
    );
    assert!(
        most as u64 <= limit,
        "{most} grants within one period > {limit}"
    );
    // How many round trips the blocks saved depends here on how the tasks' waits fall (a
    // waiter that finds the limit spent asks the store again); the saving itself is shown
    // below, where nothing else is asking.
    assert!(local > 0, "no grant came from a block");
}

/// One caller in a period with room: every block is used up before it ends, so each next one
/// is twice as large, and twenty grants take five round trips (blocks of 1, 2, 4, 8, 16).
#[tokio::test]
async fn blocks_grow_while_they_are_used_up_and_save_round_trips() {
    let Some(url) = common::redis_url("blocks_grow_while_they_are_used_up_and_save_round_trips")
    else {
        return;
    };
    let namespace = common::namespace("leasing-growth");
    common::declare_fresh(&url, &namespace).await;
    // A block lives for the policy's margin at most: thirty seconds, which twenty sequential
    // grants on loopback stay far inside even on a slow machine.
    let policy = Policy::rate(
        1_000,
        60_000_000,
        30_000_000,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid");
    let (store, limiter) = leasing_vendor(
        &url,
        &namespace,
        policy,
        Duration::from_secs(30),
        Duration::from_secs(1),
        PermitSecret::random(),
    )
    .await;
    for call in 0..20 {
        let permit = limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers")
            .granted()
            .unwrap_or_else(|| panic!("call {call} refused with room left"));
        permit.commit(1).await.expect("commit");
    }
    let (local, acquires, returns) = store.counts();
    assert_eq!((local, acquires, returns), (15, 5, 0));
}
