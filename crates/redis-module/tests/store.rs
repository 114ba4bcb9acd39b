//! The Redis store choosing the module: the store conformance suite on a `redis-server` with
//! the module loaded (started here, on a private port) and the store's module setting `on`;
//! a module of another protocol version refused at connect, naming both; `on` refused without
//! the module; `auto` without it deciding with the library, as before the module. The store's
//! list of what the module refuses is held to the module's own.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{free_port, module_path, redis_server};
use tollgate_conformance::Stores;
use tollgate_redis::{Module, RedisStore, RedisStoreConfig};

/// A `redis-server` of this test process on a private port, with the module loaded or not;
/// it stops when the process ends (a shell watches the process, as no destructor of a static
/// runs). `None`, said loudly, without a `redis-server`.
fn server(with_module: bool) -> Option<u16> {
    server_with(with_module, "")
}

/// `server`, with more of `redis-server`'s arguments.
fn server_with(with_module: bool, more: &str) -> Option<u16> {
    let redis_server = redis_server()?;
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("tollgate-modstore-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("server dir");
    let mut args = format!(
        "'{redis_server}' --port {port} --bind 127.0.0.1 --save '' --appendonly no --dir '{}'",
        dir.display()
    );
    args.push(' ');
    args.push_str(more);
    if with_module {
        let module = module_path();
        args.push_str(&format!(" --loadmodule '{}'", module.display()));
    }
    let watch = format!(
        "{args} >/dev/null 2>&1 & s=$!; while kill -0 {} 2>/dev/null; do sleep 0.5; done; \
         kill $s; rm -rf '{}'",
        std::process::id(),
        dir.display()
    );
    let watcher = Command::new("sh")
        .args(["-c", &watch])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server");
    // Kept, not waited for: it ends with the process.
    static WATCHERS: Mutex<Vec<std::process::Child>> = Mutex::new(Vec::new());
    WATCHERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(watcher);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(port)
}

/// This process's Redis with the module, started once.
fn module_redis() -> Option<u16> {
    static PORT: OnceLock<Option<u16>> = OnceLock::new();
    *PORT.get_or_init(|| server(true))
}

fn config(port: u16, namespace: &str, module: Module) -> RedisStoreConfig {
    RedisStoreConfig {
        url: format!("redis://127.0.0.1:{port}/0"),
        namespace: namespace.to_owned(),
        fail_open: false,
        allow_eviction: false,
        timeout: Duration::from_secs(5),
        keys_per_limit_max: 100_000,
        module,
    }
}

fn namespace(test: &str) -> String {
    let short: String = test
        .chars()
        .filter(|c| c.is_ascii_lowercase() || *c == '_')
        .take(40)
        .collect();
    format!("m-{short}")
}

/// Every store the suite made, to check none needed the library after the module refused.
fn made() -> &'static Mutex<Vec<Arc<RedisStore>>> {
    static MADE: OnceLock<Mutex<Vec<Arc<RedisStore>>>> = OnceLock::new();
    MADE.get_or_init(Mutex::default)
}

async fn on(port: u16, namespace: &str) -> Arc<RedisStore> {
    let store = RedisStore::connect(config(port, namespace, Module::On))
        .await
        .expect("connect with the module on");
    assert!(store.module_in_use());
    let store = Arc::new(store);
    made()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(store.clone());
    store
}

/// Every store the suite made so far sent the module no call the store could have known it
/// refuses: the module refused only for what Redis holds (`REFUSED_IN_REDIS`).
fn unforeseen_refusals_are_none() {
    let made = made()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for store in made.iter() {
        for (reason, count) in store.module_refusals() {
            assert!(
                tollgate_redis::REFUSED_IN_REDIS.contains(&reason.as_str()),
                "{}: the module refused {count} acquire(s) the store should not have sent it: {reason}",
                store.namespace()
            );
        }
    }
}

/// Two stores on one namespace with the module `on`, the namespace declared new.
async fn module_stores(test: &'static str) -> Option<Stores> {
    let port = module_redis()?;
    let namespace = namespace(test);
    on(port, &namespace)
        .await
        .begin_new_namespace()
        .await
        .expect("declare the namespace new");
    unforeseen_refusals_are_none();
    Some(Stores {
        first: on(port, &namespace).await,
        second: on(port, &namespace).await,
    })
}

