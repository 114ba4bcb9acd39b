//! A limit's key budget on Redis, as plain functions: what `T.admit` in `lua/keys.lua` decides,
//! written once more in Rust as its reference (`differential_tests.rs` drives the script's tally
//! through random admissions and compares every answer with `Tally::admit`) and as the model
//! whose invariant the tests below check: however admissions, moves, races, losses and time
//! interleave, a limit never has more counters of keys alive at once than its budget.
//!
//! The memory store counts a limit's keys as it makes and drops their counters. Redis drops a
//! counter by its expiry, unseen, so the Redis store bounds them another way. Every counter of a
//! key carries its *cover*: until when its limit's tally counts it. The script never writes a
//! counter to live past its cover; a write that would (a new key, a key in use whose cover runs
//! out, a pause past it) first asks the tally: one key in the limit's own slot that holds, for
//! each cover end, how many counters it counts until then.
//!
//! - A key whose counter is alive *moves* its cover: one count leaves the old end (when the
//!   tally still has it) and joins the new one. Never refused: the key keeps its place.
//! - Any other key is *admitted* while the tally counts fewer than `budget` covers now;
//!   otherwise the request is refused (`TooManyKeysForLimit`).
//! - A cover ends `COVER_SPANS` spans from now or later (`span_us`: the longest one write can
//!   make a counter live), rounded up on a grid, so that a key in steady use moves about once a
//!   span and the tally holds a few ends rather than one per key. The grid is half a span near
//!   now and doubles with the distance, so a long pause's cover is rounded up by less than a
//!   quarter of its length, and at most about nine ends per doubling are alive at once.
//!
//! So each counter alive now is counted at a live end, and the count is at most the budget as of
//! the last admission; a move never raises it. Two callers moving one key at once (on a cluster,
//! where the tally is asked apart from the counter) each take a count from the old end, one of
//! them another key's, but each adds one at a later end: the count stays at least the counters
//! alive. An admission whose counter is then not written (a request refused or rolled back)
//! counts until its end: fewer keys, never more.
//!
//! A tally lost apart from the counters it counts (on a cluster its slot failed over or
//! restarted; anywhere, evicted) would read as empty while they live. So, like a counter, a
//! tally found missing or written in an older generation is *held*: no new key is admitted for
//! a request (`Admission::Held`, answered as `recovering`) until every ordinary cover given
//! before the loss has ended, `HOLD_SPANS` spans after it. Keys alive keep moving, and a pause
//! is admitted during the hold. On one Redis (or a Sentinel's master) the tally and the
//! counters are lost together, so only an eviction holds it. A pause's longer cover is not
//! waited out: after a loss a limit may hold its keys paused before it beside a full budget.

use tollgate_core::{Kind, Policy};

/// A cover runs at least this many spans from the write that asks for it.
pub const COVER_SPANS: u64 = 2;
/// A tally found lost admits no new key for this many spans: past every ordinary cover.
pub const HOLD_SPANS: u64 = 3;
/// A cover end is rounded up on a grid of at least an eighth of its distance from now.
pub(crate) const GRID_PER_DISTANCE: u64 = 8;
/// A log's expiry is pushed a sixteenth of the window past what it needs, so that a grant does
/// not move it every time; a log outlives its counter by at most that.
pub(crate) const LOG_SLACK_PER_WINDOW: u64 = 16;
/// An expiry is set in whole milliseconds, rounded up, plus one: 2 ms past what it needs.
pub(crate) const EXPIRY_SLACK_US: u64 = 2_000;

/// The longest one write can make a counter of `policy` live, its logs included: its window
/// (or its memory, when longer: a GCRA burst beyond the limit, a lease TTL), the logs' slack
/// of a sixteenth of the window (`lua/sliding.lua`), and 2 ms for an expiry set in whole
/// milliseconds, rounded up, plus one.
pub fn span_us(policy: &Policy) -> u64 {
    let window_us = match policy.kind() {
        Kind::Rate(rate) => rate.window_us(),
        Kind::Concurrency(_) => 0,
    };
    window_us.max(policy.memory_us()) + window_us / LOG_SLACK_PER_WINDOW + EXPIRY_SLACK_US
}

/// The cover given at `now_us` to a counter that must live until `need_us`.
pub fn cover_end(now_us: u64, need_us: u64, span_us: u64) -> u64 {
    let target_us = need_us.max(now_us + COVER_SPANS * span_us);
    let mut grid_us = span_us.div_ceil(2);
    while target_us - now_us > GRID_PER_DISTANCE * grid_us {
        grid_us *= 2;
    }
    target_us.div_ceil(grid_us) * grid_us
}

