//! The recent past of every limit, kept by the server so that `GET /v1/stats?history=` (and a
//! dashboard opened in the middle of an incident) shows what happened before anyone looked.
//!
//! Every second the sampler reads, per limit in force: the units its counter holds (a limit not
//! counted per key; one counted per key has a counter per key, so none), the grants and denials
//! since the last sample, and the acquires waiting. The last five minutes are kept at one
//! second, the last hour at ten seconds. The bound: at most `LIMITS_MAX` limits (the first by
//! name), each `SLOTS * size_of::<Slot>()` bytes: 660 × 16 B, about 10.3 KiB; so at most about
//! 10 MiB whatever the rules hold. The history lives in memory and starts with the process.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tollgate_api::stats::Series;

/// How often a sample is taken.
pub(crate) const STEP: Duration = Duration::from_secs(1);
/// Samples kept at one second: five minutes.
pub(crate) const FINE_SLOTS: usize = 300;
/// Fine samples folded into one coarse sample.
pub(crate) const COARSE_EVERY: u64 = 10;
/// Coarse samples kept: an hour at ten seconds.
pub(crate) const COARSE_SLOTS: usize = 360;
/// Every slot a limit keeps.
#[cfg(test)]
const SLOTS: usize = FINE_SLOTS + COARSE_SLOTS;
/// Limits whose history is kept; the others (past the first by name) have none.
pub(crate) const LIMITS_MAX: usize = 1_000;
/// The longest history served, in seconds.
pub(crate) const SPAN_S_MAX: u64 = COARSE_SLOTS as u64 * COARSE_EVERY;

/// `used` when the counter could not be read, or has no single counter (counted per key).
const UNKNOWN: u32 = u32::MAX;

/// One step of one limit. Counts saturate rather than wrap: a step holds at most 4 billion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Units (or lease slots) counted when the sample was taken; the most over a coarse step.
    used: u32,
    /// Grants in the step.
    grants: u32,
    /// Denials in the step.
    denials: u32,
    /// Acquires waiting when the sample was taken; the most over a coarse step.
    waiting: u32,
}

fn narrow(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(UNKNOWN - 1)
}

impl Slot {
    fn fold(&mut self, other: Slot) {
        self.used = match (self.used, other.used) {
            (UNKNOWN, used) | (used, UNKNOWN) => used,
            (a, b) => a.max(b),
        };
        self.grants = self.grants.saturating_add(other.grants);
        self.denials = self.denials.saturating_add(other.denials);
        self.waiting = self.waiting.max(other.waiting);
    }
}

/// What the sampler read of one limit.
#[derive(Clone, Debug)]
pub(crate) struct Reading {
    pub(crate) name: String,
    pub(crate) used: Option<u64>,
    /// Grants and denials since the server started.
    pub(crate) grants: u64,
    pub(crate) denials: u64,
    pub(crate) waiting: u64,
}

#[derive(Debug)]
struct Track {
    fine: VecDeque<Slot>,
    coarse: VecDeque<Slot>,
    /// The coarse step being filled.
    pending: Slot,
    /// Totals at the newest sample: the next sample's counts are the growth since.
    grants: u64,
    denials: u64,
}

