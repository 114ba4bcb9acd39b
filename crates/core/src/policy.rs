//! Validated policies: what a limit allows. A `Policy` can only be built through its
//! constructors, which reject every value the decision code could not honour (a zero limit, a
//! zero period, reserves that leave nothing for the lowest level), so the deciding code never
//! re-checks them.

use std::fmt;

/// Largest `limit`, `burst` or `cost` accepted. Keeps every product of units and micros
/// inside `u64` (and exactly representable in a Lua double, 2^53).
pub const UNITS_MAX: u64 = 1_000_000_000;
/// Longest period, margin or lease TTL: 366 days, in microseconds.
pub const SPAN_US_MAX: u64 = 366 * 24 * 3600 * 1_000_000;
/// Shortest period or lease TTL: one millisecond, in microseconds.
pub const SPAN_US_MIN: u64 = 1_000;

/// Priority of a request. A lower level never delays a higher one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::Low, Priority::Normal, Priority::High];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }

    pub fn parse(text: &str) -> Option<Priority> {
        match text {
            "low" => Some(Priority::Low),
            "normal" => Some(Priority::Normal),
            "high" => Some(Priority::High),
            _ => None,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a rate limit counts its units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// At most `limit` units in any half-open interval `[t, t + period)`.
    Sliding,
    /// At most `limit` units in each aligned window `[k * period, (k + 1) * period)`.
    Fixed,
    /// Generic cell rate algorithm: sustained `limit / period`, bursts up to `burst` units.
    Gcra { burst: u64 },
}

impl Algorithm {
    /// One of each algorithm (GCRA with a burst of 1), in the order documents list them: what
    /// every list and parser of algorithm names is made from.
    pub const EACH: [Algorithm; 3] = [
        Algorithm::Sliding,
        Algorithm::Fixed,
        Algorithm::Gcra { burst: 1 },
    ];

    /// The algorithm's one name, as every interface spells it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sliding => "sliding",
            Algorithm::Fixed => "fixed",
            Algorithm::Gcra { .. } => "gcra",
        }
    }

    /// The algorithm named `name`, a GCRA one with `burst`; `None` for a name no algorithm has.
    pub fn named(name: &str, burst: u64) -> Option<Algorithm> {
        let algorithm = Algorithm::EACH
            .into_iter()
            .find(|algorithm| algorithm.name() == name)?;
        Some(match algorithm {
            Algorithm::Gcra { .. } => Algorithm::Gcra { burst },
            other => other,
        })
    }
}

/// Units kept back for requests of a priority or higher (`reserve`).
///
/// `high: 2` means normal and low requests leave the last 2 units to high ones;
/// `normal: 3` means low requests leave the last 3 units (on top of high's) to normal and high.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Reserve {
    pub high: u64,
    pub normal: u64,
}

impl Reserve {
    /// Units a request of `priority` must leave untouched.
    pub fn kept_from(self, priority: Priority) -> u64 {
        match priority {
            Priority::High => 0,
            Priority::Normal => self.high,
            Priority::Low => self.high + self.normal,
        }
    }

    fn total(self) -> u64 {
        self.high.saturating_add(self.normal)
    }
}

/// A rate limit's parameters, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    limit: u64,
    period_us: u64,
    margin_us: u64,
    algorithm: Algorithm,
    /// `window_us / limit`, rounded up: worked out once, since every GCRA decision needs it and
    /// a division is the slowest step of one.
    emission_us: u64,
}

impl Rate {
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn period_us(&self) -> u64 {
        self.period_us
    }
    pub fn margin_us(&self) -> u64 {
        self.margin_us
    }
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    /// The period the algorithms count in: `period + margin`.
    pub fn window_us(&self) -> u64 {
        self.period_us + self.margin_us
    }
    /// GCRA emission interval, rounded up so the sustained rate is never above `limit / period`.
    pub fn emission_us(&self) -> u64 {
        self.emission_us
    }
    /// Units a request can hold at most at once: `burst` for GCRA, `limit` otherwise.
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::Gcra { burst } => burst,
            Algorithm::Sliding | Algorithm::Fixed => self.limit,
        }
    }
}

/// A concurrency limit's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Concurrency {
    limit: u64,
    lease_ttl_us: u64,
}

impl Concurrency {
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn lease_ttl_us(&self) -> u64 {
        self.lease_ttl_us
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Rate(Rate),
    Concurrency(Concurrency),
}

/// A validated limit policy.
///
/// ```
/// use tollgate_core::{Algorithm, Policy, Reserve};
/// // 10 calls per second, any second, keeping the last 2 for high-priority calls.
/// let policy = Policy::rate(10, 1_000_000, 0, Algorithm::Sliding, Reserve { high: 2, normal: 0 })?;
/// assert_eq!(policy.capacity(), 10);
/// // A zero limit cannot be written.
/// assert!(Policy::rate(0, 1_000_000, 0, Algorithm::Sliding, Reserve::default()).is_err());
/// # Ok::<(), tollgate_core::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    kind: Kind,
    reserve: Reserve,
}

/// Why a policy was refused; names the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub field: &'static str,
    pub reason: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for PolicyError {}

fn refuse(field: &'static str, reason: impl Into<String>) -> PolicyError {
    PolicyError {
        field,
        reason: reason.into(),
    }
}

fn check_units(field: &'static str, value: u64) -> Result<(), PolicyError> {
    if value == 0 {
        return Err(refuse(field, "must be at least 1"));
    }
    if value > UNITS_MAX {
        return Err(refuse(field, format!("must be at most {UNITS_MAX}")));
    }
    Ok(())
}

