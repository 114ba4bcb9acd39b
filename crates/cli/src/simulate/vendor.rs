//! The simulated vendor behind one limit of a workload: its true limit per period (which may
//! step to other values or follow a load curve over the run), counted by the vendor itself on
//! the simulated clock in sliding or fixed windows; the answers it gives (admitted or 429, with
//! its rate-limit headers or without, and `Retry-After` on a 429); what the outbound callers
//! behind it would tell the limiter about those answers; and the figures it reports, counted
//! from its own arrival log and never from the limiter.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// A caller sends its lesson again after this long even when the vendor says nothing new.
const LESSON_REPEAT_US: u64 = 60_000_000;
/// The most changes a load curve may make over a run, so a typo cannot exhaust memory or time.
pub const CURVE_CHANGES_MAX: f64 = 1_000_000.0;
/// Where the simulated callers say their lessons were read.
pub const SOURCE_HEADERS: &str = "rate-limit headers of the simulated vendor";
pub const SOURCE_REFUSAL: &str = "429 of the simulated vendor";

/// The `[vendor]` table of a workload.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vendor {
    /// The Tollgate limit that guards the vendor: its callers' calls reach the vendor, and what
    /// the vendor answers pauses (and, with `learn`, teaches) this limit.
    pub guarded_by: String,
    /// The vendor's own limit: calls admitted per `period_ms`, at the start of the run.
    pub limit: u64,
    pub period_ms: u64,
    /// The `Retry-After` of a 429; absent: until the vendor admits a call again, in whole
    /// seconds rounded up, as vendors say it.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// How the vendor counts: `sliding` (any period ending at the arrival) or `fixed` (aligned
    /// periods from the start of the run).
    #[serde(default)]
    pub window: VendorWindow,
    /// Whether each answer carries the vendor's limit, what remains and when a call is
    /// admitted again.
    #[serde(default)]
    pub headers: bool,
    /// The limit changes to `limit` at `at_s` seconds into the run.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// The vendor's load: it admits `high` for `every_s` seconds, then `low` for as long, and
    /// so on from the start; the limit in force is the lesser of this and `limit` (or the last
    /// step's).
    #[serde(default)]
    pub load_curve: Option<LoadCurve>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VendorWindow {
    #[default]
    Sliding,
    Fixed,
}

