//! `tollgate simulate`: capacity planning on the real engine. A workload (limits with the admin
//! API's fields, and callers: closed-loop workers or open-loop Poisson arrivals, with priority,
//! cost, call duration and wait deadline, and optionally a vendor (`vendor`) behind one limit,
//! with a true limit of its own that the callers pause on and learn from as outbound clients
//! do) runs through the same `Limiter` and `MemoryStore` the server uses, on a virtual clock:
//! tokio's paused time, which the store's clock follows, so an hour of traffic runs in seconds
//! and the same seed gives the same figures.
//!
//! The report counts independently of the store: every grant is recorded by the callers, and
//! the most units in any window of each limit's period is computed from those records; the
//! vendor's figures come from the vendor's own arrival log.

mod vendor;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate::{
    Algorithm, Clock, Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, MonotonicClock,
    Outcome, PermitSecret, Priority, Request,
};
use tollgate_rules::{RawRule, Validate};

pub use vendor::{LoadCurve, Step, Vendor, VendorReport, VendorWindow};

/// Longest simulated span: a week.
pub const DURATION_S_MAX: f64 = 7.0 * 86_400.0;
/// Most workers and arrivals a workload may start, so a typo cannot exhaust memory.
pub const CALLERS_MAX: u64 = 100_000;

/// A workload file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Simulated seconds.
    pub duration_s: f64,
    /// The random seed of open-loop arrivals (and nothing else).
    #[serde(default)]
    pub seed: u64,
    /// Limits by name, with the admin API's fields (`kind`, `limit`, `period_ms`, ...).
    pub limits: BTreeMap<String, RawRule>,
    pub callers: Vec<Caller>,
    /// A vendor behind one limit that refuses (429) when called more than its own limit.
    #[serde(default)]
    pub vendor: Option<Vendor>,
    /// Whether the callers teach the limiter what the vendor answers (its advertised limit,
    /// none remaining until its reset, a 429 that advertised nothing), as outbound clients do
    /// by default; `false`: they only pause the limit for a 429's `Retry-After`.
    #[serde(default = "yes")]
    pub learn: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caller {
    pub name: String,
    pub limits: Vec<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default = "normal")]
    pub priority: String,
    #[serde(default = "one")]
    pub cost: u64,
    /// Closed loop: this many workers, each calling again as soon as its call ends.
    #[serde(default)]
    pub count: Option<u64>,
    /// Open loop: calls arriving at this rate per second (Poisson), each trying once.
    #[serde(default)]
    pub rate: Option<f64>,
    /// How long a call takes once granted, in milliseconds (a lease is held that long).
    #[serde(default)]
    pub call_ms: u64,
    /// How long a call waits for a permit before it gives up, in milliseconds.
    #[serde(default)]
    pub wait_ms: u64,
}

fn normal() -> String {
    "normal".to_owned()
}

fn one() -> u64 {
    1
}

fn yes() -> bool {
    true
}

/// Percentiles of waits, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Waits {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// What became of one caller's calls. Every call offered is in exactly one place:
/// `offered = granted + gave_up.at_once + gave_up.at_deadline + unfinished + errors`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallerReport {
    pub name: String,
    pub priority: String,
    /// How long the caller is willing to wait for a permit (`wait_ms` of the workload).
    pub wait_limit_ms: u64,
    pub offered: u64,
    pub granted: u64,
    /// Waits of the granted calls, from asking to the grant.
    pub wait_ms: Waits,
    pub gave_up: GaveUp,
    /// Calls still waiting for a permit when the run ended.
    pub unfinished: u64,
    /// Calls the engine answered with an error (none, unless something is broken).
    pub errors: u64,
    /// The figures above in one sentence.
    pub summary: String,
}

/// Calls refused a permit, and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GaveUp {
    /// Refused when asked: the engine saw that nothing would free up within the caller's wait
    /// (or the limit was paused past it), so it did not queue the call.
    pub at_once: u64,
    /// Queued, then refused when the caller's wait ran out.
    pub at_deadline: u64,
    /// Both, by the engine's reason (`capacity`, `paused`, `queued`, `recovering`).
    pub by_reason: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LimitReport {
    pub name: String,
    /// What the algorithm allows in one window: the limit (sliding: in any window of the
    /// period and margin; fixed: in each aligned window), the burst plus what the rate adds in
    /// one period (gcra), or the leases held at once (concurrency).
    pub limit: u64,
    /// The most units granted in such a window, or the most leases held at once, counted from
    /// the grants the callers recorded at their decisions' instants.
    pub max_in_window: u64,
    /// Units granted over units available, in the windows where some call waited or gave up:
    /// how much of the limit was used while demand exceeded it. `None` when demand never did.
    pub utilization: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub duration_s: f64,
    pub limits: Vec<LimitReport>,
    pub callers: Vec<CallerReport>,
    /// What the vendor counted, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<VendorReport>,
    /// For the chart: per limit, units granted in each window (its period, or a hundredth of
    /// the run for a concurrency limit) by priority: high, normal, low.
    #[serde(skip)]
    pub windows: BTreeMap<String, Vec<[u64; 3]>>,
}