/// The slot a tally is asked in, as its call finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The birth of the slot's generation (`loss`).
    pub born_us: u64,
    /// When the node's evictions were last seen to move (0: never, or not watched).
    pub seen_us: u64,
    /// Whether the tally can be lost apart from the counters it counts: on a cluster, where
    /// they sit in other slots, on other masters.
    pub apart: bool,
}

/// What one admission asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The counter's cover as written (0: no counter): alive past now, the key moves.
    pub old_us: u64,
    /// Until when the write must let the counter live.
    pub need_us: u64,
    /// The limit's budget of keys.
    pub budget: u64,
    pub span_us: u64,
    /// A request (not a pause) honours a hold after a loss.
    pub honour_hold: bool,
}

/// The tally's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Counted until this cover end.
    Covered(u64),
    /// A new key, and the budget is full.
    Full,
    /// A new key of a request, while the tally is held after a loss: until then.
    Held(u64),
}

/// A limit's tally as Redis keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The birth of the generation it was last written in; `None`: not found.
    pub written_in_us: Option<u64>,
    /// Until when it admits no new key of a request.
    pub held_until_us: u64,
    /// Cover ends and how many counters each counts, ascending by end, every count at least 1.
    pub ends: Vec<(u64, u64)>,
}

impl Tally {
    /// Until when a tally found as this one is, in `slot`, admits no new key of a request.
    fn hold_until(&self, slot: &Slot, span_us: u64) -> u64 {
        let lost_at_us = if slot.apart { slot.born_us } else { 0 };
        match self.written_in_us {
            None => lost_at_us.max(slot.seen_us) + HOLD_SPANS * span_us,
            Some(written) if written != slot.born_us => {
                self.held_until_us.max(lost_at_us + HOLD_SPANS * span_us)
            }
            Some(_) => self.held_until_us,
        }
    }

    /// Covers counted at `now_us`.
    pub fn counted(&self, now_us: u64) -> u64 {
        self.ends
            .iter()
            .filter(|&&(end, _)| end > now_us)
            .map(|&(_, count)| count)
            .sum()
    }