impl VendorWindow {
    pub fn as_str(self) -> &'static str {
        match self {
            VendorWindow::Sliding => "sliding",
            VendorWindow::Fixed => "fixed",
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub at_s: f64,
    pub limit: u64,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadCurve {
    pub every_s: f64,
    pub low: u64,
    pub high: u64,
}

/// The vendor's figures at the end of a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VendorReport {
    pub guarded_by: String,
    pub window: VendorWindow,
    pub headers: bool,
    /// Whether the callers taught the limiter what the vendor answered (`learn` of the
    /// workload), or only paused it on a 429.
    pub learn: bool,
    /// Calls that reached the vendor.
    pub calls: u64,
    /// Calls it admitted.
    pub ok: u64,
    /// Calls it refused (429).
    pub limited: u64,
    /// Of those, the calls that arrived after the first answer had reached its caller: what a
    /// caller that learns from answers could have avoided.
    pub limited_after_first_answer: u64,
    /// Arrivals (admitted or not) that were past the vendor's limit in force in its window
    /// ending at them (sliding) or in their aligned window (fixed): how hard the callers
    /// pressed on the vendor, from its own arrival log.
    pub over_limit: u64,
    /// The calls the vendor would admit over the run: its limit in force per period,
    /// integrated over the run.
    pub capacity: f64,
    /// `ok / capacity`.
    pub used_share: f64,
    /// Lessons the callers taught the limiter.
    pub lessons: u64,
    /// Pauses the callers put on the limit: for a 429's `Retry-After`, and with `learn` for
    /// "none remaining" until the vendor's reset.
    pub pauses: u64,
    /// The limit in force on `guarded_by` when the run ended, beside its configured limit.
    pub effective_at_end: Option<u64>,
    pub configured: Option<u64>,
}

/// A `[vendor]` checked, in microseconds.
#[derive(Clone, Debug)]
pub struct Model {
    pub guarded_by: String,
    limit: u64,
    period_us: u64,
    retry_after_us: Option<u64>,
    window: VendorWindow,
    headers: bool,
    /// (from, limit), in order.
    steps: Vec<(u64, u64)>,
    /// (every, low, high).
    curve: Option<(u64, u64, u64)>,
}

fn seconds_to_us(seconds: f64) -> u64 {
    (seconds * 1e6).round() as u64
}

impl Vendor {
    /// Check every field against a run of `duration_s`: the error names the field.
    pub fn check(&self, duration_s: f64) -> Result<Model, String> {
        for (field, value) in [("limit", self.limit), ("period_ms", self.period_ms)] {
            if value == 0 {
                return Err(format!("vendor.{field}: must be at least 1"));
            }
        }
        if self.period_ms > tollgate::SPAN_US_MAX / 1_000 {
            return Err("vendor.period_ms: must be at most 366 days".to_owned());
        }
        let retry_after_us = match self.retry_after_ms {
            Some(0) => return Err("vendor.retry_after_ms: must be at least 1".to_owned()),
            Some(ms) if ms > tollgate::PAUSE_MS_MAX => {
                return Err(format!(
                    "vendor.retry_after_ms: must be at most {} (a day)",
                    tollgate::PAUSE_MS_MAX
                ));
            }
            other => other.map(|ms| ms * 1_000),
        };
        let mut steps = Vec::with_capacity(self.steps.len());
        let mut last = None;
        for (index, step) in self.steps.iter().enumerate() {
            if !(step.at_s >= 0.0 && step.at_s.is_finite() && step.at_s <= duration_s) {
                return Err(format!(
                    "vendor.steps[{index}].at_s: must be from 0 to duration_s ({duration_s})"
                ));
            }
            if last.is_some_and(|at: f64| step.at_s <= at) {
                return Err(format!(
                    "vendor.steps[{index}].at_s: steps must be in order of time, each later than the last"
                ));
            }
            if step.limit == 0 {
                return Err(format!("vendor.steps[{index}].limit: must be at least 1"));
            }
            last = Some(step.at_s);
            steps.push((seconds_to_us(step.at_s), step.limit));
        }
        let curve = match self.load_curve {
            None => None,
            Some(curve) => {
                if !(curve.every_s > 0.0 && curve.every_s.is_finite()) {
                    return Err("vendor.load_curve.every_s: must be above 0".to_owned());
                }
                if duration_s / curve.every_s > CURVE_CHANGES_MAX {
                    return Err(format!(
                        "vendor.load_curve.every_s: at most {CURVE_CHANGES_MAX} changes in a run; make it at least {}",
                        duration_s / CURVE_CHANGES_MAX
                    ));
                }
                if curve.low == 0 {
                    return Err("vendor.load_curve.low: must be at least 1".to_owned());
                }
                if curve.high < curve.low {
                    return Err("vendor.load_curve.high: must be at least low".to_owned());
                }
                Some((seconds_to_us(curve.every_s).max(1), curve.low, curve.high))
            }
        };
        Ok(Model {
            guarded_by: self.guarded_by.clone(),
            limit: self.limit,
            period_us: self.period_ms * 1_000,
            retry_after_us,
            window: self.window,
            headers: self.headers,
            steps,
            curve,
        })
    }
}

/// What the vendor answered one call.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub ok: bool,
    /// With headers: the limit, what remains after this call, and the instant (µs into the
    /// run) a call is admitted again.
    pub headers: Option<Headers>,
    /// The instant the 429's `Retry-After` runs out when the caller reads it, or the instant
    /// to count whole seconds to.
    retry_at_us: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
pub struct Headers {
    pub limit: u64,
    pub remaining: u64,
    pub reset_at_us: u64,
}

/// What a caller tells the limiter about an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Teach {
    /// The vendor advertised this many calls per its period.
    Quota(u64),
    /// It refused and advertised nothing.
    RateLimited,
}

impl Model {
    pub fn period_us(&self) -> u64 {
        self.period_us
    }

    /// The vendor's limit in force `at_us` into the run.
    pub fn limit_at(&self, at_us: u64) -> u64 {
        let stepped = self
            .steps
            .iter()
            .rev()
            .find(|(from, _)| *from <= at_us)
            .map_or(self.limit, |(_, limit)| *limit);
        match self.curve {
            Some((every, low, high)) => stepped.min(if (at_us / every).is_multiple_of(2) {
                high
            } else {
                low
            }),
            None => stepped,
        }
    }

