//! Quota leasing across two leasing stores on one namespace (two processes' worth): blocks are
//! handed out locally, and in no window of one period do the callers, together, receive more
//! than the limit. Counted from the instants the callers received their grants, on the test's
//! clock.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tollgate::store::{Ask, Decision, Forward, Store, StoreFuture};
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
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
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
    let margin = Duration::from_millis(50);
    let policy = Policy::rate(
        limit,
        period.as_micros() as u64,
        margin.as_micros() as u64,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid");
    // The store counts a block's units over the period plus the margin from the block's grant,
    // and a unit may be handed out up to a block's life later: the callers' own window is that
    // span less the longest life, which the margin caps (blocks here may live longer; see
    // `a_block_is_never_handed_out_past_the_margin`). The window is exactly the period: nothing
    // is left over for an overshoot to hide in.
    let block_lifetime = Duration::from_secs(2);
    let window = period + margin - block_lifetime.min(margin);
    let secret = PermitSecret::random();
    let mut stores = Vec::new();
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let (store, limiter) = leasing_vendor(
            &url,
            &namespace,
            policy,
            block_lifetime,
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
        while received[end] - received[start] >= window {
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
         {returns} returns, at most {most} used in {window:?}",
        received.len()
    );
    assert!(
        most as u64 <= limit,
        "{most} grants within {window:?} > {limit}"
    );
    // How many round trips the blocks saved depends here on how the tasks' waits fall (a
    // waiter that finds the limit spent asks the store again); the saving itself is shown
    // below, where nothing else is asking.
    assert!(local > 0, "no grant came from a block");
}

/// Units left in a block are never handed out past the limit's margin, however long blocks may
/// live: the store stopped counting them one period and margin after the block's grant, and
/// another process may since have taken the whole limit again. Process A holds a block with
/// units left; B takes what the store has, waits out the period and margin, and takes a whole
/// limit again; then A asks. Counted from the instants the callers received their grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_is_never_handed_out_past_the_margin() {
    let Some(url) = common::redis_url("a_block_is_never_handed_out_past_the_margin") else {
        return;
    };
    let namespace = common::namespace("leasing_margin");
    common::declare_fresh(&url, &namespace).await;
    let limit = 40;
    let period = Duration::from_millis(200);
    let margin = Duration::from_millis(50);
    let policy = Policy::rate(
        limit,
        period.as_micros() as u64,
        margin.as_micros() as u64,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid");
    let secret = PermitSecret::random();
    let block_lifetime = Duration::from_secs(10);
    let wait = Duration::from_secs(10);
    let (_a_store, a) =
        leasing_vendor(&url, &namespace, policy, block_lifetime, wait, secret).await;
    let (_b_store, b) =
        leasing_vendor(&url, &namespace, policy, block_lifetime, wait, secret).await;
    let origin = Instant::now();
    let mut received: Vec<(Duration, &str)> = Vec::new();
    // Blocks of 1, 2 and 4: after four grants A's block of 4 has 3 units left.
    for _ in 0..4 {
        let outcome = a
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers");
        assert!(outcome.is_granted(), "a fresh limit grants A");
        received.push((origin.elapsed(), "A"));
    }
    let take_all = async |limiter: &Limiter, who: &'static str, log: &mut Vec<(Duration, &str)>| {
        for _ in 0..=limit {
            if !limiter
                .try_acquire(&Request::new("vendor"))
                .await
                .expect("answers")
                .is_granted()
            {
                return;
            }
            log.push((origin.elapsed(), who));
        }
    };
    take_all(&b, "B", &mut received).await;
    tokio::time::sleep_until((origin + period + margin + Duration::from_millis(20)).into()).await;
    take_all(&b, "B", &mut received).await;
    take_all(&a, "A", &mut received).await;
    received.sort_unstable();
    let mut start = 0;
    for end in 0..received.len() {
        while received[end].0 - received[start].0 >= period {
            start += 1;
        }
        assert!(
            (end + 1 - start) as u64 <= limit,
            "{} grants within {period:?}: {:?}",
            end + 1 - start,
            &received[start..=end]
        );
    }
}

/// `limit` per minute on a sliding window with a thirty-second margin: a block lives thirty
/// seconds, far longer than a test's run, even on a slow machine.
fn sliding_per_minute(limit: u64) -> Policy {
    Policy::rate(
        limit,
        60_000_000,
        30_000_000,
        Algorithm::Sliding,
        Reserve::default(),
    )
    .expect("valid")
}