tollgate_conformance::conformance_tests!(module_stores);

/// The suite's tests of rate and concurrency limits, run here one after another, those of
/// requests that wait among them (places in their counters' queues across the fleet, taken,
/// renewed, left and expired; priorities; a limit's pause waited out): the module decides
/// their acquires, commits, renewals and leaves, and none is refused and decided again by the
/// library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_decides_the_suites_single_counter_acquires_and_commits_without_fallback() {
    let Some(port) = module_redis() else { return };
    let stores = |test: &'static str| async move {
        let namespace = namespace(&format!("seq_{test}"));
        let first = on(port, &namespace).await;
        first.begin_new_namespace().await.expect("declare new");
        let second = on(port, &namespace).await;
        (first, second)
    };
    let mut used = Vec::new();
    macro_rules! run {
        ($($name:ident),*) => {$(
            let (first, second) = stores(stringify!($name)).await;
            tollgate_conformance::$name(Stores { first: first.clone(), second: second.clone() }).await;
            used.push(first);
            used.push(second);
        )*};
    }
    run!(
        rate_limits_grant_to_the_limit_and_hint_honestly,
        commit_refunds_unused_units_once,
        unrefundable_grants_count_the_same_and_refund_nothing,
        costs_are_taken_per_limit_all_or_nothing,
        pauses_stop_grants_and_only_extend,
        random_traffic_never_exceeds_the_limit,
        bulk_and_priority_callers_never_overshoot,
        leases_fence_renew_and_release_once
    );
    let decided: u64 = used.iter().map(|store| store.module_acquires()).sum();
    // A waiter that gave up leaves its places in a task of its own: given a moment.
    let leaves = || -> u64 {
        used.iter()
            .flat_map(|store| store.module_calls())
            .filter(|(command, _)| *command == "TOLLGATE.LEAVE")
            .map(|(_, calls)| calls)
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while leaves() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(leaves() > 0, "the module decided no leave");
    let commits: u64 = used.iter().map(|store| store.module_commits()).sum();
    let renewals: u64 = used
        .iter()
        .flat_map(|store| store.module_calls())
        .filter(|(command, _)| *command == "TOLLGATE.RENEW")
        .map(|(_, calls)| calls)
        .sum();
    assert!(renewals > 0, "the module renewed no lease");
    let fallbacks: u64 = used.iter().map(|store| store.module_fallbacks()).sum();
    assert!(decided > 0, "the module decided no acquire");
    assert!(commits > 0, "the module decided no commit");
    assert_eq!(
        fallbacks, 0,
        "calls the module refused, decided by the library"
    );
    unforeseen_refusals_are_none();
}

/// A store that watches Redis's evictions (a policy that may evict, allowed) flags every call
/// and names the slot's evictions record: the module decides those calls too (acquires, waiting
/// or not, commits, renewals, leaves, pauses and usage), none refused, and the records it keeps
/// are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_watching_evictions_has_the_module_decide_its_calls() {
    let Some(port) = server_with(true, "--maxmemory-policy allkeys-lru") else {
        return;
    };
    let watching = |test: &'static str| async move {
        let namespace = namespace(&format!("ev_{test}"));
        let connect = || async {
            let config = RedisStoreConfig {
                allow_eviction: true,
                ..config(port, &namespace, Module::On)
            };
            Arc::new(
                RedisStore::connect(config)
                    .await
                    .expect("connect, evictions allowed"),
            )
        };
        let first = connect().await;
        first.begin_new_namespace().await.expect("declare new");
        let second = connect().await;
        (first, second)
    };
    let mut used = Vec::new();
    macro_rules! run {
        ($($name:ident),*) => {$(
            let (first, second) = watching(stringify!($name)).await;
            tollgate_conformance::$name(Stores { first: first.clone(), second: second.clone() }).await;
            used.push(first);
            used.push(second);
        )*};
    }
    run!(
        rate_limits_grant_to_the_limit_and_hint_honestly,
        commit_refunds_unused_units_once,
        leases_fence_renew_and_release_once,
        pauses_stop_grants_and_only_extend,
        usage_shows_what_is_counted_and_takes_nothing,
        random_traffic_never_exceeds_the_limit
    );
    let calls = |command: &str| -> u64 {
        used.iter()
            .flat_map(|store| store.module_calls())
            .filter(|(name, _)| *name == command)
            .map(|(_, calls)| calls)
            .sum()
    };
    for command in [
        "TOLLGATE.ACQUIRE",
        "TOLLGATE.COMMIT",
        "TOLLGATE.RENEW",
        "TOLLGATE.PAUSE",
        "TOLLGATE.USAGE",
        "TOLLGATE.BEGIN",
    ] {
        assert!(calls(command) > 0, "the module decided no {command}");
    }
    let fallbacks: u64 = used.iter().map(|store| store.module_fallbacks()).sum();
    assert_eq!(
        fallbacks, 0,
        "calls the module refused, decided by the library"
    );
    // The evictions records the calls kept (one per namespace: one Redis, one slot).
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.write_all(b"EVAL \"return #redis.call('KEYS', '*:evicted')\" 0\r\n")
        .expect("send");
    let mut answer = [0u8; 64];
    let read = conn.read(&mut answer).expect("read");
    let answer = String::from_utf8_lossy(&answer[..read]).into_owned();
    let records: usize = answer
        .trim()
        .trim_start_matches(':')
        .parse()
        .unwrap_or_else(|_| panic!("a count of records: {answer:?}"));
    assert!(records >= 6, "evictions records kept: {records}");
}

