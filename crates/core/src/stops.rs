//! What stops a grant besides a counter's own count, and which reason a denial gives. A store
//! knows two things about a counter's limit that the counter does not hold: a pause on the
//! whole limit (every key of a limit counted per key), and a hold after the store lost what it
//! counted (`Counter::recovering`, which the counter keeps as its own pause). These rules say
//! how both change a counter's verdict, and which reason a request denied on several counters
//! gives; every store asks them (the Redis script keeps a copy, tied to these by the
//! differential tests).

use crate::CostError;
use crate::counter::{Counter, Denial, DenyReason};
use crate::policy::{Policy, Priority};

/// What a store knows of a counter's limit at a decision, beyond the counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Around {
    /// When the pause on the whole limit ends, on the store's clock; 0 (or any time past) for
    /// none.
    pub limit_paused_until: u64,
    /// When the store's hold on the limit ends, while one is on.
    pub held_until: Option<u64>,
}

impl Counter {
    /// `check` as a store decides it, with what it knows `around` the counter: a limit-wide
    /// pause denies what the counter alone would grant, and lengthens any other denial; a pause
    /// that is the store's hold, and ends no later than it, is `Recovering`.
    pub fn check_around(
        &mut self,
        policy: &Policy,
        now: u64,
        cost: u64,
        priority: Priority,
        around: Around,
    ) -> Result<Option<Denial>, CostError> {
        let limit_pause_us = around.limit_paused_until.saturating_sub(now);
        let mut denial = match self.check(policy, now, cost, priority)? {
            Some(denial) => denial,
            None if limit_pause_us > 0 => Denial {
                retry_after_us: 0,
                remaining: self.status(policy, now, priority).0,
                reason: DenyReason::Paused,
                left: 0,
            },
            None => return Ok(None),
        };
        if limit_pause_us > 0 {
            denial.retry_after_us = denial.retry_after_us.max(limit_pause_us);
            denial.reason = DenyReason::Paused;
            denial.left = 0;
        }
        // Nobody asked for a hold: the reason says so, unless a pause someone asked for lasts
        // longer.
        if denial.reason == DenyReason::Paused
            && around.held_until == Some(self.paused_until())
            && now.saturating_add(denial.retry_after_us) <= self.paused_until()
        {
            denial.reason = DenyReason::Recovering;
        }
        Ok(Some(denial))
    }
}

impl DenyReason {
    /// The reason a request denied on several counters gives, of this one and `other`: a pause
    /// someone asked for is the news; a hold, the next; then waiters ahead (elsewhere in the
    /// fleet, on a store that queues them); capacity last.
    pub fn most_telling(self, other: DenyReason) -> DenyReason {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }

    fn rank(self) -> u8 {
        match self {
            DenyReason::Capacity => 0,
            DenyReason::Queued => 1,
            DenyReason::Recovering => 2,
            DenyReason::Paused => 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, Reserve};

    fn policy() -> Policy {
        Policy::rate(2, 1_000_000, 0, Algorithm::Sliding, Reserve::default()).expect("a policy")
    }

    #[test]
    fn a_limit_wide_pause_denies_what_the_counter_would_grant() {
        let mut counter = Counter::new(0);
        let around = Around {
            limit_paused_until: 500,
            held_until: None,
        };
        let denial = counter
            .check_around(&policy(), 100, 1, Priority::Normal, around)
            .expect("a valid cost")
            .expect("denied");
        assert_eq!(denial.reason, DenyReason::Paused);
        assert_eq!(denial.retry_after_us, 400);
        assert_eq!(denial.remaining, 2);
        assert_eq!(denial.left, 0);
        // Once it ends, the counter decides alone.
        assert!(
            counter
                .check_around(&policy(), 500, 1, Priority::Normal, around)
                .expect("a valid cost")
                .is_none()
        );
    }

    #[test]
    fn a_limit_wide_pause_lengthens_a_denial_for_capacity_and_keeps_nothing_for_others() {
        let policy = policy();
        let mut counter = Counter::new(0);
        for at in [0, 1] {
            let verdict = counter
                .decide(&policy, at, 1, Priority::Normal, false)
                .expect("a valid cost");
            assert!(verdict.is_granted());
        }
        let around = Around {
            limit_paused_until: 2_000_000,
            held_until: None,
        };
        let denial = counter
            .check_around(&policy, 10, 1, Priority::Normal, around)
            .expect("a valid cost")
            .expect("denied");
        assert_eq!(denial.reason, DenyReason::Paused);
        assert_eq!(denial.retry_after_us, 2_000_000 - 10);
        assert_eq!(denial.left, 0);
        // A shorter limit-wide pause leaves the wait for room as it was.
        let short = Around {
            limit_paused_until: 20,
            held_until: None,
        };
        let denial = counter
            .check_around(&policy, 10, 1, Priority::Normal, short)
            .expect("a valid cost")
            .expect("denied");
        assert_eq!(denial.retry_after_us, 1_000_000 - 10);
    }

    #[test]
    fn a_hold_is_recovering_until_a_longer_pause_outlasts_it() {
        let policy = policy();
        let mut counter = Counter::recovering(0, 1_000);
        let held = Around {
            limit_paused_until: 0,
            held_until: Some(1_000),
        };
        let denial = counter
            .check_around(&policy, 10, 1, Priority::Normal, held)
            .expect("a valid cost")
            .expect("denied");
        assert_eq!(denial.reason, DenyReason::Recovering);
        // A store that does not know of the hold sees only a pause.
        let unknown = Around::default();
        let denial = counter
            .check_around(&policy, 10, 1, Priority::Normal, unknown)
            .expect("a valid cost")
            .expect("denied");
        assert_eq!(denial.reason, DenyReason::Paused);
        // A limit-wide pause past the hold's end is the news.
        let longer = Around {
            limit_paused_until: 5_000,
            held_until: Some(1_000),
        };
        let denial = counter
            .check_around(&policy, 10, 1, Priority::Normal, longer)
            .expect("a valid cost")
            .expect("denied");
        assert_eq!(denial.reason, DenyReason::Paused);
        assert_eq!(denial.retry_after_us, 4_990);
        // A pause asked for on the counter itself, past the hold, is not the hold.
        counter.pause(3_000);
        let denial = counter
            .check_around(&policy, 10, 1, Priority::Normal, held)
            .expect("a valid cost")
            .expect("denied");
        assert_eq!(denial.reason, DenyReason::Paused);
    }

    #[test]
    fn the_most_telling_reason_is_a_pause_then_a_hold_then_waiters_then_capacity() {
        use DenyReason::{Capacity, Paused, Queued, Recovering};
        let order = [Capacity, Queued, Recovering, Paused];
        for (low, lower) in order.iter().enumerate() {
            for higher in &order[low..] {
                assert_eq!(lower.most_telling(*higher), *higher);
                assert_eq!(higher.most_telling(*lower), *higher);
            }
        }
        // Every reason has its place.
        for reason in DenyReason::ALL {
            assert!(order.contains(&reason));
        }
    }
}