impl Report {
    /// Limits whose independent count went over the limit: never, if the engine is right.
    pub fn overshoots(&self) -> Vec<&LimitReport> {
        self.limits
            .iter()
            .filter(|limit| limit.max_in_window > limit.limit)
            .collect()
    }
}

/// What one caller saw.
#[derive(Clone, Debug, Default)]
struct CallerRecord {
    offered: u64,
    granted: u64,
    /// Waits of granted calls (µs).
    waits: Vec<u64>,
    gave_up: GaveUp,
    errors: u64,
}

/// What the callers saw, recorded as it happened (microseconds on the store's clock).
#[derive(Debug, Default)]
struct Record {
    callers: Vec<CallerRecord>,
    /// Per limit: (granted at, released at, cost, priority).
    grants: BTreeMap<String, Vec<(u64, u64, u64, Priority)>>,
    /// Per limit: the instants a call waited or gave up.
    contended: BTreeMap<String, Vec<u64>>,
    /// The vendor's own record.
    vendor: vendor::Log,
}

fn invalid(text: String) -> anyhow::Error {
    anyhow::anyhow!(text)
}

/// Read and check a workload: every limit valid, every caller naming known limits with one of
/// `count` or `rate` and asking what the engine can grant, every figure in range.
pub fn parse(text: &str) -> anyhow::Result<Workload> {
    let workload: Workload = toml::from_str(text).map_err(|error| invalid(error.to_string()))?;
    if !(workload.duration_s > 0.0 && workload.duration_s <= DURATION_S_MAX) {
        return Err(invalid(format!(
            "duration_s: must be above 0 and at most {DURATION_S_MAX} (a week)"
        )));
    }
    let mut rules = BTreeMap::new();
    for (name, rule) in &workload.limits {
        let rule = rule
            .validate(name)
            .map_err(|error| invalid(format!("limits.{name}.{}: {}", error.field, error.reason)))?;
        rules.insert(name.as_str(), rule);
    }
    let mut started = 0.0;
    for (index, caller) in workload.callers.iter().enumerate() {
        let at = |field: &str| format!("callers[{index}] ({}).{field}", caller.name);
        for limit in &caller.limits {
            if !workload.limits.contains_key(limit) {
                return Err(invalid(format!(
                    "{}: no limit named {limit:?}",
                    at("limits")
                )));
            }
        }
        if caller.limits.is_empty() {
            return Err(invalid(format!(
                "{}: name at least one limit",
                at("limits")
            )));
        }
        let priority = Priority::parse(&caller.priority)
            .ok_or_else(|| invalid(format!("{}: high, normal or low", at("priority"))))?;
        match (caller.count, caller.rate) {
            (Some(count), None) if count >= 1 => started += count as f64,
            (None, Some(rate)) if rate > 0.0 && rate.is_finite() => {
                started += rate * workload.duration_s
            }
            _ => {
                return Err(invalid(format!(
                    "{}: give either count (workers, at least 1) or rate (calls per second, above 0)",
                    at("count")
                )));
            }
        }
        if caller.cost == 0 {
            return Err(invalid(format!("{}: must be at least 1", at("cost"))));
        }
        check_request(caller, priority, &rules)
            .map_err(|(field, reason)| invalid(format!("{}: {reason}", at(field))))?;
    }
    if started > CALLERS_MAX as f64 {
        return Err(invalid(format!(
            "callers: {started:.0} workers and arrivals in all; at most {CALLERS_MAX}"
        )));
    }
    if let Some(vendor) = &workload.vendor {
        let Some(rule) = rules.get(vendor.guarded_by.as_str()) else {
            return Err(invalid(format!(
                "vendor.guarded_by: no limit named {:?}",
                vendor.guarded_by
            )));
        };
        // Only a rate limit of one counter learns; pausing alone works on any limit.
        let limit = rule.limit();
        let learns =
            matches!(limit.policy().kind(), tollgate::core::Kind::Rate(_)) && limit.per().is_none();
        if workload.learn && !learns {
            return Err(invalid(format!(
                "vendor.guarded_by: limit {:?} cannot learn (only a rate limit not counted per key does); name one or set learn = false",
                vendor.guarded_by
            )));
        }
        vendor.check(workload.duration_s).map_err(invalid)?;
    }
    Ok(workload)
}

