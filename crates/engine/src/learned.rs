//! What a vendor taught about a rate limit: its limit lowered below the configured value (a
//! quota the vendor advertised, or a rate-limit answer that advertised none), and its margin
//! raised over the delay callers report between a grant and its send. Pure state: every
//! function takes the time, so tests drive it step by step.
//!
//! The bounds, which `docs/outbound.md` states: a learned limit is never above the configured
//! one nor below the floor (`LearnConfig::floor_percent` of it, at least 1); an advertised one
//! expires after `LearnConfig::ttl` unless taught again; one lowered by rate-limit answers
//! climbs back by `step` every `LearnConfig::raise_every` without another; a learned margin is
//! at most a quarter of the period and a second, and is forgotten two minutes after the last
//! delay reported.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, Kind, Policy, Reserve};

/// The delay allowance a learned margin adds to the delay reported: what the grant's answer
/// spends on its way to the caller, which the caller cannot see.
pub const LEARNED_MARGIN_ALLOWANCE_US: u64 = 10_000;
/// Learned margins are whole multiples of this, so that delays that wobble do not change the
/// limit on every report.
pub const LEARNED_MARGIN_STEP_US: u64 = 5_000;
/// The most a learned margin may be: also never more than a quarter of the period, so that
/// delays reported (truly or not) cost at most a fifth of the limit's throughput.
pub const LEARNED_MARGIN_MAX_US: u64 = 1_000_000;
/// Delays are kept per minute; the most of this minute's and the last is the delay seen.
const DELAY_BUCKET_US: u64 = 60_000_000;
/// The most quotas one lesson may carry.
pub const LESSON_QUOTAS_MAX: usize = 8;
/// The longest `source` a lesson may carry, in bytes.
pub const LESSON_SOURCE_BYTES_MAX: usize = 128;

/// How a limiter learns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LearnConfig {
    /// The lowest a learned limit may go, in percent of the configured limit (at least one
    /// unit): a caller who may teach can slow a limit to this, never stop it.
    pub floor_percent: u64,
    /// How long an advertised limit holds unless taught again.
    pub ttl: Duration,
    /// How often a limit lowered by rate-limit answers climbs back a step.
    pub raise_every: Duration,
}

impl Default for LearnConfig {
    /// A floor of 10 %, advertised limits held 10 minutes, a step back up every minute.
    fn default() -> LearnConfig {
        LearnConfig {
            floor_percent: 10,
            ttl: Duration::from_secs(600),
            raise_every: Duration::from_secs(60),
        }
    }
}

/// A quota a vendor advertised: `quota` calls per `window` (absent: the limit's own period).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdvertisedQuota {
    pub quota: u64,
    pub window: Option<Duration>,
}

/// What a vendor's answer said, as a caller tells it.
#[derive(Clone, Copy, Debug)]
pub struct Lesson<'a> {
    /// Where it was read (a header's name, a host); shown beside the learned value.
    pub source: &'a str,
    pub quotas: &'a [AdvertisedQuota],
    /// The vendor answered "rate limited" and advertised no quota.
    pub rate_limited: bool,
}

/// How a learned limit was learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LearnedKind {
    /// The vendor advertised it.
    Advertised,
    /// Rate-limit answers lowered it; it climbs back by itself.
    RateLimited,
}

impl LearnedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LearnedKind::Advertised => "advertised",
            LearnedKind::RateLimited => "rate_limited",
        }
    }
}

/// A learned limit in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LearnedLimit {
    pub limit: u64,
    pub kind: LearnedKind,
    pub source: String,
    /// Until it ends (an advertised limit) or takes its next step back up (a lowered one).
    pub changes_in: Duration,
}

/// A rate limit's learned state, as views show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Learned {
    pub configured: u64,
    /// The limit in force.
    pub effective: u64,
    pub learned: Option<LearnedLimit>,
    /// The most grant-to-send delay reported in the last minute or two.
    pub delay: Duration,
    /// The margin learned from it (0 when none was reported).
    pub margin: Duration,
}