    /// Decide `ask` at `now_us`. A refusal changes nothing Redis keeps.
    pub fn admit(&mut self, now_us: u64, ask: &Ask, slot: &Slot) -> Admission {
        let held_until_us = self.hold_until(slot, ask.span_us);
        self.ends.retain(|&(end, _)| end > now_us);
        if ask.old_us > now_us {
            if let Some(at) = self.ends.iter().position(|&(end, _)| end == ask.old_us) {
                self.ends[at].1 -= 1;
                if self.ends[at].1 == 0 {
                    self.ends.remove(at);
                }
            }
        } else {
            if ask.honour_hold && held_until_us > now_us {
                return Admission::Held(held_until_us);
            }
            if self.counted(now_us) >= ask.budget {
                return Admission::Full;
            }
        }
        let end_us = cover_end(now_us, ask.need_us, ask.span_us);
        match self.ends.binary_search_by_key(&end_us, |&(end, _)| end) {
            Ok(at) => self.ends[at].1 += 1,
            Err(at) => self.ends.insert(at, (end_us, 1)),
        }
        self.written_in_us = Some(slot.born_us);
        self.held_until_us = held_until_us;
        Admission::Covered(end_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tollgate_core::{Algorithm, Reserve};

    const SPAN: u64 = 1_000;

    #[test]
    fn a_span_covers_the_window_the_logs_and_the_rounding_of_an_expiry() {
        let sliding = Policy::rate(5, 160_000, 0, Algorithm::Sliding, Reserve::default());
        assert_eq!(span_us(&sliding.expect("valid")), 160_000 + 10_000 + 2_000);
        // A burst beyond the limit: its backlog outlives the window.
        let gcra = Policy::rate(
            2,
            1_000_000,
            0,
            Algorithm::Gcra { burst: 10 },
            Reserve::default(),
        );
        assert_eq!(
            span_us(&gcra.expect("valid")),
            5_000_000 + 1_000_000 / 16 + 2_000
        );
        let leases = Policy::concurrency(3, 30_000_000, Reserve::default());
        assert_eq!(span_us(&leases.expect("valid")), 30_000_000 + 2_000);
    }

    #[test]
    fn a_cover_runs_two_spans_on_a_grid_that_widens_with_distance() {
        // Near now: two spans, rounded up to half a span.
        assert_eq!(cover_end(100, 0, SPAN), 2_500);
        assert_eq!(cover_end(1_000, 1_500, SPAN), 3_000);
        // A pause of 100 spans: rounded up by less than a quarter of its distance.
        let end = cover_end(1_000, 101_000, SPAN);
        assert!((101_000..101_000 + 25_000).contains(&end), "{end}");
        assert_eq!(end % 16_000, 0);
    }

    fn fresh(need_us: u64, budget: u64) -> Ask {
        Ask {
            old_us: 0,
            need_us,
            budget,
            span_us: SPAN,
            honour_hold: true,
        }
    }

    /// A slot whose generation began long before: nothing lost.
    const KEPT: Slot = Slot {
        born_us: 0,
        seen_us: 0,
        apart: true,
    };

    /// The tests' clock starts here: long after the generation's birth.
    const T0: u64 = 1_000_000;

    #[test]
    fn new_keys_are_admitted_to_the_budget_and_keys_alive_move_past_it() {
        let mut tally = Tally::default();
        let first = tally.admit(T0, &fresh(T0 + SPAN, 2), &KEPT);
        assert_eq!(first, Admission::Covered(T0 + 2_000));
        assert_eq!(tally.admit(T0, &fresh(T0 + SPAN, 2), &KEPT), first);
        assert_eq!(
            tally.admit(T0 + 10, &fresh(T0 + SPAN, 2), &KEPT),
            Admission::Full
        );
        // A key alive moves, full or not: one count from its end to the new one.
        let moved = Ask {
            old_us: T0 + 2_000,
            ..fresh(T0 + 1_900, 2)
        };
        assert_eq!(
            tally.admit(T0 + 900, &moved, &KEPT),
            Admission::Covered(T0 + 3_000)
        );
        assert_eq!(tally.ends, vec![(T0 + 2_000, 1), (T0 + 3_000, 1)]);
        // Once the first end passes, a new key has its place.
        assert_eq!(
            tally.admit(T0 + 2_000, &fresh(T0 + 3_000, 2), &KEPT),
            Admission::Covered(T0 + 4_000)
        );
        assert_eq!(tally.counted(T0 + 2_000), 2);
    }

    #[test]
    fn a_tally_lost_apart_from_its_counters_admits_no_new_key_of_a_request_for_three_spans() {
        let lost = Slot {
            born_us: 5_000,
            seen_us: 0,
            apart: true,
        };
        let mut tally = Tally::default();
        assert_eq!(
            tally.admit(5_000, &fresh(6_000, 9), &lost),
            Admission::Held(8_000)
        );
        // A pause, and a key alive, are admitted; the hold is kept with the tally.
        let pause = Ask {
            honour_hold: false,
            ..fresh(6_000, 9)
        };
        assert_eq!(tally.admit(5_100, &pause, &lost), Admission::Covered(7_500));
        assert_eq!(tally.held_until_us, 8_000);
        assert_eq!(
            tally.admit(7_999, &fresh(9_000, 9), &lost),
            Admission::Held(8_000)
        );
        assert!(matches!(
            tally.admit(8_000, &fresh(9_000, 9), &lost),
            Admission::Covered(_)
        ));
        // Written in an older generation (a stale copy): held from the new one's birth.
        let mut stale = Tally {
            written_in_us: Some(1),
            held_until_us: 0,
            ends: vec![(9_000, 1)],
        };
        assert_eq!(
            stale.admit(5_000, &fresh(6_000, 9), &lost),
            Admission::Held(8_000)
        );
        // One Redis: lost together with its counters, held only after an eviction.
        let together = Slot {
            apart: false,
            ..lost
        };
        assert!(matches!(
            Tally::default().admit(5_000, &fresh(6_000, 9), &together),
            Admission::Covered(_)
        ));
        let evicted = Slot {
            seen_us: 4_000,
            ..together
        };
        assert_eq!(
            Tally::default().admit(5_000, &fresh(6_000, 9), &evicted),
            Admission::Held(7_000)
        );
    }

    /// One step of the keys' traffic, for the invariant.
    #[derive(Clone, Debug)]
    enum Step {
        /// A grant on a key: its counter must live a span from now.
        Grant {
            key: usize,
        },
        /// A pause of a key for `tenths` tenths of a span.
        Pause {
            key: usize,
            tenths: u64,
        },
        /// Two grants on one key asking the tally at once: both find the same cover; the
        /// first answer is written to the counter, the second only counts.
        Race {
            key: usize,
        },
        /// A key admitted for a request that is then refused elsewhere: nothing written.
        Refused {
            key: usize,
        },
        Sleep {
            tenths: u64,
        },
        /// The tally's slot is lost apart from the counters: missing, or an older copy.
        Lost {
            stale: bool,
        },
    }

    fn step(keys: usize, pauses: bool, losses: bool) -> impl Strategy<Value = Step> {
        // Without long pauses, a pause asks at most two spans: an ordinary cover.
        let pause_tenths = if pauses { 1..400u64 } else { 1..21u64 };
        prop_oneof![
            6 => (0..keys).prop_map(|key| Step::Grant { key }),
            2 => (0..keys, pause_tenths).prop_map(|(key, tenths)| Step::Pause { key, tenths }),
            2 => (0..keys).prop_map(|key| Step::Race { key }),
            1 => (0..keys).prop_map(|key| Step::Refused { key }),
            4 => (1..30u64).prop_map(|tenths| Step::Sleep { tenths }),
            1 => any::<bool>().prop_map(move |stale| if losses {
                Step::Lost { stale }
            } else {
                Step::Sleep { tenths: 1 }
            }),
        ]
    }

    /// The keys' counters as the script keeps them: per key, until when it is alive and its
    /// cover (a counter past its life is gone, and its cover with it).
    struct Keys {
        counters: Vec<(u64, u64)>,
        tally: Tally,
        slot: Slot,
        budget: u64,
    }

    impl Keys {
        /// A write at `now` that needs `key`'s counter alive until `need`; `apply`: the answer
        /// reaches the counter (else the admission only counts).
        fn write(&mut self, key: usize, need: u64, now: u64, apply: bool) {
            let (alive, cover) = &mut self.counters[key];
            if *alive <= now {
                *cover = 0;
            }
            if need <= *cover {
                if apply {
                    *alive = (*alive).max(need);
                }
                return;
            }
            let ask = Ask {
                old_us: *cover,
                need_us: need,
                budget: self.budget,
                span_us: SPAN,
                honour_hold: true,
            };
            if let Admission::Covered(end) = self.tally.admit(now, &ask, &self.slot)
                && apply
            {
                *cover = end;
                // Kept a span once admitted (`T.keep`), within its cover.
                *alive = (*alive).max(need).max(now + SPAN);
            }
        }
    }

    /// Run `steps` as the script would, and check after each that the counters alive are never
    /// more than the budget, and none outlives its cover.
    fn run(budget: u64, steps: &[Step]) -> Result<(), String> {
        let mut keys = Keys {
            counters: vec![(0, 0); 8],
            tally: Tally::default(),
            slot: KEPT,
            budget,
        };
        let mut snapshot = Tally::default();
        let mut now = 1_000_000u64;
        for (index, step) in steps.iter().enumerate() {
            match *step {
                Step::Grant { key } => keys.write(key, now + SPAN, now, true),
                Step::Pause { key, tenths } => {
                    let need = keys.counters[key].0.max(now + tenths * SPAN / 10);
                    keys.write(key, need, now, true);
                }
                Step::Race { key } => {
                    let before = keys.counters[key];
                    keys.write(key, now + SPAN, now, true);
                    let after = keys.counters[key];
                    keys.counters[key] = before;
                    keys.write(key, now + SPAN, now, false);
                    keys.counters[key] = after;
                }
                Step::Refused { key } => keys.write(key, now + SPAN, now, false),
                Step::Sleep { tenths } => {
                    snapshot = keys.tally.clone();
                    now += tenths * SPAN / 10;
                }
                Step::Lost { stale } => {
                    keys.slot.born_us = now;
                    keys.tally = if stale {
                        snapshot.clone()
                    } else {
                        Tally::default()
                    };
                }
            }
            let alive = keys
                .counters
                .iter()
                .filter(|&&(until, _)| until > now)
                .count() as u64;
            if alive > budget {
                return Err(format!(
                    "step {index} {step:?}: {alive} counters alive at {now}, budget {budget}; \
                     {:?} {:?}",
                    keys.tally, keys.counters
                ));
            }
            let outlived = keys
                .counters
                .iter()
                .find(|&&(until, cover)| until > now && until > cover);
            if let Some(&(until, cover)) = outlived {
                return Err(format!(
                    "step {index}: a counter alive until {until} past its cover {cover}"
                ));
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn a_limit_never_has_more_keys_alive_than_its_budget(
            budget in 1u64..5,
            steps in proptest::collection::vec(step(8, true, false), 1..200),
        ) {
            let outcome = run(budget, &steps);
            prop_assert!(outcome.is_ok(), "{}", outcome.err().unwrap_or_default());
        }

        /// Losses of the tally alone (a cluster): the hold outlasts every ordinary cover
        /// given before the loss. (A pause's longer cover is not waited out, as documented.)
        #[test]
        fn nor_after_its_tally_is_lost_apart_from_its_counters(
            budget in 1u64..5,
            steps in proptest::collection::vec(step(8, false, true), 1..200),
        ) {
            let outcome = run(budget, &steps);
            prop_assert!(outcome.is_ok(), "{}", outcome.err().unwrap_or_default());
        }
    }
}