/// `leasing_vendor` under `sliding_per_minute(limit)`, its blocks living thirty seconds.
async fn long_lived_blocks(url: &str, namespace: &str, limit: u64) -> (Arc<LeasingStore>, Limiter) {
    leasing_vendor(
        url,
        namespace,
        sliding_per_minute(limit),
        Duration::from_secs(30),
        Duration::from_secs(1),
        PermitSecret::random(),
    )
    .await
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
    // Twenty sequential grants on loopback stay far inside a block's thirty seconds.
    let (store, limiter) = long_lived_blocks(&url, &namespace, 1_000).await;
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

/// Sixty-four callers at once on one counter: a caller that finds the block empty while another
/// fetches the next waits for it, so blocks still grow (1, 2, 4, 8, 16, then 16 each) and none
/// is replaced before it is used up. 1,280 grants take 84 round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_one_block_at_a_time() {
    let Some(url) = common::redis_url("concurrent_callers_share_one_block_at_a_time") else {
        return;
    };
    let namespace = common::namespace("leasing-concurrent");
    common::declare_fresh(&url, &namespace).await;
    let (store, limiter) = long_lived_blocks(&url, &namespace, 1_000_000).await;
    let mut callers = Vec::new();
    for _ in 0..64 {
        let limiter = limiter.clone();
        callers.push(tokio::spawn(async move {
            for _ in 0..20 {
                let outcome = limiter
                    .try_acquire(&Request::new("vendor").refundable(false))
                    .await
                    .expect("answers");
                assert!(outcome.is_granted(), "refused with room left");
            }
        }));
    }
    for caller in callers {
        caller.await.expect("a caller");
    }
    let (local, acquires, returns) = store.counts();
    assert_eq!(local + acquires, 1_280, "every grant counted once");
    assert_eq!(
        (acquires, returns),
        (84, 0),
        "one block at a time, each used up: (store acquires, blocks given back)"
    );
}

/// The real store, whose next acquire once armed answers only when the test says so: a block
/// fetch that is still on its way back when a pause is made.
#[derive(Debug)]
struct HeldAnswer {
    inner: Arc<dyn Store>,
    armed: AtomicBool,
    decided: Notify,
    answer: Notify,
}

impl Forward for HeldAnswer {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        StoreFuture::boxed(async move {
            let decision = self.inner.acquire(ask).await;
            if self.armed.swap(false, Ordering::SeqCst) {
                self.decided.notify_one();
                self.answer.notified().await;
            }
            decision
        })
    }
}

/// A pause made through the leasing store while a block is being fetched: the caller that
/// fetched it keeps its grant (decided before the pause), but nothing more is handed out from
/// that block, and its rest goes back to the shared counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_during_a_block_fetch_stops_that_block() {
    let Some(url) = common::redis_url("a_pause_during_a_block_fetch_stops_that_block") else {
        return;
    };
    let namespace = common::namespace("leasing-pause-race");
    common::declare_fresh(&url, &namespace).await;
    let policy = sliding_per_minute(1_000);
    let held = Arc::new(HeldAnswer {
        inner: Arc::new(common::connect(&url, &namespace).await),
        armed: AtomicBool::new(false),
        decided: Notify::new(),
        answer: Notify::new(),
    });
    let store = LeasingStore::new(
        held.clone(),
        LeasingConfig {
            block_lifetime: Duration::from_secs(30),
            block_units_max: 16,
        },
    );
    let limiter = Limiter::new(
        store.clone(),
        LimiterConfig {
            wait_max: Duration::ZERO,
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    limiter.set_limit(Limit::new("vendor", policy, None).expect("valid"));

    // A first grant and its block of one, then a second caller whose block (of two) is held.
    let first = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("answers");
    assert!(first.is_granted());
    held.armed.store(true, Ordering::SeqCst);
    let fetching = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            limiter
                .try_acquire(&Request::new("vendor"))
                .await
                .expect("answers")
                .is_granted()
        })
    };
    held.decided.notified().await;
    limiter
        .pause("vendor", None, Duration::from_secs(60))
        .await
        .expect("paused");
    held.answer.notify_one();
    assert!(
        fetching.await.expect("the fetching caller"),
        "decided before the pause: granted"
    );
    let after = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("answers");
    assert!(
        !after.is_granted(),
        "a unit of a block fetched across the pause was handed out after it"
    );
    let (_, _, returns) = store.counts();
    assert_eq!(returns, 1, "the block's rest went back");
}

/// A charge on a leased counter is paid before anything more is granted here: the block's rest
/// goes back first, and the next request asks the store, which counts the debt, rather than
/// being served from a block fetched before the charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_retires_the_block_and_is_paid_first() {
    let Some(url) = common::redis_url("a_charge_retires_the_block_and_is_paid_first") else {
        return;
    };
    let namespace = common::namespace("leasing-charge");
    common::declare_fresh(&url, &namespace).await;
    let (store, limiter) = long_lived_blocks(&url, &namespace, 40).await;
    // Blocks of one, then of two: one unit left in the block.
    for call in 0..2 {
        let granted = limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers");
        assert!(granted.is_granted(), "call {call}");
    }
    let charged = limiter
        .charge(&Request::new("vendor").cost(40))
        .await
        .expect("charge");
    assert_eq!(
        (charged[0].charged, charged[0].usage.used),
        (40, 42),
        "the block's rest went back before the debt was counted"
    );
    let after = limiter
        .try_acquire(&Request::new("vendor"))
        .await
        .expect("answers");
    assert!(
        !after.is_granted(),
        "a unit of a block fetched before the charge was handed out past the debt"
    );
    let (_, _, returns) = store.counts();
    assert_eq!(returns, 1, "the block's rest went back");
}
