//! The dispatcher in one process, on tokio's paused clock where the test is about order or
//! time: the queue's priority order, bounded retries, answers passed through unchanged,
//! pauses from a rate-limit answer, the queue's bound, the pools, high priority behind a
//! saturated bulk backlog, and a dispatcher on its own runtime while callers block theirs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{Algorithm, Limit, Limiter, Policy, Request, Reserve};
use tollgate_dispatch::{
    Classifier, DispatchError, DispatchRuntime, Dispatcher, DispatcherConfig, Gate, GateConfig,
    HostLimits, Plain, Priority, Quota,
};

fn config() -> GateConfig {
    GateConfig {
        wait_ms_max: 600_000,
        retries_max: 3,
        backoff_ms: 100,
        backoff_ms_max: 1_000,
        retry_after_ms_default: 7_000,
        retry_after_ms_max: 60_000,
        resume_jitter_ms_max: 100,
        lease_margin_ms: 1_000,
        // These cases measure the pause protocol alone; learning has its own.
        learn: false,
    }
}

/// A limiter with a rate limit "vendor" of `limit` per `period_ms`, high keeping `reserve_high`.
fn limiter(limit: u64, period_ms: u64, reserve_high: u64) -> Limiter {
    let limiter = Limiter::in_memory();
    let policy = Policy::rate(
        limit,
        period_ms * 1_000,
        0,
        Algorithm::Sliding,
        Reserve {
            high: reserve_high,
            normal: 0,
        },
    )
    .expect("policy");
    limiter.set_limit(Limit::new("vendor", policy, None).expect("limit"));
    limiter
}

fn gate(limiter: &Limiter, config: GateConfig) -> Gate {
    let quota = Quota::limiter(
        limiter.clone(),
        HostLimits {
            rate: Some("vendor".into()),
            concurrency: None,
        },
    )
    .expect("quota");
    Gate::new(quota, Classifier::new(), config).expect("gate")
}

fn dispatcher<S: Clone + PartialEq + Send + Sync + 'static>(
    gate: Gate,
    connections_max: u32,
    queued_max: u32,
) -> Dispatcher<u64, S> {
    let opened = Arc::new(AtomicU64::new(0));
    Dispatcher::start(
        gate,
        DispatcherConfig {
            queued_max,
            connections_max,
        },
        move |_: &S| {
            let number = opened.fetch_add(1, Ordering::Relaxed);
            async move { Ok(number) }
        },
        DispatchRuntime::Current,
    )
    .expect("dispatcher")
}

fn ok() -> Result<(), std::io::Error> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_queue_serves_highest_priority_first_then_arrival() {
    let limiter = limiter(1_000, 1_000, 0);
    let dispatcher: Dispatcher<u64, ()> = dispatcher(gate(&limiter, config()), 1, 100);
    // Hold the only connection until every other job is queued.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = Arc::new(Mutex::new(Some(started_tx)));
    let release_rx = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let blocker = dispatcher
        .submit((), Priority::Low, move |_| {
            let started_tx = started_tx.clone();
            let release_rx = release_rx.clone();
            async move {
                if let Some(tx) = started_tx.lock().expect("lock").take() {
                    let _ = tx.send(());
                }
                if let Some(rx) = release_rx.lock().await.take() {
                    let _ = rx.await;
                }
                ok()
            }
        })
        .expect("queued");
    started_rx.await.expect("the blocker runs");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut jobs = Vec::new();
    for (name, priority) in [
        ("low-1", Priority::Low),
        ("normal-1", Priority::Normal),
        ("high-1", Priority::High),
        ("normal-2", Priority::Normal),
        ("low-2", Priority::Low),
        ("high-2", Priority::High),
    ] {
        let order = order.clone();
        jobs.push(
            dispatcher
                .submit((), priority, move |_| {
                    order.lock().expect("lock").push(name);
                    async { ok() }
                })
                .expect("queued"),
        );
    }
    assert_eq!(dispatcher.queued(), 6);
    release_tx.send(()).expect("release");
    blocker.await.expect("ran").expect("ok");
    for job in jobs {
        job.await.expect("ran").expect("ok");
    }
    assert_eq!(
        *order.lock().expect("lock"),
        ["high-1", "high-2", "normal-1", "normal-2", "low-1", "low-2"]
    );
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_a_bounded_number_of_times_then_returned() {
    let limiter = limiter(1_000, 1_000, 0);
    let dispatcher: Dispatcher<u64, ()> = dispatcher(gate(&limiter, config()), 4, 100);
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let started = Instant::now();
    let result = dispatcher
        .run((), Priority::Normal, move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
            async {
                Err::<(), _>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "vendor down",
                ))
            }
        })
        .await
        .expect("the dispatcher ran it");
    assert_eq!(
        calls.load(Ordering::Relaxed),
        4,
        "one attempt and retries_max = 3 retries"
    );
    let error = result.expect_err("the last failure reaches the caller");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
    assert_eq!(error.to_string(), "vendor down");
    // Backoffs of at least 50 + 100 + 200 ms (half of 100, 200, 400).
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(dispatcher.gate().stats().retried, 3);
}