#[derive(Clone, Debug)]
struct Lowered {
    limit: u64,
    kind: LearnedKind,
    source: Arc<str>,
    /// Advertised: when it ends. Rate-limited: when it last went down or up a step.
    at_us: u64,
    /// Rate-limited: the last decrease, so one burst of answers decreases once.
    decreased_us: u64,
}

impl Lowered {
    /// When this value ends: an advertised limit expires, a lowered one takes its next step up.
    fn ends_us(&self, config: &LearnConfig) -> u64 {
        match self.kind {
            LearnedKind::Advertised => self.at_us,
            LearnedKind::RateLimited => self.at_us.saturating_add(us(config.raise_every).max(1)),
        }
    }
}

/// One limit's learned state; times in microseconds on the limiter's monotonic clock.
#[derive(Clone, Debug, Default)]
pub(crate) struct LimitLearning {
    lowered: Option<Lowered>,
    delay_bucket: u64,
    delay_this_us: u64,
    delay_last_us: u64,
}

/// What a limit's policy and configuration give the learning: the configured limit and
/// period, and the floor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub configured: u64,
    pub period_us: u64,
    pub floor: u64,
}

impl Bounds {
    pub fn of(policy: &Policy, config: &LearnConfig) -> Option<Bounds> {
        let Kind::Rate(rate) = policy.kind() else {
            return None;
        };
        let configured = rate.limit();
        let floor = (configured.saturating_mul(config.floor_percent.clamp(1, 100)) / 100).max(1);
        Some(Bounds {
            configured,
            period_us: rate.period_us(),
            floor: floor.min(configured),
        })
    }

    /// One step back up for a limit lowered by rate-limit answers: a twentieth of the
    /// configured limit, at least one unit.
    fn step(&self) -> u64 {
        (self.configured / 20).max(1)
    }
}

fn us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A quota of `window` converted to a limit per `period` that never lets more than the quota
/// into any window of the vendor's: within a window no longer than the period, the quota
/// itself (all of one period's units may arrive together); for a longer window, the quota
/// shared by the periods it can overlap.
pub(crate) fn per_period(quota: &AdvertisedQuota, period_us: u64) -> u64 {
    match quota.window.map(us) {
        Some(window_us) if window_us > period_us => {
            let periods = window_us.div_ceil(period_us.max(1));
            quota.quota / periods
        }
        _ => quota.quota,
    }
}

impl LimitLearning {
    /// Take a lesson at `now_us`; `effective` is the limit in force before it.
    pub fn learn(
        &mut self,
        lesson: &Lesson<'_>,
        bounds: Bounds,
        config: &LearnConfig,
        now_us: u64,
    ) {
        self.expire(bounds, config, now_us);
        let advertised = lesson
            .quotas
            .iter()
            .map(|quota| per_period(quota, bounds.period_us))
            .min();
        if let Some(advertised) = advertised {
            if advertised >= bounds.configured {
                // The vendor allows what we are configured for (or more): nothing to hold.
                self.lowered = None;
            } else {
                self.lowered = Some(Lowered {
                    limit: advertised.max(bounds.floor),
                    kind: LearnedKind::Advertised,
                    source: lesson.source.into(),
                    at_us: now_us.saturating_add(us(config.ttl)),
                    decreased_us: 0,
                });
            }
            return;
        }
        if !lesson.rate_limited {
            return;
        }
        let current = self.limit(bounds, config, now_us);
        if let Some(lowered) = &self.lowered
            && lowered.decreased_us != 0
            && now_us
                < lowered
                    .decreased_us
                    .saturating_add(bounds.period_us.max(1_000_000))
        {
            // The same burst of answers: one decrease for it.
            return;
        }
        self.lowered = Some(Lowered {
            limit: (current / 2).max(bounds.floor),
            kind: LearnedKind::RateLimited,
            source: lesson.source.into(),
            at_us: now_us,
            decreased_us: now_us.max(1),
        });
    }

