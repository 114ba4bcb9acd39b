//! Clocks that decide for in-process stores. A clock returns integer microseconds; only
//! differences matter to the decision core. Shared stores bring their own clock (Redis `TIME`).

use std::fmt;

use crate::sync::{AtomicU64, Ordering};

/// A source of "now" in microseconds for deciding. Must never step backwards by much: the core
/// tolerates a step back (it stays safe), but waiting times are computed from it.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now_us(&self) -> u64;
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
        let elapsed = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX / 4);
        self.origin_us + elapsed
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