/// Why the engine would refuse every request of `caller`, if it would: a closed-loop caller
/// refused asks again at once, forever, and simulated time would never pass.
fn check_request(
    caller: &Caller,
    priority: Priority,
    rules: &BTreeMap<&str, tollgate_rules::Rule>,
) -> Result<(), (&'static str, String)> {
    if caller.limits.len() > tollgate::COUNTERS_PER_REQUEST_MAX {
        return Err((
            "limits",
            format!(
                "at most {} limits per request",
                tollgate::COUNTERS_PER_REQUEST_MAX
            ),
        ));
    }
    if let Some(key) = &caller.key {
        tollgate::check_key(key).map_err(|reason| ("key", reason))?;
    }
    for (index, name) in caller.limits.iter().enumerate() {
        if caller.limits[..index].contains(name) {
            return Err(("limits", format!("limit {name:?} is named twice")));
        }
        let Some(limit) = rules.get(name.as_str()).map(|rule| rule.limit()) else {
            continue;
        };
        if let (Some(per), None) = (limit.per(), &caller.key) {
            return Err((
                "key",
                format!("limit {name:?} is counted per {per}: give a key"),
            ));
        }
        let open = limit.policy().capacity_for(priority);
        if caller.cost > open {
            return Err((
                "cost",
                format!(
                    "must be at most {open}: limit {name:?} can never grant more at priority {}",
                    priority.as_str()
                ),
            ));
        }
    }
    Ok(())
}

/// Run a workload. With `virtual_time`, on tokio's paused clock (call from a current-thread
/// runtime started paused); otherwise on the wall clock, for comparing the two. `progress` is
/// told the simulated fraction done, about every 1 %.
pub async fn run(
    workload: &Workload,
    progress: impl Fn(f64) + Send + Sync + 'static,
) -> anyhow::Result<Report> {
    let clock = Arc::new(MonotonicClock::new());
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig {
            keys_tracked_max: 1_000_000,
            keys_per_limit_max: 1_000_000,
        },
        clock.clone(),
    ));
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            wait_max: Duration::from_secs(86_400),
            permit_secret: PermitSecret::random(),
            // A workload's callers wait by design, as many as it says: the caps that keep a
            // server's waiting bounded under a flood are not what a simulation measures.
            waiters_max: usize::MAX,
            waiters_per_limit_max: usize::MAX,
            pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
            learn: tollgate::LearnConfig::default(),
            shares: tollgate::Shares::default(),
        },
    );
    for (name, rule) in &workload.limits {
        let rule = rule
            .validate(name)
            .map_err(|error| invalid(format!("limits.{name}: {error}")))?;
        limiter.set_limit(rule.limit().clone());
    }
    let started = tokio::time::Instant::now();
    let started_us = clock.now_us();
    let end = started + Duration::from_secs_f64(workload.duration_s);
    let record = Arc::new(Mutex::new(Record {
        callers: vec![CallerRecord::default(); workload.callers.len()],
        ..Record::default()
    }));
    let vendor = match &workload.vendor {
        Some(vendor) => Some(Arc::new(
            vendor.check(workload.duration_s).map_err(invalid)?,
        )),
        None => None,
    };
    let mut tasks = tokio::task::JoinSet::new();
    let mut rng = fastrand::Rng::with_seed(workload.seed);
    for (index, caller) in workload.callers.iter().enumerate() {
        let call = Call {
            index,
            caller: Arc::new(caller.clone()),
            limiter: limiter.clone(),
            record: record.clone(),
            vendor: vendor.clone(),
            learn: workload.learn,
            clock: clock.clone(),
            started_us,
        };
        if let Some(count) = caller.count {
            for _ in 0..count {
                let call = call.clone();
                tasks.spawn(async move {
                    while tokio::time::Instant::now() < end {
                        call.once().await;
                    }
                });
            }
        } else if let Some(rate) = caller.rate {
            // Arrival instants drawn now, from the seed alone: the same workload, the same calls.
            let mut at = 0.0;
            let mut arrivals = Vec::new();
            loop {
                at += -(1.0 - rng.f64()).ln() / rate;
                if at >= workload.duration_s {
                    break;
                }
                arrivals.push(at);
            }
            tasks.spawn(async move {
                let mut calls = tokio::task::JoinSet::new();
                for at in arrivals {
                    tokio::time::sleep_until(started + Duration::from_secs_f64(at)).await;
                    let call = call.clone();
                    calls.spawn(async move { call.once().await });
                }
                while calls.join_next().await.is_some() {}
            });
        }
    }
    let step = Duration::from_secs_f64(workload.duration_s / 100.0);
    let reporter = tokio::spawn(async move {
        for percent in 1..=100 {
            tokio::time::sleep_until(started + step * percent).await;
            progress(f64::from(percent) / 100.0);
        }
    });
    tokio::time::sleep_until(end).await;
    // Calls still waiting or running at the end are cut off where they stand.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    reporter.abort();
    // An aborted call may not be dropped yet, so the record is taken rather than unwrapped.
    let record = std::mem::take(
        &mut *record
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    Ok(report(
        workload,
        &limiter,
        vendor.as_deref(),
        record,
        started_us,
    ))
}

#[derive(Clone)]
struct Call {
    index: usize,
    caller: Arc<Caller>,
    limiter: Limiter,
    record: Arc<Mutex<Record>>,
    vendor: Option<Arc<vendor::Model>>,
    learn: bool,
    /// The store's clock: grants are recorded at their decision's instant on it.
    clock: Arc<MonotonicClock>,
    /// The run's start on that clock: the vendor's own clock starts there.
    started_us: u64,
}