    /// Forget what has run out by `now_us`: an advertised limit past its end, a lowered one
    /// climbed back to the configured limit.
    pub fn expire(&mut self, bounds: Bounds, config: &LearnConfig, now_us: u64) {
        let Some(lowered) = &mut self.lowered else {
            return;
        };
        match lowered.kind {
            LearnedKind::Advertised => {
                if now_us >= lowered.at_us || lowered.limit >= bounds.configured {
                    self.lowered = None;
                }
            }
            LearnedKind::RateLimited => {
                let every = us(config.raise_every).max(1);
                let steps = now_us.saturating_sub(lowered.at_us) / every;
                if steps > 0 {
                    lowered.limit = lowered
                        .limit
                        .saturating_add(steps.saturating_mul(bounds.step()));
                    lowered.at_us = lowered.at_us.saturating_add(steps * every);
                }
                if lowered.limit >= bounds.configured {
                    self.lowered = None;
                }
            }
        }
    }

    /// The limit in force at `now_us` (call `expire` first to forget what ran out).
    pub fn limit(&self, bounds: Bounds, config: &LearnConfig, now_us: u64) -> u64 {
        let mut copy = self.clone();
        copy.expire(bounds, config, now_us);
        copy.lowered.map_or(bounds.configured, |lowered| {
            lowered.limit.clamp(bounds.floor, bounds.configured)
        })
    }

    /// A caller measured `delay` between a grant's answer and its send.
    pub fn note_delay(&mut self, delay_us: u64, now_us: u64) {
        self.roll(now_us);
        self.delay_this_us = self.delay_this_us.max(delay_us);
    }

    fn roll(&mut self, now_us: u64) {
        let bucket = now_us / DELAY_BUCKET_US;
        if bucket == self.delay_bucket {
            return;
        }
        self.delay_last_us = if bucket == self.delay_bucket + 1 {
            self.delay_this_us
        } else {
            0
        };
        self.delay_this_us = 0;
        self.delay_bucket = bucket;
    }

    /// The most delay reported in this minute and the last.
    pub fn delay_us(&self, now_us: u64) -> u64 {
        let mut copy = self.clone();
        copy.roll(now_us);
        copy.delay_this_us.max(copy.delay_last_us)
    }

    /// The margin that covers the delay seen: the delay plus the allowance, rounded up to a
    /// step, at most a quarter of the period and `LEARNED_MARGIN_MAX_US`; 0 with no delay seen.
    pub fn margin_us(&self, period_us: u64, now_us: u64) -> u64 {
        let delay = self.delay_us(now_us);
        if delay == 0 {
            return 0;
        }
        let wanted = delay
            .saturating_add(LEARNED_MARGIN_ALLOWANCE_US)
            .div_ceil(LEARNED_MARGIN_STEP_US)
            .saturating_mul(LEARNED_MARGIN_STEP_US);
        wanted.min(period_us / 4).min(LEARNED_MARGIN_MAX_US)
    }

    /// When the limit or margin in force next changes by itself, if ever.
    pub fn next_change_us(&self, period_us: u64, config: &LearnConfig, now_us: u64) -> Option<u64> {
        let lowered = self.lowered.as_ref().map(|lowered| lowered.ends_us(config));
        let delay = (self.margin_us(period_us, now_us) > 0)
            .then(|| (now_us / DELAY_BUCKET_US + 1) * DELAY_BUCKET_US);
        lowered.into_iter().chain(delay).min()
    }

    /// Whether nothing is learned any more: the state can go.
    pub fn is_empty(&self, now_us: u64) -> bool {
        self.lowered.is_none() && self.delay_us(now_us) == 0
    }