    /// A call arrives `at_us` into the run: the vendor counts it and answers.
    pub fn arrive(&self, log: &mut Log, at_us: u64) -> Answer {
        let limit = self.limit_at(at_us);
        let (ok, remaining, reset_at_us) = match self.window {
            VendorWindow::Sliding => {
                while log
                    .admitted
                    .front()
                    .is_some_and(|&at| at + self.period_us <= at_us)
                {
                    log.admitted.pop_front();
                }
                let ok = (log.admitted.len() as u64) < limit;
                if ok {
                    log.admitted.push_back(at_us);
                }
                let held = log.admitted.len() as u64;
                // The next call admitted: when the oldest call that keeps the count at or over
                // the limit leaves the window.
                let freeing = usize::try_from(held.saturating_sub(limit)).unwrap_or(usize::MAX);
                let reset_at_us = log
                    .admitted
                    .get(freeing)
                    .map_or(at_us, |at| at + self.period_us);
                (ok, limit.saturating_sub(held), reset_at_us)
            }
            VendorWindow::Fixed => {
                let index = at_us / self.period_us;
                if log.fixed_index != index {
                    log.fixed_index = index;
                    log.fixed_count = 0;
                }
                let ok = log.fixed_count < limit;
                if ok {
                    log.fixed_count += 1;
                }
                (
                    ok,
                    limit.saturating_sub(log.fixed_count),
                    (index + 1) * self.period_us,
                )
            }
        };
        log.arrivals.push((at_us, ok));
        if !ok && log.first_answer_us.is_some() {
            log.limited_after_first_answer += 1;
        }
        Answer {
            ok,
            headers: self.headers.then_some(Headers {
                limit,
                remaining,
                reset_at_us,
            }),
            retry_at_us: (!ok).then_some(reset_at_us),
        }
    }

    /// The `Retry-After` of a 429 read at `now_us`: the configured one, else until the vendor
    /// admits again in whole seconds rounded up (at least one).
    pub fn retry_after_us(&self, answer: &Answer, now_us: u64) -> Option<u64> {
        let reset_at = answer.retry_at_us?;
        Some(self.retry_after_us.unwrap_or_else(|| {
            reset_at
                .saturating_sub(now_us)
                .div_ceil(1_000_000)
                .max(1)
                .saturating_mul(1_000_000)
        }))
    }

    /// The vendor's figures from its arrival log over a run of `duration_us`.
    pub fn report(&self, log: &Log, duration_us: u64, learn: bool) -> VendorReport {
        let calls = log.arrivals.len() as u64;
        let ok = log.arrivals.iter().filter(|(_, ok)| *ok).count() as u64;
        let mut over_limit = 0;
        let mut first = 0;
        for (index, &(at, _)) in log.arrivals.iter().enumerate() {
            match self.window {
                VendorWindow::Sliding => {
                    while log.arrivals[first].0 + self.period_us <= at {
                        first += 1;
                    }
                }
                VendorWindow::Fixed => {
                    while log.arrivals[first].0 / self.period_us != at / self.period_us {
                        first += 1;
                    }
                }
            }
            if (index - first + 1) as u64 > self.limit_at(at) {
                over_limit += 1;
            }
        }
        let capacity = self.capacity(duration_us);
        VendorReport {
            guarded_by: self.guarded_by.clone(),
            window: self.window,
            headers: self.headers,
            learn,
            calls,
            ok,
            limited: calls - ok,
            limited_after_first_answer: log.limited_after_first_answer,
            over_limit,
            capacity,
            used_share: if capacity > 0.0 {
                ok as f64 / capacity
            } else {
                0.0
            },
            lessons: log.lessons,
            pauses: log.pauses,
            effective_at_end: None,
            configured: None,
        }
    }

    /// The limit in force per period, integrated over `[0, duration_us)`.
    fn capacity(&self, duration_us: u64) -> f64 {
        let mut changes: Vec<u64> = vec![0, duration_us];
        changes.extend(self.steps.iter().map(|(from, _)| *from));
        if let Some((every, _, _)) = self.curve {
            changes.extend((1..=duration_us / every).map(|n| n * every));
        }
        changes.retain(|at| *at <= duration_us);
        changes.sort_unstable();
        changes.dedup();
        changes
            .windows(2)
            .map(|span| self.limit_at(span[0]) as f64 * (span[1] - span[0]) as f64)
            .sum::<f64>()
            / self.period_us as f64
    }
}

/// The vendor's own record, and what the callers behind it remember of what they taught.
#[derive(Debug, Default)]
pub struct Log {
    /// Sliding: the instants of the calls admitted in the last period.
    admitted: VecDeque<u64>,
    /// Fixed: the window counted and the calls admitted in it.
    fixed_index: u64,
    fixed_count: u64,
    /// Every arrival: its instant and whether it was admitted.
    arrivals: Vec<(u64, bool)>,
    first_answer_us: Option<u64>,
    limited_after_first_answer: u64,
    /// The last quota taught, and when.
    taught: Option<(u64, u64)>,
    lessons: u64,
    pauses: u64,
}