fn check_span(field: &'static str, value_us: u64) -> Result<(), PolicyError> {
    if value_us < SPAN_US_MIN {
        return Err(refuse(field, "must be at least 1 ms"));
    }
    if value_us > SPAN_US_MAX {
        return Err(refuse(field, "must be at most 366 days"));
    }
    Ok(())
}

fn check_reserve(reserve: Reserve, capacity: u64) -> Result<(), PolicyError> {
    if reserve.total() >= capacity {
        return Err(refuse(
            "reserve",
            format!(
                "reserves add up to {} but must leave at least one of {capacity} units to every priority",
                reserve.total()
            ),
        ));
    }
    Ok(())
}

impl Policy {
    pub fn rate(
        limit: u64,
        period_us: u64,
        margin_us: u64,
        algorithm: Algorithm,
        reserve: Reserve,
    ) -> Result<Policy, PolicyError> {
        check_units("limit", limit)?;
        check_span("period_us", period_us)?;
        if margin_us > SPAN_US_MAX {
            return Err(refuse("margin_us", "must be at most 366 days"));
        }
        if let Algorithm::Gcra { burst } = algorithm {
            check_units("burst", burst)?;
        }
        let rate = Rate {
            limit,
            period_us,
            margin_us,
            algorithm,
            emission_us: (period_us + margin_us).div_ceil(limit),
        };
        if let Algorithm::Gcra { .. } = algorithm
            && limit > rate.window_us()
        {
            // The emission interval is whole microseconds, rounded up so the rate is never
            // exceeded; below one microsecond that rounding would silently cut the rate to a
            // million a second. Say so instead.
            return Err(refuse(
                "limit",
                "a gcra limit counts in whole microseconds: at most one unit per microsecond of \
                 its period; use sliding or fixed for more",
            ));
        }
        if let Algorithm::Gcra { burst } = algorithm {
            // The decision adds up to `burst * T` to `now`. Unchecked, `burst` and `T` at their
            // maxima overflow `u64`; keep the time a full burst takes to drain within the longest
            // window a rate limit can count in (period plus margin, 366 days each).
            let drain_us_max = 2 * SPAN_US_MAX;
            if burst
                .checked_mul(rate.emission_us())
                .is_none_or(|drain_us| drain_us > drain_us_max)
            {
                return Err(refuse(
                    "burst",
                    "a full burst must drain within 732 days: burst * period / limit is too long",
                ));
            }
        }
        check_reserve(reserve, rate.capacity())?;
        Ok(Policy {
            kind: Kind::Rate(rate),
            reserve,
        })
    }

    pub fn concurrency(
        limit: u64,
        lease_ttl_us: u64,
        reserve: Reserve,
    ) -> Result<Policy, PolicyError> {
        check_units("limit", limit)?;
        if limit > crate::counter::LEASES_MAX {
            return Err(refuse(
                "limit",
                format!(
                    "a concurrency limit must be at most {}",
                    crate::counter::LEASES_MAX
                ),
            ));
        }
        check_span("lease_ttl_us", lease_ttl_us)?;
        check_reserve(reserve, limit)?;
        Ok(Policy {
            kind: Kind::Concurrency(Concurrency {
                limit,
                lease_ttl_us,
            }),
            reserve,
        })
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    pub fn reserve(&self) -> Reserve {
        self.reserve
    }

    pub fn is_concurrency(&self) -> bool {
        matches!(self.kind, Kind::Concurrency(_))
    }

    pub fn is_gcra(&self) -> bool {
        matches!(&self.kind, Kind::Rate(rate) if matches!(rate.algorithm(), Algorithm::Gcra { .. }))
    }

    /// Units that can be held at once: the limit, or the burst for GCRA.
    pub fn capacity(&self) -> u64 {
        match &self.kind {
            Kind::Rate(rate) => rate.capacity(),
            Kind::Concurrency(concurrency) => concurrency.limit,
        }
    }

    /// Units open to `priority`: capacity less what is reserved for higher levels.
    pub fn capacity_for(&self, priority: Priority) -> u64 {
        self.capacity() - self.reserve.kept_from(priority)
    }

    /// How long a grant can go on counting: after this span nothing granted before can affect
    /// a decision. A store that lost its state waits this long before granting again (G6).
    pub fn memory_us(&self) -> u64 {
        match &self.kind {
            Kind::Rate(rate) => match rate.algorithm {
                Algorithm::Sliding | Algorithm::Fixed => rate.window_us(),
                // TAT runs at most `burst * T` ahead of now.
                Algorithm::Gcra { burst } => rate.emission_us().saturating_mul(burst),
            },
            Kind::Concurrency(concurrency) => concurrency.lease_ttl_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_algorithm_is_listed_once_and_read_back_by_name() {
        for (place, algorithm) in Algorithm::EACH.into_iter().enumerate() {
            // A new algorithm fails to compile here until it is given its place in EACH.
            let expected = match algorithm {
                Algorithm::Sliding => 0,
                Algorithm::Fixed => 1,
                Algorithm::Gcra { .. } => 2,
            };
            assert_eq!(place, expected, "{algorithm:?}");
            assert_eq!(Algorithm::named(algorithm.name(), 1), Some(algorithm));
        }
        assert_eq!(
            Algorithm::named("gcra", 7),
            Some(Algorithm::Gcra { burst: 7 })
        );
        assert_eq!(Algorithm::named("Sliding", 1), None);
    }
}