impl Call {
    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One call: wait for a permit, make the call, give it back.
    async fn once(&self) {
        let caller = &*self.caller;
        let priority = Priority::parse(&caller.priority).unwrap_or_default();
        let names: Vec<&str> = caller.limits.iter().map(String::as_str).collect();
        let mut request = Request::all(&names)
            .cost(caller.cost)
            .priority(priority)
            .wait(Duration::from_millis(caller.wait_ms));
        if let Some(key) = &caller.key {
            request = request.key(key);
        }
        let asked = self.clock.now_us();
        self.record().callers[self.index].offered += 1;
        let outcome = match self.limiter.acquire(&request).await {
            Ok(outcome) => outcome,
            Err(_) => {
                self.record().callers[self.index].errors += 1;
                // As a refused worker does: never ask again at the same instant.
                tokio::time::sleep(Duration::from_millis(1)).await;
                return;
            }
        };
        let now = self.clock.now_us();
        match outcome {
            Outcome::Denied(denied) => {
                {
                    let mut record = self.record();
                    let gave_up = &mut record.callers[self.index].gave_up;
                    if now > asked {
                        gave_up.at_deadline += 1;
                    } else {
                        gave_up.at_once += 1;
                    }
                    *gave_up
                        .by_reason
                        .entry(denied.reason.as_str().to_owned())
                        .or_default() += 1;
                    for name in &caller.limits {
                        record.contended.entry(name.clone()).or_default().push(now);
                    }
                }
                // A closed-loop worker tries again when told, not at once.
                tokio::time::sleep(denied.retry_after.max(Duration::from_millis(1))).await;
            }
            Outcome::Granted(permit) => {
                let granted_at = permit.decided_at_us();
                let answer = self.call_vendor(now);
                {
                    let mut record = self.record();
                    record.callers[self.index].granted += 1;
                    record.callers[self.index].waits.push(now - asked);
                    if now > asked {
                        for name in &caller.limits {
                            record
                                .contended
                                .entry(name.clone())
                                .or_default()
                                .push(asked);
                        }
                    }
                }
                // The call is the request to the vendor: its answer comes back when it ends,
                // and is acted on before the permit is given back, as outbound clients do.
                tokio::time::sleep(Duration::from_millis(caller.call_ms)).await;
                if let Some(answer) = answer {
                    self.answered(&answer).await;
                }
                let released = self.clock.now_us();
                {
                    let mut record = self.record();
                    for name in &caller.limits {
                        record.grants.entry(name.clone()).or_default().push((
                            granted_at,
                            released,
                            caller.cost,
                            priority,
                        ));
                    }
                }
                let _ = permit.commit(caller.cost).await;
            }
        }
    }

    /// The call reaches the vendor now, if this caller's calls go through the limit that
    /// guards it; the vendor counts it and answers.
    fn call_vendor(&self, now: u64) -> Option<vendor::Answer> {
        let vendor = self.vendor.as_deref()?;
        if !self.caller.limits.contains(&vendor.guarded_by) {
            return None;
        }
        let at = now.saturating_sub(self.started_us);
        Some(vendor.arrive(&mut self.record().vendor, at))
    }

    /// The vendor's answer reached this caller: as an outbound client, teach the limiter what
    /// it said (when learning), pause the limit until the vendor's reset when none remains
    /// (what the server's `/v1/learn` does), and pause it for a 429's `Retry-After`.
    async fn answered(&self, answer: &vendor::Answer) {
        let Some(vendor) = self.vendor.as_deref() else {
            return;
        };
        let now = self.clock.now_us().saturating_sub(self.started_us);
        let lesson = {
            let mut record = self.record();
            if self.learn {
                record.vendor.lesson(answer, now)
            } else {
                record.vendor.answered(now);
                None
            }
        };
        if let Some(teach) = lesson {
            let (quotas, rate_limited, source) = match teach {
                vendor::Teach::Quota(quota) => (
                    vec![tollgate::AdvertisedQuota {
                        quota,
                        window: Some(Duration::from_micros(vendor.period_us())),
                    }],
                    false,
                    vendor::SOURCE_HEADERS,
                ),
                vendor::Teach::RateLimited => (Vec::new(), true, vendor::SOURCE_REFUSAL),
            };
            // A lesson that fails is dropped, as clients drop it: the call itself stands.
            let _ = self.limiter.learn(
                &vendor.guarded_by,
                &tollgate::Lesson {
                    source,
                    quotas: &quotas,
                    rate_limited,
                },
            );
            if let Some(headers) = answer.headers.filter(|headers| headers.remaining == 0) {
                // As `/v1/learn` does: a pause to the vendor's reset.
                let reset = Duration::from_micros(headers.reset_at_us.saturating_sub(now));
                if self
                    .limiter
                    .vendor_exhausted(&vendor.guarded_by, reset)
                    .await
                    .is_ok_and(|paused| !paused.is_zero())
                {
                    self.record().vendor.paused();
                }
            }
        }
        if let Some(pause) = vendor.retry_after_us(answer, now).filter(|us| *us > 0)
            && self
                .limiter
                .pause(&vendor.guarded_by, None, Duration::from_micros(pause))
                .await
                .is_ok()
        {
            self.record().vendor.paused();
        }
    }
}