    /// The view of it, for `bounds` at `now_us`.
    pub fn view(&self, bounds: Bounds, config: &LearnConfig, now_us: u64) -> Learned {
        let mut copy = self.clone();
        copy.expire(bounds, config, now_us);
        let effective = copy.limit(bounds, config, now_us);
        let learned = copy.lowered.as_ref().map(|lowered| LearnedLimit {
            limit: effective,
            kind: lowered.kind,
            source: lowered.source.to_string(),
            changes_in: Duration::from_micros(lowered.ends_us(config).saturating_sub(now_us)),
        });
        Learned {
            configured: bounds.configured,
            effective,
            learned,
            delay: Duration::from_micros(copy.delay_us(now_us)),
            margin: Duration::from_micros(copy.margin_us(bounds.period_us, now_us)),
        }
    }
}

/// `configured` with `limit` in place of its limit and at least `margin_us` of margin: the
/// policy a learned state puts in force. Reserves shrink in proportion, and a GCRA burst to
/// at most the limit, so the policy stays valid; `None` if it cannot be made (it then stays
/// as configured).
pub(crate) fn lowered_policy(configured: &Policy, limit: u64, margin_us: u64) -> Option<Policy> {
    let Kind::Rate(rate) = configured.kind() else {
        return None;
    };
    if limit >= rate.limit() && margin_us <= rate.margin_us() {
        return Some(*configured);
    }
    let limit = limit.min(rate.limit()).max(1);
    let algorithm = match rate.algorithm() {
        Algorithm::Gcra { burst } => Algorithm::Gcra {
            burst: burst.min(limit).max(1),
        },
        other => other,
    };
    let capacity = match algorithm {
        Algorithm::Gcra { burst } => burst,
        _ => limit,
    };
    let reserve = configured.reserve();
    let scale = |units: u64| {
        u64::try_from(u128::from(units) * u128::from(limit) / u128::from(rate.limit())).unwrap_or(0)
    };
    let mut reserve = Reserve {
        high: scale(reserve.high),
        normal: scale(reserve.normal),
    };
    while reserve.high + reserve.normal >= capacity && reserve.high + reserve.normal > 0 {
        if reserve.normal > 0 {
            reserve.normal -= 1;
        } else {
            reserve.high -= 1;
        }
    }
    Policy::rate(
        limit,
        rate.period_us(),
        rate.margin_us().max(margin_us),
        algorithm,
        reserve,
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;

    fn bounds(configured: u64) -> Bounds {
        let policy = Policy::rate(
            configured,
            SECOND,
            0,
            Algorithm::Sliding,
            Reserve::default(),
        )
        .expect("policy");
        Bounds::of(&policy, &LearnConfig::default()).expect("rate")
    }

    fn lesson<'a>(quotas: &'a [AdvertisedQuota], rate_limited: bool) -> Lesson<'a> {
        Lesson {
            source: "test",
            quotas,
            rate_limited,
        }
    }

    #[test]
    fn an_advertised_limit_lowers_within_the_bounds_and_expires() {
        let config = LearnConfig::default();
        let b = bounds(20);
        let mut state = LimitLearning::default();
        let ten = [AdvertisedQuota {
            quota: 10,
            window: None,
        }];
        state.learn(&lesson(&ten, false), b, &config, 0);
        assert_eq!(state.limit(b, &config, 0), 10);
        let one = [AdvertisedQuota {
            quota: 1,
            window: None,
        }];
        state.learn(&lesson(&one, false), b, &config, SECOND);
        assert_eq!(
            state.limit(b, &config, SECOND),
            2,
            "never below the floor, 10 %"
        );
        let more = [AdvertisedQuota {
            quota: 50,
            window: None,
        }];
        state.learn(&lesson(&more, false), b, &config, 2 * SECOND);
        assert_eq!(
            state.limit(b, &config, 2 * SECOND),
            20,
            "never above the configured"
        );
        state.learn(&lesson(&ten, false), b, &config, 3 * SECOND);
        let end = 3 * SECOND + us(config.ttl);
        assert_eq!(state.limit(b, &config, end - 1), 10);
        assert_eq!(state.limit(b, &config, end), 20, "it expires");
    }

    #[test]
    fn a_longer_window_is_shared_by_the_periods_it_overlaps() {
        let per_minute = AdvertisedQuota {
            quota: 600,
            window: Some(Duration::from_secs(60)),
        };
        assert_eq!(per_period(&per_minute, SECOND), 10);
        let shorter = AdvertisedQuota {
            quota: 3,
            window: Some(Duration::from_millis(100)),
        };
        assert_eq!(
            per_period(&shorter, SECOND),
            3,
            "a shorter window: the quota itself"
        );
        let partial = AdvertisedQuota {
            quota: 10,
            window: Some(Duration::from_millis(1_500)),
        };
        assert_eq!(
            per_period(&partial, SECOND),
            5,
            "1.5 s overlaps two periods"
        );
    }

    #[test]
    fn rate_limit_answers_halve_once_per_burst_and_climb_back() {
        let config = LearnConfig::default();
        let b = bounds(20);
        let mut state = LimitLearning::default();
        state.learn(&lesson(&[], true), b, &config, SECOND);
        assert_eq!(state.limit(b, &config, SECOND), 10);
        state.learn(&lesson(&[], true), b, &config, SECOND + 500_000);
        assert_eq!(
            state.limit(b, &config, SECOND + 500_000),
            10,
            "one burst, one decrease"
        );
        state.learn(&lesson(&[], true), b, &config, 3 * SECOND);
        assert_eq!(state.limit(b, &config, 3 * SECOND), 5);
        let every = us(config.raise_every);
        assert_eq!(state.limit(b, &config, 3 * SECOND + every - 1), 5);
        assert_eq!(
            state.limit(b, &config, 3 * SECOND + every),
            6,
            "a step of a twentieth"
        );
        assert_eq!(state.limit(b, &config, 3 * SECOND + 100 * every), 20);
        state.expire(b, &config, 3 * SECOND + 100 * every);
        assert!(state.is_empty(3 * SECOND + 100 * every));
    }

    #[test]
    fn the_margin_covers_the_delay_seen_within_its_bounds_and_is_forgotten() {
        let mut state = LimitLearning::default();
        assert_eq!(state.margin_us(SECOND, 0), 0);
        state.note_delay(3_000, 0);
        assert_eq!(
            state.margin_us(SECOND, 0),
            15_000,
            "3 ms + 10 ms, up to 5 ms steps"
        );
        state.note_delay(500_000, 1);
        assert_eq!(
            state.margin_us(SECOND, 1),
            250_000,
            "at most a quarter of the period"
        );
        assert_eq!(
            state.margin_us(SECOND, DELAY_BUCKET_US + 1),
            250_000,
            "kept a minute more"
        );
        assert_eq!(
            state.margin_us(SECOND, 2 * DELAY_BUCKET_US),
            0,
            "then forgotten"
        );
    }

    #[test]
    fn a_lowered_policy_stays_valid() {
        let policy = Policy::rate(
            20,
            SECOND,
            0,
            Algorithm::Gcra { burst: 20 },
            Reserve {
                high: 15,
                normal: 4,
            },
        )
        .expect("policy");
        let lowered = lowered_policy(&policy, 2, 15_000).expect("valid");
        let Kind::Rate(rate) = lowered.kind() else {
            panic!("rate")
        };
        assert_eq!(rate.limit(), 2);
        assert_eq!(rate.margin_us(), 15_000);
        assert_eq!(rate.algorithm(), Algorithm::Gcra { burst: 2 });
        assert!(lowered.reserve().high + lowered.reserve().normal < 2);
        assert_eq!(lowered_policy(&policy, 20, 0), Some(policy));
    }
}