impl Track {
    fn new(reading: &Reading) -> Track {
        Track {
            fine: VecDeque::with_capacity(FINE_SLOTS),
            coarse: VecDeque::with_capacity(COARSE_SLOTS),
            pending: Slot {
                used: UNKNOWN,
                ..Slot::default()
            },
            // Counted from its first sample: what came before is not spread over one step.
            grants: reading.grants,
            denials: reading.denials,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    tracks: BTreeMap<String, Track>,
    /// Samples taken so far, and when the newest was.
    samples: u64,
    newest: Option<Instant>,
}

/// The history of every limit (up to `LIMITS_MAX`).
#[derive(Debug, Default)]
pub(crate) struct History {
    inner: Mutex<Inner>,
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Record one sample of every limit read, taken at `at`. A limit not read this time has
    /// left the rules (or the first `LIMITS_MAX`), and its history goes with it.
    pub(crate) fn record(&self, at: Instant, readings: Vec<Reading>) {
        let mut inner = self.lock();
        inner.samples += 1;
        inner.newest = Some(at);
        let closes_coarse = inner.samples.is_multiple_of(COARSE_EVERY);
        let mut kept = BTreeMap::new();
        for reading in readings.into_iter().take(LIMITS_MAX) {
            let mut track = inner
                .tracks
                .remove(&reading.name)
                .unwrap_or_else(|| Track::new(&reading));
            let slot = Slot {
                used: reading.used.map_or(UNKNOWN, narrow),
                grants: narrow(reading.grants.saturating_sub(track.grants)),
                denials: narrow(reading.denials.saturating_sub(track.denials)),
                waiting: narrow(reading.waiting),
            };
            track.grants = reading.grants;
            track.denials = reading.denials;
            if track.fine.len() == FINE_SLOTS {
                track.fine.pop_front();
            }
            track.fine.push_back(slot);
            track.pending.fold(slot);
            if closes_coarse {
                if track.coarse.len() == COARSE_SLOTS {
                    track.coarse.pop_front();
                }
                track.coarse.push_back(track.pending);
                track.pending = Slot {
                    used: UNKNOWN,
                    ..Slot::default()
                };
            }
            kept.insert(reading.name, track);
        }
        inner.tracks = kept;
    }

    /// The last `span_s` seconds of `limit`: at one second up to five minutes, else at ten
    /// seconds (the newest coarse step closed). `None` when no history is kept for it.
    pub(crate) fn series(&self, limit: &str, span_s: u64, now: Instant) -> Option<Series> {
        let inner = self.lock();
        let track = inner.tracks.get(limit)?;
        let fine = span_s <= FINE_SLOTS as u64;
        let (slots, step_ms, count) = if fine {
            (&track.fine, 1_000, span_s as usize)
        } else {
            (
                &track.coarse,
                10_000,
                span_s.div_ceil(COARSE_EVERY) as usize,
            )
        };
        let since_newest = inner.newest.map_or(0, |newest| {
            now.saturating_duration_since(newest).as_millis() as u64
        });
        // The newest coarse step closed at the last sample whose number is a multiple of ten.
        let age_ms = if fine {
            since_newest
        } else {
            since_newest + (inner.samples % COARSE_EVERY) * 1_000
        };
        let shown: Vec<Slot> = slots
            .iter()
            .skip(slots.len().saturating_sub(count))
            .copied()
            .collect();
        // A coarse series' totals are as of its newest step: the fine steps since are taken off.
        let (mut grants_total, mut denials_total) = (track.grants, track.denials);
        if !fine {
            let after = (inner.samples % COARSE_EVERY) as usize;
            for slot in track.fine.iter().rev().take(after) {
                grants_total = grants_total.saturating_sub(u64::from(slot.grants));
                denials_total = denials_total.saturating_sub(u64::from(slot.denials));
            }
        }
        Some(Series {
            step_ms,
            age_ms,
            used: shown
                .iter()
                .map(|slot| (slot.used != UNKNOWN).then_some(u64::from(slot.used)))
                .collect(),
            grants: shown.iter().map(|slot| u64::from(slot.grants)).collect(),
            denials: shown.iter().map(|slot| u64::from(slot.denials)).collect(),
            waiting: shown.iter().map(|slot| u64::from(slot.waiting)).collect(),
            grants_total,
            denials_total,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(name: &str, used: Option<u64>, grants: u64, denials: u64) -> Reading {
        Reading {
            name: name.to_owned(),
            used,
            grants,
            denials,
            waiting: 0,
        }
    }

    #[test]
    fn a_slot_is_sixteen_bytes_so_a_limit_keeps_about_ten_kib() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
        assert_eq!(SLOTS * std::mem::size_of::<Slot>(), 10_560);
    }

    #[test]
    fn steps_hold_the_growth_since_the_last_sample_and_totals_add_up() {
        let history = History::default();
        let start = Instant::now();
        for second in 0..25u64 {
            let at = start + Duration::from_secs(second);
            history.record(at, vec![reading("a", Some(second), 3 * second, second / 2)]);
        }
        let now = start + Duration::from_secs(24);
        let fine = history.series("a", 5, now).expect("kept");
        assert_eq!(fine.step_ms, 1_000);
        assert_eq!(fine.age_ms, 0);
        assert_eq!(fine.grants, vec![3; 5]);
        assert_eq!(fine.used, [20, 21, 22, 23, 24].map(Some).to_vec());
        assert_eq!(fine.grants_total, 72);
        assert_eq!(fine.denials_total, 12);
        // Ten-second steps: the first sample counts nothing (no earlier total to grow from).
        let coarse = history.series("a", 3_600, now).expect("kept");
        assert_eq!(coarse.step_ms, 10_000);
        assert_eq!(coarse.grants, vec![27, 30]);
        assert_eq!(coarse.used, vec![Some(9), Some(19)]);
        // The newest coarse step closed at sample 20 (second 19), five samples ago.
        assert_eq!(coarse.age_ms, 5_000);
        assert_eq!(coarse.grants_total, 3 * 19);
        assert_eq!(
            coarse.grants_total - coarse.grants.iter().sum::<u64>(),
            0,
            "the running totals start from the first sample's"
        );
    }

    #[test]
    fn the_history_is_bounded_in_steps_and_in_limits() {
        let history = History::default();
        let start = Instant::now();
        for second in 0..(COARSE_SLOTS as u64 * COARSE_EVERY + 20) {
            let readings = vec![reading("a", None, second, 0), reading("b", None, 0, 0)];
            history.record(start + Duration::from_secs(second), readings);
        }
        for track in history.lock().tracks.values() {
            assert_eq!(track.fine.len(), FINE_SLOTS);
            assert_eq!(track.coarse.len(), COARSE_SLOTS);
        }
        let series = history.series("a", SPAN_S_MAX, start).expect("kept");
        assert_eq!(series.grants.len(), COARSE_SLOTS);
        assert!(series.used.iter().all(Option::is_none));
        // Past the first LIMITS_MAX limits by name, none is kept.
        let names: Vec<String> = (0..LIMITS_MAX + 5).map(|i| format!("l{i:05}")).collect();
        let readings = names.iter().map(|name| reading(name, None, 0, 0)).collect();
        history.record(start, readings);
        assert_eq!(history.lock().tracks.len(), LIMITS_MAX);
        assert!(history.series(&names[LIMITS_MAX - 1], 60, start).is_some());
        assert!(history.series(&names[LIMITS_MAX], 60, start).is_none());
    }

    #[test]
    fn a_limit_that_leaves_the_rules_leaves_the_history() {
        let history = History::default();
        let start = Instant::now();
        history.record(
            start,
            vec![reading("a", None, 0, 0), reading("b", None, 0, 0)],
        );
        history.record(start, vec![reading("b", None, 1, 0)]);
        assert!(history.series("a", 60, start).is_none());
        assert_eq!(
            history.series("b", 60, start).expect("kept").grants,
            vec![0, 1]
        );
    }
}