/// The suite's tests of pauses, resumes, usage and charges, run here one after another: the
/// module decides them (and each namespace's begin), none refused and decided again by the
/// library. (Their concurrency limits' keys' pauses, resumes and usage go to the library
/// unsent, as the store knows the module refuses them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_decides_the_suites_pauses_usage_and_charges_without_fallback() {
    let Some(port) = module_redis() else { return };
    let mut used = Vec::new();
    macro_rules! run {
        ($($name:ident),*) => {$(
            let name = namespace(&format!("ops_{}", stringify!($name)));
            let first = on(port, &name).await;
            assert!(first.begin_new_namespace().await.expect("declare new"), "a new namespace");
            let second = on(port, &name).await;
            tollgate_conformance::$name(Stores { first: first.clone(), second: second.clone() }).await;
            used.push(first);
            used.push(second);
        )*};
    }
    run!(
        pauses_stop_grants_and_only_extend,
        pauses_are_lifted_cut_and_not_inherited,
        usage_shows_what_is_counted_and_takes_nothing,
        charges_count_past_the_limit_and_are_paid_first
    );
    for command in [
        "TOLLGATE.PAUSE",
        "TOLLGATE.RESUME",
        "TOLLGATE.USAGE",
        "TOLLGATE.CHARGE",
        "TOLLGATE.BEGIN",
    ] {
        let decided: u64 = used
            .iter()
            .flat_map(|store| store.module_calls())
            .filter(|(name, _)| *name == command)
            .map(|(_, calls)| calls)
            .sum();
        assert!(decided > 0, "the module decided no {command}");
    }
    let fallbacks: u64 = used.iter().map(|store| store.module_fallbacks()).sum();
    assert_eq!(
        fallbacks, 0,
        "calls the module refused, decided by the library"
    );
    unforeseen_refusals_are_none();
}

#[tokio::test]
async fn a_module_of_another_version_is_refused_naming_both() {
    let Some(port) = module_redis() else { return };
    let expected = tollgate_redis::PROTOCOL_VERSION + 1;
    for module in [Module::Auto, Module::On] {
        let refusal = RedisStore::connect_expecting(config(port, "m-version", module), expected)
            .await
            .expect_err("a module of another version is refused");
        let text = refusal.to_string();
        assert!(
            text.contains(&format!("version {}", tollgate_redis::PROTOCOL_VERSION))
                && text.contains(&format!("version {expected}")),
            "{text}"
        );
    }
    // Off: the module is not asked.
    let store = RedisStore::connect_expecting(config(port, "m-version", Module::Off), expected)
        .await
        .expect("off ignores the module");
    assert!(!store.module_in_use());
}