/// The most units granted in any half-open window of `width` microseconds.
fn most_in_any_window(times: &[(u64, u64)], width: u64) -> u64 {
    let (mut most, mut sum, mut first) = (0, 0, 0);
    for &(at, cost) in times {
        sum += cost;
        while times[first].0 + width <= at {
            sum -= times[first].1;
            first += 1;
        }
        most = most.max(sum);
    }
    most
}

fn percentile(sorted: &[u64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index] as f64 / 1_000.0
}

fn report(
    workload: &Workload,
    limiter: &Limiter,
    vendor: Option<&vendor::Model>,
    record: Record,
    started_us: u64,
) -> Report {
    let table = limiter.limits();
    let duration_us = (workload.duration_s * 1e6) as u64;
    let mut windows = BTreeMap::new();
    for (name, grants) in &record.grants {
        let Some(limit) = table.get(name) else {
            continue;
        };
        let width = match limit.configured().kind() {
            tollgate::core::Kind::Rate(rate) => rate.window_us(),
            tollgate::core::Kind::Concurrency(_) => duration_us.div_ceil(100),
        }
        .max(1);
        let slots = usize::try_from(duration_us.div_ceil(width))
            .unwrap_or(0)
            .min(10_000);
        let mut counts = vec![[0u64; 3]; slots];
        for &(at, _, cost, priority) in grants {
            let level = match priority {
                Priority::High => 0,
                Priority::Normal => 1,
                _ => 2,
            };
            let slot = usize::try_from(at.saturating_sub(started_us) / width).unwrap_or(usize::MAX);
            if let Some(window) = counts.get_mut(slot) {
                window[level] += cost;
            }
        }
        windows.insert(name.clone(), counts);
    }
    let limits = workload
        .limits
        .keys()
        .filter_map(|name| {
            let limit = table.get(name)?;
            let grants = record.grants.get(name).map(Vec::as_slice).unwrap_or(&[]);
            let (bound, max_in_window, utilization) = match limit.configured().kind() {
                tollgate::core::Kind::Rate(rate) => {
                    let mut times: Vec<(u64, u64)> = grants.iter().map(|g| (g.0, g.2)).collect();
                    times.sort_unstable();
                    let window = rate.window_us().max(1);
                    let (bound, most) = match rate.algorithm() {
                        // Aligned windows on the store's clock, each at most `limit`.
                        Algorithm::Fixed => {
                            let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
                            for (at, cost) in &times {
                                *per_window.entry(at / window).or_default() += cost;
                            }
                            (
                                rate.limit(),
                                per_window.values().copied().max().unwrap_or(0),
                            )
                        }
                        // Any window of one period: the burst, and what the rate adds in it.
                        Algorithm::Gcra { burst } => (
                            burst + rate.limit() - 1,
                            most_in_any_window(&times, rate.period_us()),
                        ),
                        Algorithm::Sliding => (rate.limit(), most_in_any_window(&times, window)),
                    };
                    let contended = record.contended.get(name).map(Vec::as_slice).unwrap_or(&[]);
                    let (mut used, mut offered) = (0u64, 0u64);
                    for slot in 0..duration_us.div_ceil(window) {
                        let from = started_us + slot * window;
                        let to = from + window;
                        if contended.iter().any(|&at| at >= from && at < to) {
                            used += times
                                .iter()
                                .filter(|(at, _)| *at >= from && *at < to)
                                .map(|(_, cost)| cost)
                                .sum::<u64>();
                            offered += rate.limit();
                        }
                    }
                    (
                        bound,
                        most,
                        (offered > 0).then(|| used as f64 / offered as f64),
                    )
                }
                tollgate::core::Kind::Concurrency(concurrency) => {
                    let mut events: Vec<(u64, i64)> = grants
                        .iter()
                        .flat_map(|g| [(g.0, g.2 as i64), (g.1, -(g.2 as i64))])
                        .collect();
                    // Releases before grants at one instant: a slot freed and taken is one slot.
                    events.sort_unstable_by_key(|&(at, delta)| (at, delta));
                    let (mut held, mut most) = (0i64, 0i64);
                    for (_, delta) in events {
                        held += delta;
                        most = most.max(held);
                    }
                    (concurrency.limit(), u64::try_from(most).unwrap_or(0), None)
                }
            };
            Some(LimitReport {
                name: name.clone(),
                limit: bound,
                max_in_window,
                utilization,
            })
        })
        .collect();
    let callers = workload
        .callers
        .iter()
        .zip(record.callers)
        .map(|(caller, mut seen)| {
            seen.waits.sort_unstable();
            let gave_up = seen.gave_up.at_once + seen.gave_up.at_deadline;
            let mut report = CallerReport {
                name: caller.name.clone(),
                priority: caller.priority.clone(),
                wait_limit_ms: caller.wait_ms,
                offered: seen.offered,
                granted: seen.granted,
                wait_ms: Waits {
                    p50: percentile(&seen.waits, 0.50),
                    p99: percentile(&seen.waits, 0.99),
                    max: percentile(&seen.waits, 1.0),
                },
                unfinished: seen
                    .offered
                    .saturating_sub(seen.granted + gave_up + seen.errors),
                gave_up: seen.gave_up,
                errors: seen.errors,
                summary: String::new(),
            };
            report.summary = summary(&report);
            report
        })
        .collect();
    Report {
        duration_s: workload.duration_s,
        limits,
        callers,
        vendor: vendor.map(|model| {
            let mut report = model.report(&record.vendor, duration_us, workload.learn);
            if let Some(learned) = limiter.learned(&model.guarded_by) {
                report.effective_at_end = Some(learned.effective);
                report.configured = Some(learned.configured);
            }
            report
        }),
        windows,
    }
}

