//! How a limiter behaves (`LimiterConfig`, with `Shares`), its bounds and defaults, and why a
//! request that would have waited was answered at once (`QueueFull`).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::learned::LearnConfig;
use crate::permit_id::PermitSecret;

// Only for the link in `waiters_max`'s documentation.
#[cfg(doc)]
use super::Denied;

/// Longest pause a limiter can be configured to accept (`LimiterConfig::pause_max`), in
/// milliseconds: one day.
pub const PAUSE_MS_MAX: u64 = 24 * 3600 * 1000;
/// The longest pause by default (`LimiterConfig::pause_max`): an hour covers what vendors ask
/// in `Retry-After`, and is the most a caller allowed to pause can stop a limit by itself.
pub const DEFAULT_PAUSE_MS_MAX: u64 = 3_600_000;

/// Requests that may wait at once in one limiter, over every limit, by default.
pub const DEFAULT_WAITERS_MAX: usize = 1_024;
/// Requests that may wait at once on one limit (all its keys together), by default: a flood
/// on one limit leaves room for the waiters of others.
pub const DEFAULT_WAITERS_PER_LIMIT_MAX: usize = 256;

/// How a limiter behaves; every field is the caller's decision.
#[derive(Clone, Debug)]
pub struct LimiterConfig {
    /// Longest a request may wait; longer waits are cut to this.
    pub wait_max: Duration,
    /// Key for permit ids; share it between processes that accept each other's ids.
    pub permit_secret: PermitSecret,
    /// Longest pause; longer ones are cut to this (and this to `PAUSE_MS_MAX`). Whoever may
    /// pause can stop a limit for this long, so it is the most a caller's mistake (or malice)
    /// costs before an administrator lifts it.
    pub pause_max: Duration,
    /// Requests waiting at once, over every limit. A request that would wait beyond it is
    /// answered at once instead ([`Denied::not_queued`]).
    pub waiters_max: usize,
    /// Requests waiting at once on any one limit (a request on several counts on each).
    pub waiters_per_limit_max: usize,
    /// How far and how long what vendors teach (`Limiter::learn`) may lower a limit.
    pub learn: LearnConfig,
    /// The least share of each rate limit's period the levels below `high` get while they
    /// wait; off (strict priority) by default.
    pub shares: Shares,
}

impl Default for LimiterConfig {
    /// Waits of up to a minute, a random permit secret, the default waiter caps, pauses of
    /// up to an hour.
    fn default() -> LimiterConfig {
        LimiterConfig {
            wait_max: Duration::from_secs(60),
            permit_secret: PermitSecret::random(),
            waiters_max: DEFAULT_WAITERS_MAX,
            waiters_per_limit_max: DEFAULT_WAITERS_PER_LIMIT_MAX,
            pause_max: Duration::from_millis(DEFAULT_PAUSE_MS_MAX),
            learn: LearnConfig::default(),
            shares: Shares::default(),
        }
    }
}

/// Minimum shares: `normal` and `low` each get at least this percent of a rate limit's units
/// in every period while they wait for it, ahead of higher levels, when they were granted
/// less over the last period. Priority is strict otherwise. Off (0, 0) by default, which is
/// strict priority: a level waits as long as higher levels keep the limit busy. Counted by
/// the process that decides (a server, or a library's limiter), for requests on one limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shares {
    normal: u8,
    low: u8,
}

impl Shares {
    /// Percentages of each period, together at most 100.
    pub fn new(normal: u8, low: u8) -> Result<Shares> {
        if u16::from(normal) + u16::from(low) > 100 {
            return Err(Error::invalid(
                "shares",
                format!("normal ({normal}%) and low ({low}%) together must be at most 100%"),
            ));
        }
        Ok(Shares { normal, low })
    }

    pub fn normal(&self) -> u8 {
        self.normal
    }

    pub fn low(&self) -> u8 {
        self.low
    }

    pub fn is_off(&self) -> bool {
        self.normal == 0 && self.low == 0
    }

    /// The units of a period of `limit` units owed to `normal` and `low`: their percent of
    /// it, rounded up, so that a share that is on is at least one unit.
    pub(crate) fn units_of(&self, limit: u64) -> [u64; 2] {
        let of = |percent: u8| {
            u64::try_from((u128::from(limit) * u128::from(percent)).div_ceil(100)).unwrap_or(limit)
        };
        [of(self.normal), of(self.low)]
    }
}

/// Why a request that would have waited was answered at once: a cap on waiting requests was
/// full.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueFull {
    /// `waiters_max` requests wait in this limiter already.
    Overall { waiters_max: usize },
    /// `waiters_per_limit_max` requests wait on `limit` already.
    Limit {
        limit: String,
        waiters_per_limit_max: usize,
    },
}

impl std::fmt::Display for QueueFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueFull::Overall { waiters_max } => write!(
                f,
                "{waiters_max} requests already wait, the most that may (waiters_max)"
            ),
            QueueFull::Limit {
                limit,
                waiters_per_limit_max,
            } => write!(
                f,
                "{waiters_per_limit_max} requests already wait on limit {limit:?}, the most \
                 that may (waiters_per_limit_max)"
            ),
        }
    }
}