#[tokio::test]
async fn on_without_the_module_refuses_to_start_and_auto_uses_the_library() {
    let Some(port) = server(false) else { return };
    let refusal = RedisStore::connect(config(port, "m-plain", Module::On))
        .await
        .expect_err("on without the module is refused");
    assert!(refusal.to_string().contains("not loaded"), "{refusal}");

    let store = Arc::new(
        RedisStore::connect(config(port, "m-plain", Module::Auto))
            .await
            .expect("auto without the module"),
    );
    assert!(!store.module_in_use());
    store.begin_new_namespace().await.expect("declare new");
    let second = Arc::new(
        RedisStore::connect(config(port, "m-plain", Module::Auto))
            .await
            .expect("connect"),
    );
    tollgate_conformance::rate_limits_grant_to_the_limit_and_hint_honestly(Stores {
        first: store.clone(),
        second,
    })
    .await;
    assert_eq!(store.module_acquires(), 0);
}

/// Acquires in flight together on one slot go to the module in batches, as they went to the
/// library: every one decided natively, fewer calls than acquires (Redis's own count of
/// `TOLLGATE.ACQUIRE` calls), and no more grants than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_in_flight_together_go_to_the_module_in_batches() {
    let Some(port) = module_redis() else { return };
    let namespace = namespace("batched_in_flight");
    let store = on(port, &namespace).await;
    store.begin_new_namespace().await.expect("declare new");
    let limiter = Arc::new(tollgate::Limiter::new(
        store.clone(),
        tollgate::LimiterConfig {
            permit_secret: tollgate::PermitSecret::random(),
            ..tollgate::LimiterConfig::default()
        },
    ));
    let policy = tollgate::Policy::rate(
        150,
        60_000_000,
        0,
        tollgate::Algorithm::Gcra { burst: 150 },
        tollgate::Reserve::default(),
    )
    .expect("a policy");
    limiter.set_limit(tollgate::Limit::new("batched", policy, Some("user")).expect("a limit"));
    let calls_before = native_calls(port);
    let tasks: Vec<_> = (0..400)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let request = tollgate::Request::new("batched").key("one");
                limiter.try_acquire(&request).await.expect("an answer")
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        if task.await.expect("the task").is_granted() {
            granted += 1;
        }
    }
    let calls = native_calls(port) - calls_before;
    eprintln!(
        "400 acquires: {granted} granted, {} by the module in {calls} calls, {} batched",
        store.module_acquires(),
        store.batched_acquires()
    );
    assert_eq!(granted, 150, "the limit's burst, exactly");
    assert_eq!(
        store.module_acquires(),
        400,
        "every acquire decided natively"
    );
    assert_eq!(store.module_fallbacks(), 0);
    assert!(store.batched_acquires() > 0, "acquires went together");
    assert!(calls < 400, "fewer calls than acquires: {calls}");
}

/// `TOLLGATE.ACQUIRE` calls the Redis on `port` has run, by its own `INFO commandstats`.
fn native_calls(port: u16) -> u64 {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "commandstats"])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_tollgate.acquire:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.trim().parse().ok())
        .unwrap_or(0)
}

/// The store's lists of refusals (an acquire's, a commit's, a renewal's, a leave's, the other
/// operations', and those only Redis can see) are
/// the module's refusals, text for text.
#[test]
fn the_stores_refusals_are_the_modules() {
    let mut module: Vec<&str> = Vec::new();
    // Each refusal's text, the literal after `not_native(` (on its line or the next) or after
    // `return Err(` (a stored value's decoding).
    for source in [
        include_str!("../src/acquire.rs"),
        include_str!("../src/commit.rs"),
        include_str!("../src/queue.rs"),
        include_str!("../src/leases.rs"),
        include_str!("../src/operations.rs"),
    ] {
        for marker in ["not_native(", "return Err("] {
            for (at, _) in source.match_indices(marker) {
                let rest = source[at + marker.len()..].trim_start();
                if let Some(text) = rest.strip_prefix('"') {
                    module.push(&text[..text.find('"').expect("closing quote")]);
                }
            }
        }
    }
    let mut store: Vec<&str> = tollgate_redis::REFUSED_BEFORE_SENDING
        .iter()
        .chain(tollgate_redis::COMMIT_REFUSED_BEFORE_SENDING)
        .chain(tollgate_redis::LEAVE_REFUSED_BEFORE_SENDING)
        .chain(tollgate_redis::RENEW_REFUSED_BEFORE_SENDING)
        .chain(tollgate_redis::OPERATIONS_REFUSED_BEFORE_SENDING)
        .chain(tollgate_redis::REFUSED_IN_REDIS)
        .copied()
        .collect();
    module.sort_unstable();
    store.sort_unstable();
    assert_eq!(module, store);
}