/// One caller's figures in one sentence: how long its granted calls waited, and how many gave up
/// and why.
fn summary(caller: &CallerReport) -> String {
    let mut text = format!(
        "{} ({}): {} of {} calls granted",
        caller.name, caller.priority, caller.granted, caller.offered
    );
    if caller.granted > 0 {
        text.push_str(&format!(
            ", after waiting {:.0} ms at p50, {:.0} ms at p99 and {:.0} ms at most",
            caller.wait_ms.p50, caller.wait_ms.p99, caller.wait_ms.max
        ));
    }
    let GaveUp {
        at_once,
        at_deadline,
        by_reason,
    } = &caller.gave_up;
    if at_once + at_deadline == 0 {
        text.push_str("; none gave up");
    } else {
        let mut why = Vec::new();
        if *at_once > 0 {
            why.push(format!(
                "{at_once} refused when asked, as no room would open within their {} ms wait",
                caller.wait_limit_ms
            ));
        }
        if *at_deadline > 0 {
            why.push(format!(
                "{at_deadline} queued until their {} ms wait ran out",
                caller.wait_limit_ms
            ));
        }
        let reasons: Vec<String> = by_reason
            .iter()
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        text.push_str(&format!(
            "; {} gave up: {} (by reason: {})",
            at_once + at_deadline,
            why.join(", "),
            reasons.join(", ")
        ));
    }
    if caller.unfinished > 0 {
        text.push_str(&format!(
            "; {} still waiting when the run ended",
            caller.unfinished
        ));
    }
    if caller.errors > 0 {
        text.push_str(&format!("; {} answered with an error", caller.errors));
    }
    text.push('.');
    text
}

/// The report as a table for people, and each caller in a sentence.
pub fn table(report: &Report) -> String {
    let mut out = format!("simulated {} s\n\n", report.duration_s);
    out.push_str(&format!(
        "{:<20} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
        "CALLER",
        "PRIORITY",
        "OFFERED",
        "GRANTED",
        "WAIT P50",
        "WAIT P99",
        "WAIT MAX",
        "REFUSED",
        "TIMED OUT",
        "UNFINISHED"
    ));
    for caller in &report.callers {
        out.push_str(&format!(
            "{:<20} {:>8} {:>9} {:>9} {:>7.0}ms {:>7.0}ms {:>7.0}ms {:>9} {:>9} {:>10}\n",
            caller.name,
            caller.priority,
            caller.offered,
            caller.granted,
            caller.wait_ms.p50,
            caller.wait_ms.p99,
            caller.wait_ms.max,
            caller.gave_up.at_once,
            caller.gave_up.at_deadline,
            caller.unfinished
        ));
    }
    out.push_str(
        "\nWAIT: of granted calls. REFUSED: refused when asked, as no room would open within the \
         caller's wait.\nTIMED OUT: queued until the caller's wait ran out. UNFINISHED: still \
         waiting when the run ended.\n\n",
    );
    for caller in &report.callers {
        out.push_str(&caller.summary);
        out.push('\n');
    }
    out.push_str(&format!(
        "\n{:<20} {:>8} {:>14} {:>12}\n",
        "LIMIT", "LIMIT", "MOST IN WINDOW", "UTILIZATION"
    ));
    for limit in &report.limits {
        let utilization = limit
            .utilization
            .map_or("-".to_owned(), |used| format!("{:.1} %", used * 100.0));
        out.push_str(&format!(
            "{:<20} {:>8} {:>14} {:>12}{}\n",
            limit.name,
            limit.limit,
            limit.max_in_window,
            utilization,
            if limit.max_in_window > limit.limit {
                "  OVER THE LIMIT"
            } else {
                ""
            }
        ));
    }
    if let Some(vendor) = &report.vendor {
        out.push_str(&vendor_text(vendor));
    }
    out
}

