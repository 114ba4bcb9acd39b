//! Clocks that decide for in-process stores. A clock returns integer microseconds; only
//! differences matter to the decision core. Shared stores bring their own clock (Redis `TIME`).

use std::fmt;

use crate::sync::{AtomicU64, Ordering};

/// A source of "now" in microseconds for deciding. Must never step backwards by much: the core
/// tolerates a step back (it stays safe), but waiting times are computed from it.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now_us(&self) -> u64;
}

fn whole_micros(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The process's monotonic clock (`tokio::time::Instant`), so tests that pause tokio's time
/// drive decisions and waiting together, deterministically.
#[derive(Debug)]
pub struct MonotonicClock {
    origin: tokio::time::Instant,
    /// Microseconds the origin is after the Unix epoch, so readings look like wall time.
    origin_us: u64,
}

impl MonotonicClock {
    pub fn new() -> MonotonicClock {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        MonotonicClock {
            origin: tokio::time::Instant::now(),
            origin_us: u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX / 2),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> MonotonicClock {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        self.origin_us
            .saturating_add(whole_micros(self.origin.elapsed()))
    }
}

/// The CPU's time-stamp counter, calibrated against the monotonic clock once per process (via
/// `quanta`; where the counter is not invariant it reads the monotonic clock instead): cheaper
/// to read than `MonotonicClock`, for in-process limiters on a hot path. It does not follow
/// tokio's paused test time, so tests that pause time use `MonotonicClock` or `ManualClock`.
#[derive(Debug, Clone)]
pub struct TscClock {
    clock: quanta::Clock,
    /// The raw counter at the origin: a reading is one subtraction and one scaling from it.
    origin: u64,
    /// Microseconds the origin is after the Unix epoch, so readings look like wall time.
    origin_us: u64,
}

impl TscClock {
    pub fn new() -> TscClock {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        TscClock {
            clock,
            origin,
            origin_us: MonotonicClock::new().origin_us,
        }
    }
}

impl Default for TscClock {
    fn default() -> TscClock {
        TscClock::new()
    }
}

impl Clock for TscClock {
    #[inline]
    fn now_us(&self) -> u64 {
        let elapsed_ns = self.clock.delta_as_nanos(self.origin, self.clock.raw());
        self.origin_us.saturating_add(elapsed_ns / 1_000)
    }
}

/// A clock moved only by hand, for tests that step time explicitly.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_us: AtomicU64,
}

impl ManualClock {
    pub fn new(start_us: u64) -> ManualClock {
        ManualClock {
            now_us: AtomicU64::new(start_us),
        }
    }

    pub fn advance_us(&self, delta_us: u64) {
        self.now_us.fetch_add(delta_us, Ordering::SeqCst);
    }

    pub fn set_us(&self, now_us: u64) {
        self.now_us.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use std::time::Duration;

    use super::{Clock, MonotonicClock, TscClock};

    /// The time-stamp clock reads like the monotonic one: near the same wall time, never
    /// backwards, and at least as far on as a sleep (no upper bound: the machine may be slow).
    #[test]
    fn the_tsc_clock_reads_microseconds_like_the_monotonic_clock() {
        let tsc = TscClock::new();
        let monotonic = MonotonicClock::new();
        let first = tsc.now_us();
        assert!(first.abs_diff(monotonic.now_us()) < 1_000_000, "same epoch");
        std::thread::sleep(Duration::from_millis(20));
        let second = tsc.now_us();
        assert!(second >= first + 15_000, "{first} then {second}");
        assert!(tsc.now_us() >= second);
    }
}

/// A time in microseconds since the Unix epoch, as people read it: `2024-05-01 12:34:56 UTC`
/// (seconds truncated). For logs and messages that would otherwise print a raw reading.
pub fn utc_text(unix_us: u64) -> String {
    let seconds = unix_us / 1_000_000;
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    // Howard Hinnant's civil-from-days, for days since 1970-01-01 (never negative here).
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// Now, as `utc_text` writes it.
pub fn utc_now_text() -> String {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    utc_text(whole_micros(since_epoch))
}

#[cfg(test)]
mod utc_tests {
    use super::utc_text;

    #[test]
    fn utc_text_reads_as_a_calendar_time() {
        assert_eq!(utc_text(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_text(951_782_400_000_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_text(1_714_566_896_500_000), "2024-05-01 12:34:56 UTC");
        assert_eq!(utc_text(4_102_444_799_000_000), "2099-12-31 23:59:59 UTC");
    }
}