#[derive(Debug, PartialEq)]
struct VendorSaysNo {
    code: u32,
}

impl std::fmt::Display for VendorSaysNo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "vendor error {}", self.code)
    }
}

impl tollgate_dispatch::Classify for VendorSaysNo {
    fn answer(&self) -> tollgate_dispatch::Answer<'_> {
        tollgate_dispatch::Answer::Error {
            transient: false,
            message: "",
        }
    }
}

#[tokio::test(start_paused = true)]
async fn other_errors_reach_the_caller_unchanged_after_one_attempt() {
    let limiter = limiter(1_000, 1_000, 0);
    let dispatcher: Dispatcher<u64, ()> = dispatcher(gate(&limiter, config()), 4, 100);
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let answer = dispatcher
        .run((), Priority::Normal, move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
            async { Err::<(), _>(VendorSaysNo { code: 4711 }) }
        })
        .await
        .expect("ran");
    assert_eq!(answer, Err(VendorSaysNo { code: 4711 }));
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    // A 404 is an answer, not a failure: also passed through, once.
    let response = dispatcher
        .run((), Priority::Normal, |_| async {
            http::Response::builder()
                .status(404)
                .body("no such thing")
                .expect("response")
        })
        .await
        .expect("ran");
    assert_eq!(response.status(), 404);
    assert_eq!(*response.body(), "no such thing");
}

fn too_many(retry_after: Option<&str>) -> http::Response<()> {
    let mut builder = http::Response::builder().status(429);
    if let Some(value) = retry_after {
        builder = builder.header(http::header::RETRY_AFTER, value);
    }
    builder.body(()).expect("response")
}

/// A 429 pauses the host in the store (every process sees it) for the vendor's Retry-After
/// plus positive jitter; nothing is sent until it ends; then the job is retried.
#[tokio::test(start_paused = true)]
async fn a_rate_limit_answer_pauses_the_host_for_at_least_retry_after() {
    for (retry_after, expected) in [
        (Some("2"), Duration::from_secs(2)),
        (None, Duration::from_millis(7_000)), // the configured default
        (Some("soon"), Duration::from_millis(7_000)), // garbage: the default, not a guess
        (Some("999999"), Duration::from_millis(60_000)), // capped at retry_after_ms_max
    ] {
        let limiter = limiter(1_000, 1_000, 0);
        let dispatcher: Dispatcher<u64, ()> = dispatcher(gate(&limiter, config()), 4, 100);
        let sent_at = Arc::new(Mutex::new(Vec::new()));
        let log = sent_at.clone();
        let job = dispatcher
            .submit((), Priority::Normal, move |_| {
                let mut log = log.lock().expect("lock");
                log.push(Instant::now());
                let answer = if log.len() == 1 {
                    too_many(retry_after)
                } else {
                    http::Response::builder().status(200).body(()).expect("ok")
                };
                async move { answer }
            })
            .expect("queued");
        // Let the first attempt happen and the pause land.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let probe = limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("probe");
        assert!(
            !probe.is_granted(),
            "the store holds the pause for everyone"
        );
        let response = job.await.expect("ran");
        assert_eq!(response.status(), 200, "retried after the pause");
        let sent_at = sent_at.lock().expect("lock");
        assert_eq!(sent_at.len(), 2);
        let gap = sent_at[1] - sent_at[0];
        assert!(gap >= expected, "{retry_after:?}: resumed after {gap:?}");
        assert!(
            gap <= expected + Duration::from_millis(200),
            "{retry_after:?}: {gap:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_queue_is_bounded() {
    let limiter = limiter(1_000, 1_000, 0);
    let dispatcher: Dispatcher<u64, ()> = dispatcher(gate(&limiter, config()), 1, 2);
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let hold = move |_| {
        let mut release_rx = release_rx.clone();
        async move {
            let _ = release_rx.wait_for(|released| *released).await;
            ok()
        }
    };
    let running = dispatcher
        .submit((), Priority::Normal, hold.clone())
        .expect("runs");
    tokio::time::sleep(Duration::from_millis(1)).await;
    let queued_1 = dispatcher
        .submit((), Priority::Normal, hold.clone())
        .expect("queued");
    let queued_2 = dispatcher
        .submit((), Priority::Normal, hold.clone())
        .expect("queued");
    match dispatcher.submit((), Priority::High, hold) {
        Err(error @ DispatchError::QueueFull { queued_max: 2 }) => assert!(error.is_transient()),
        other => panic!("expected QueueFull, got {other:?}"),
    }
    release_tx.send(true).expect("release");
    for job in [running, queued_1, queued_2] {
        job.await.expect("ran").expect("ok");
    }
}

/// Pools are per selector, opened lazily, and an idle connection of one selector is recycled
/// when another needs room.
#[tokio::test(start_paused = true)]
async fn pools_open_lazily_and_recycle_idle_connections_across_selectors() {
    let limiter = limiter(1_000, 1_000, 0);
    let opened = Arc::new(Mutex::new(Vec::new()));
    let log = opened.clone();
    let dispatcher: Dispatcher<String, &'static str> = Dispatcher::start(
        gate(&limiter, config()),
        DispatcherConfig {
            queued_max: 100,
            connections_max: 2,
        },
        move |selector: &&'static str| {
            let mut log = log.lock().expect("lock");
            let name = format!("{selector}#{}", log.len());
            log.push(name.clone());
            async move { Ok(name) }
        },
        DispatchRuntime::Current,
    )
    .expect("dispatcher");
    let used = |selector: &'static str| {
        let dispatcher = dispatcher.clone();
        async move {
            dispatcher
                .run(
                    selector,
                    Priority::Normal,
                    |connection: String| async move { Plain(connection) },
                )
                .await
                .expect("ran")
                .0
        }
    };
    assert!(
        opened.lock().expect("lock").is_empty(),
        "nothing opened before use"
    );
    assert_eq!(used("read-only").await, "read-only#0");
    assert_eq!(used("read-only").await, "read-only#0", "reused");
    assert_eq!(used("read-write").await, "read-write#1");
    assert_eq!(
        used("billing").await,
        "billing#2",
        "recycled the longest idle"
    );
    assert_eq!(
        used("read-write").await,
        "read-write#1",
        "the newer one stayed"
    );
    assert_eq!(
        used("read-only").await,
        "read-only#3",
        "read-only's was recycled"
    );
}