/// The vendor's figures in a few lines.
fn vendor_text(vendor: &VendorReport) -> String {
    let mut out = format!(
        "\nVENDOR behind {} ({} window, {}, {})\n",
        vendor.guarded_by,
        vendor.window.as_str(),
        if vendor.headers {
            "rate-limit headers"
        } else {
            "no rate-limit headers"
        },
        if vendor.learn {
            "callers learn from its answers"
        } else {
            "callers only pause on a 429"
        }
    );
    out.push_str(&format!(
        "calls {}, admitted {}, refused (429) {} ({} after the first answer), arrivals over its limit {}\n",
        vendor.calls,
        vendor.ok,
        vendor.limited,
        vendor.limited_after_first_answer,
        vendor.over_limit
    ));
    out.push_str(&format!(
        "its capacity used: {:.1} % ({} admitted of {:.0} it would admit over the run)\n",
        vendor.used_share * 100.0,
        vendor.ok,
        vendor.capacity
    ));
    out.push_str(&format!(
        "lessons taught {}, pauses {}",
        vendor.lessons, vendor.pauses
    ));
    if let (Some(effective), Some(configured)) = (vendor.effective_at_end, vendor.configured) {
        out.push_str(&format!(
            ", limit in force at the end {effective} (configured {configured})"
        ));
    }
    out.push('\n');
    out
}

/// Round tick steps: the smallest of 1, 2 or 5 times a power of ten that cuts `span` into at
/// most `most` steps.
fn tick_step(span: f64, most: f64) -> f64 {
    let rough = (span / most).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|factor| factor * power)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * power)
}

/// Priority colours (high, normal, low) and, unrelated to them, the wait figures' colours.
const PRIORITY_COLOURS: [&str; 3] = ["#1f5f99", "#5fa2dd", "#b9d6f2"];
const WAIT_COLOURS: [(&str, &str); 3] =
    [("p50", "#1b9e77"), ("p99", "#e6a100"), ("max", "#c2410c")];

