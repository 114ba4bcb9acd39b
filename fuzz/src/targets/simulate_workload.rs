//! Workload files of `tollgate simulate`. A workload refused says why; a workload accepted asks
//! only what the engine accepts (every caller's request is decided, never refused as invalid,
//! since a refused closed-loop caller would spin without simulated time passing); and a small
//! one runs on the real engine without any limit overdrawn.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    Limiter, LimiterConfig, ManualClock, MemoryStore, MemoryStoreConfig, PermitSecret, Priority,
    Request,
};
use tollgate_cli::simulate::{Workload, parse, run};
use tollgate_rules::Validate;

/// Workloads at most this long, in simulated seconds, with at most this many callers, are run.
const RUN_S_MAX: f64 = 5.0;
const RUN_CALLERS_MAX: f64 = 8.0;

fn small(workload: &Workload) -> bool {
    let callers: f64 = workload
        .callers
        .iter()
        .map(|caller| match (caller.count, caller.rate) {
            (Some(count), _) => count as f64,
            (_, Some(rate)) => rate * workload.duration_s,
            _ => 0.0,
        })
        .sum();
    workload.duration_s <= RUN_S_MAX && callers <= RUN_CALLERS_MAX
}

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let workload = match parse(text) {
        Ok(workload) => workload,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let limiter = Limiter::new(
        Arc::new(MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 1_000,
                keys_per_limit_max: 1_000,
            },
            Arc::new(ManualClock::new(0)),
        )),
        LimiterConfig {
            wait_max: Duration::ZERO,
            permit_secret: PermitSecret::random(),
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            ..LimiterConfig::default()
        },
    );
    for (name, rule) in &workload.limits {
        let rule = rule
            .validate(name)
            .expect("an accepted workload's limits are valid");
        limiter.set_limit(rule.limit().clone());
    }
    for caller in &workload.callers {
        let names: Vec<&str> = caller.limits.iter().map(String::as_str).collect();
        let mut request = Request::all(&names)
            .cost(caller.cost)
            .priority(Priority::parse(&caller.priority).expect("an accepted priority"));
        if let Some(key) = &caller.key {
            request = request.key(key);
        }
        // Asked once, and given back at once: the answer, granted or denied, is what matters.
        if let Err(error) = runtime.block_on(limiter.try_acquire(&request)) {
            panic!(
                "caller {:?} is accepted, but the engine refuses its request: {error}",
                caller.name
            );
        }
    }
    if small(&workload) {
        let report = runtime
            .block_on(run(&workload, |_| {}))
            .expect("a small workload runs");
        assert!(
            report.overshoots().is_empty(),
            "a limit overdrawn: {:?}",
            report.limits
        );
    }
}