impl Log {
    /// An answer reached its caller at `now_us`: what the caller teaches, as outbound clients
    /// do (a quota when it is new, a minute after it was last sent, or when none remains; a
    /// 429 that advertised nothing, always). `None`: nothing new to say.
    pub fn lesson(&mut self, answer: &Answer, now_us: u64) -> Option<Teach> {
        self.answered(now_us);
        let teach = match answer.headers {
            Some(headers) => {
                let new = match self.taught {
                    Some((quota, at)) => quota != headers.limit || now_us >= at + LESSON_REPEAT_US,
                    None => true,
                };
                if !new && headers.remaining > 0 {
                    return None;
                }
                self.taught = Some((headers.limit, now_us));
                Teach::Quota(headers.limit)
            }
            None if !answer.ok => Teach::RateLimited,
            None => return None,
        };
        self.lessons += 1;
        Some(teach)
    }

    /// An answer reached its caller at `now_us`.
    pub fn answered(&mut self, now_us: u64) {
        self.first_answer_us.get_or_insert(now_us);
    }

    pub fn paused(&mut self) {
        self.pauses += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vendor(text: &str) -> Model {
        let vendor: Vendor = toml::from_str(text).expect("a vendor");
        vendor.check(100.0).expect("valid")
    }

    #[test]
    fn the_limit_steps_and_follows_the_load_curve() {
        let model = vendor(
            "guarded_by = \"x\"\nlimit = 10\nperiod_ms = 1000\nsteps = [{at_s = 30, limit = 5}]\nload_curve = {every_s = 10, low = 4, high = 8}",
        );
        assert_eq!(model.limit_at(0), 8, "high first, under the limit");
        assert_eq!(model.limit_at(10_000_000), 4);
        assert_eq!(model.limit_at(20_000_000), 8);
        assert_eq!(
            model.limit_at(30_000_000),
            4,
            "the step lowers, the curve is low"
        );
        assert_eq!(
            model.limit_at(40_000_000),
            5,
            "the step caps the high phase"
        );
        // Over 100 s, 10 s each: 8, 4, 8, then 4, 5, 4, 5, 4, 5, 4.
        assert_eq!(model.capacity(100_000_000), 10.0 * (20.0 + 31.0));
    }

    #[test]
    fn sliding_and_fixed_windows_admit_the_limit_and_say_when_again() {
        let sliding = vendor("guarded_by = \"x\"\nlimit = 2\nperiod_ms = 1000\nheaders = true");
        let mut log = Log::default();
        assert!(sliding.arrive(&mut log, 100_000).ok);
        let second = sliding.arrive(&mut log, 600_000);
        let headers = second.headers.expect("headers");
        assert!(second.ok && headers.remaining == 0 && headers.reset_at_us == 1_100_000);
        let refused = sliding.arrive(&mut log, 900_000);
        assert!(!refused.ok);
        assert_eq!(sliding.retry_after_us(&refused, 900_000), Some(1_000_000));
        assert!(
            sliding.arrive(&mut log, 1_100_000).ok,
            "the first left its window"
        );
        let report = sliding.report(&log, 2_000_000, true);
        // The refused arrival still counts in the window of the one at 1.1 s: three in it.
        assert_eq!((report.ok, report.limited, report.over_limit), (3, 1, 2));

        let fixed = vendor("guarded_by = \"x\"\nlimit = 2\nperiod_ms = 1000\nwindow = \"fixed\"");
        let mut log = Log::default();
        for at in [100_000, 600_000, 900_000, 1_000_000, 1_100_000] {
            fixed.arrive(&mut log, at);
        }
        let report = fixed.report(&log, 2_000_000, false);
        assert_eq!((report.ok, report.limited, report.over_limit), (4, 1, 1));
    }

    #[test]
    fn callers_teach_what_is_new_and_every_refusal_without_headers() {
        let answer = |remaining| Answer {
            ok: true,
            headers: Some(Headers {
                limit: 10,
                remaining,
                reset_at_us: 0,
            }),
            retry_at_us: None,
        };
        let mut log = Log::default();
        assert_eq!(log.lesson(&answer(5), 0), Some(Teach::Quota(10)));
        assert_eq!(log.lesson(&answer(4), 1), None, "nothing new");
        assert_eq!(
            log.lesson(&answer(0), 2),
            Some(Teach::Quota(10)),
            "none remains"
        );
        assert_eq!(
            log.lesson(&answer(3), 2 + LESSON_REPEAT_US),
            Some(Teach::Quota(10)),
            "a minute on"
        );
        let refused = Answer {
            ok: false,
            headers: None,
            retry_at_us: Some(0),
        };
        assert_eq!(log.lesson(&refused, 3), Some(Teach::RateLimited));
        assert_eq!(log.lessons, 4);
    }
}