/// The report as an SVG: per limit, grants per window stacked by priority against the limit
/// line, over simulated time; then each caller's waits (p50, p99, max) as bars against its
/// own wait, with how many gave up.
pub fn chart(report: &Report) -> String {
    let (width, panel) = (960.0, 240.0);
    let (left, right) = (80.0, 40.0);
    let plot_width = width - left - right;
    let waits_height = 70.0 + 34.0 * report.callers.len() as f64;
    let height = panel * report.limits.len() as f64 + waits_height + 20.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    // Simulated time on the x axis, in minutes past two minutes, else in seconds.
    let (unit, per_unit) = if report.duration_s > 120.0 {
        ("min", 60.0)
    } else {
        ("s", 1.0)
    };
    let time_span = report.duration_s / per_unit;
    for (index, limit) in report.limits.iter().enumerate() {
        let top = 20.0 + panel * index as f64;
        let (plot_top, base) = (top + 30.0, top + panel - 60.0);
        let windows = report.windows.get(&limit.name).cloned().unwrap_or_default();
        let most = windows
            .iter()
            .map(|w| w.iter().sum::<u64>())
            .max()
            .unwrap_or(0)
            .max(limit.limit) as f64
            * 1.1;
        let y = |value: f64| base - value / most.max(1.0) * (base - plot_top);
        let window_s = report.duration_s / windows.len().max(1) as f64;
        svg.push_str(&format!(
            "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{}: units granted per window of {}, by priority, against its limit of {}</text>\n",
            top + 12.0,
            escape(&limit.name),
            seconds_text(window_s),
            limit.limit
        ));
        // Value axis: round ticks, and the axis's name.
        let step = tick_step(most, 5.0);
        let mut value = 0.0;
        while value <= most {
            let at = y(value);
            svg.push_str(&format!(
                "<line x1=\"{left}\" x2=\"{}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"#e5e5e5\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{value}</text>\n",
                left + plot_width,
                left - 6.0,
                at + 4.0,
            ));
            value += step;
        }
        svg.push_str(&format!(
            "<text transform=\"translate({:.1} {:.1}) rotate(-90)\" text-anchor=\"middle\">units per window</text>\n",
            left - 50.0,
            (plot_top + base) / 2.0
        ));
        let bar = plot_width / windows.len().max(1) as f64;
        for (slot, window) in windows.iter().enumerate() {
            let mut top_of = base;
            for (level, units) in window.iter().enumerate() {
                let h = base - y(*units as f64);
                top_of -= h;
                svg.push_str(&format!(
                    "<rect x=\"{:.1}\" y=\"{top_of:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"/>\n",
                    left + bar * slot as f64,
                    (bar - 1.0).max(0.5),
                    PRIORITY_COLOURS[level]
                ));
            }
        }
        let line = y(limit.limit as f64);
        svg.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{line:.1}\" y2=\"{line:.1}\" stroke=\"#d7301f\" stroke-width=\"2\"/>\n<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#d7301f\">limit {}</text>\n",
            left + plot_width,
            left + plot_width,
            line - 4.0,
            limit.limit
        ));
        // Time axis: round ticks of simulated time, and the axis's name.
        svg.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{base:.1}\" y2=\"{base:.1}\" stroke=\"#333\"/>\n",
            left + plot_width
        ));
        let step = tick_step(time_span, 10.0);
        let mut at = 0.0;
        while at <= time_span + step * 1e-9 {
            let x = left + at / time_span.max(f64::MIN_POSITIVE) * plot_width;
            svg.push_str(&format!(
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{base:.1}\" y2=\"{:.1}\" stroke=\"#333\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{at}</text>\n",
                base + 4.0,
                base + 16.0
            ));
            at += step;
        }
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">simulated time ({unit})</text>\n",
            left + plot_width / 2.0,
            base + 32.0
        ));
        for (level, name) in ["high", "normal", "low"].into_iter().enumerate() {
            let x = left + 120.0 * level as f64;
            svg.push_str(&format!(
                "<rect x=\"{x}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{:.1}\">{name} priority</text>\n",
                base + 40.0,
                PRIORITY_COLOURS[level],
                x + 14.0,
                base + 49.0
            ));
        }
    }
    // Waits: one row per caller, bars over a millisecond axis, each caller's own wait marked.
    let top = 20.0 + panel * report.limits.len() as f64;
    svg.push_str(&format!(
        "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">how long granted calls waited, per caller (the dashed mark: how long the caller waits at most)</text>\n",
        top + 12.0
    ));
    let most = report
        .callers
        .iter()
        .map(|c| c.wait_ms.max.max(c.wait_limit_ms as f64))
        .fold(1.0, f64::max);
    let (bars_left, bars_width) = (left + 120.0, plot_width - 380.0);
    let x_of = |ms: f64| bars_left + ms / most * bars_width;
    for (index, caller) in report.callers.iter().enumerate() {
        let y = top + 30.0 + 34.0 * index as f64;
        svg.push_str(&format!(
            "<text x=\"{left}\" y=\"{:.1}\">{}</text>\n",
            y + 14.0,
            escape(&caller.name)
        ));
        for (offset, (value, (_, colour))) in
            [caller.wait_ms.p50, caller.wait_ms.p99, caller.wait_ms.max]
                .into_iter()
                .zip(WAIT_COLOURS)
                .enumerate()
        {
            svg.push_str(&format!(
                "<rect x=\"{bars_left}\" y=\"{:.1}\" width=\"{:.1}\" height=\"6\" fill=\"{colour}\"/>\n",
                y + 2.0 + 7.0 * offset as f64,
                x_of(value) - bars_left
            ));
        }
        let mark = x_of(caller.wait_limit_ms as f64);
        svg.push_str(&format!(
            "<line x1=\"{mark:.1}\" x2=\"{mark:.1}\" y1=\"{y:.1}\" y2=\"{:.1}\" stroke=\"#333\" stroke-dasharray=\"3 2\"/>\n",
            y + 24.0
        ));
        let gave_up = caller.gave_up.at_once + caller.gave_up.at_deadline;
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">p50 {:.0}, p99 {:.0}, max {:.0} ms</text><text x=\"{0:.1}\" y=\"{:.1}\" fill=\"#555\">{}/{} granted, {gave_up} gave up, {} unfinished</text>\n",
            bars_left + bars_width + 12.0,
            y + 9.0,
            caller.wait_ms.p50,
            caller.wait_ms.p99,
            caller.wait_ms.max,
            y + 23.0,
            caller.granted,
            caller.offered,
            caller.unfinished
        ));
    }
    // The milliseconds axis under the rows, and the legend.
    let axis = top + 30.0 + 34.0 * report.callers.len() as f64;
    svg.push_str(&format!(
        "<line x1=\"{bars_left}\" x2=\"{:.1}\" y1=\"{axis:.1}\" y2=\"{axis:.1}\" stroke=\"#333\"/>\n",
        bars_left + bars_width
    ));
    let step = tick_step(most, 6.0);
    let mut ms = 0.0;
    while ms <= most + step * 1e-9 {
        let x = x_of(ms);
        svg.push_str(&format!(
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{axis:.1}\" y2=\"{:.1}\" stroke=\"#333\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{ms}</text>\n",
            axis + 4.0,
            axis + 16.0
        ));
        ms += step;
    }
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">wait (ms)</text>\n",
        bars_left + bars_width / 2.0,
        axis + 32.0
    ));
    // The legend, under the figures beside the bars.
    for (index, (name, colour)) in WAIT_COLOURS.into_iter().enumerate() {
        let x = bars_left + bars_width + 12.0 + 60.0 * index as f64;
        svg.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\">{name}</text>\n",
            axis + 22.0,
            x + 14.0,
            axis + 31.0
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

/// A span of seconds as people read it: "60 s", "1.5 s", "250 ms".
fn seconds_text(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{} s", (seconds * 10.0).round() / 10.0)
    } else {
        format!("{:.0} ms", seconds * 1_000.0)
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