/// A high-priority job submitted behind a saturated backlog of bulk jobs starts within one
/// period: the queue lends it the next free connection, and the engine grants it ahead of
/// the bulk waiters, from the unit the reserve keeps for high priority.
#[tokio::test(start_paused = true)]
async fn high_priority_behind_a_saturated_bulk_backlog_starts_within_one_period() {
    let period = Duration::from_secs(1);
    let limiter = limiter(10, 1_000, 1);
    let dispatcher: Dispatcher<u64, ()> = dispatcher(gate(&limiter, config()), 8, 10_000);
    let bulk_done = Arc::new(AtomicU64::new(0));
    let mut bulk = Vec::new();
    for _ in 0..200 {
        let bulk_done = bulk_done.clone();
        bulk.push(
            dispatcher
                .submit((), Priority::Low, move |_| {
                    let bulk_done = bulk_done.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        bulk_done.fetch_add(1, Ordering::Relaxed);
                        ok()
                    }
                })
                .expect("queued"),
        );
    }
    // Let the backlog saturate the quota for a few periods.
    tokio::time::sleep(3 * period + Duration::from_millis(250)).await;
    let done_before = bulk_done.load(Ordering::Relaxed);
    assert!(done_before < 200, "the backlog is still there");
    let submitted = Instant::now();
    let started = dispatcher
        .run((), Priority::High, |_| async { Plain(Instant::now()) })
        .await
        .expect("ran")
        .0;
    let waited = started - submitted;
    assert!(waited <= period, "the high job waited {waited:?}");
    drop(bulk);
}

/// Callers that occupy every thread of their runtime (here the one thread of a current_thread
/// runtime, blocked in a synchronous sleep) do not stop a dispatcher on its own runtime.
#[test]
fn a_dispatcher_on_its_own_runtime_works_while_callers_block_every_thread() {
    let callers = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let limiter = limiter(1_000, 1_000, 0);
    let dispatcher: Dispatcher<u64, ()> = Dispatcher::start(
        gate(&limiter, config()),
        DispatcherConfig {
            queued_max: 100,
            connections_max: 4,
        },
        |_: &()| async { Ok(0) },
        DispatchRuntime::Dedicated { worker_threads: 1 },
    )
    .expect("dispatcher");
    let ran = Arc::new(AtomicU64::new(0));
    callers.block_on(async {
        let mut jobs = Vec::new();
        for _ in 0..20 {
            let ran = ran.clone();
            jobs.push(
                dispatcher
                    .submit((), Priority::Normal, move |_| {
                        ran.fetch_add(1, Ordering::Relaxed);
                        async { ok() }
                    })
                    .expect("queued"),
            );
        }
        // The caller hogs its only thread and never yields while the jobs run elsewhere.
        let hogging = std::time::Instant::now();
        while ran.load(Ordering::Relaxed) < 20 && hogging.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            ran.load(Ordering::Relaxed),
            20,
            "every job ran while the caller blocked"
        );
        for job in jobs {
            job.await.expect("ran").expect("ok");
        }
    });
}
