//! What a denial says besides "no": its reason, what remains to the priority that asked, and
//! what is left to every priority (`Denial::left`), which tells a limit used up from one whose
//! last units are kept for higher priorities. Every algorithm, each with a reserve.

use tollgate_core::{Algorithm, Counter, DenyReason, Policy, Priority, Reserve, Verdict};

const PERIOD_US: u64 = 1_000_000;

/// Ten units a period, four of them kept from normal and low priority.
fn policy(algorithm: Algorithm) -> Policy {
    let reserve = Reserve { high: 4, normal: 0 };
    Policy::rate(10, PERIOD_US, 0, algorithm, reserve).expect("a valid policy")
}

fn algorithms() -> [Algorithm; 3] {
    [
        Algorithm::Sliding,
        Algorithm::Fixed,
        Algorithm::Gcra { burst: 10 },
    ]
}

/// A counter at time `now` with `units` granted at normal priority.
fn counter_with(policy: &Policy, now: u64, units: u64) -> Counter {
    let mut counter = Counter::new(now);
    for _ in 0..units {
        let verdict = counter
            .decide(policy, now, 1, Priority::Normal, false)
            .expect("a valid cost");
        assert!(matches!(verdict, Verdict::Granted(_)), "{verdict:?}");
    }
    counter
}

#[test]
fn a_denial_for_the_reserve_says_what_is_left_to_higher_priorities() {
    for algorithm in algorithms() {
        let policy = policy(algorithm);
        let now = 5 * PERIOD_US;
        let mut counter = counter_with(&policy, now, 6);
        let denial = counter
            .check(&policy, now, 1, Priority::Normal)
            .expect("a valid cost")
            .expect("normal priority has used all it may");
        assert_eq!(denial.reason, DenyReason::Capacity, "{algorithm:?}");
        assert_eq!(denial.remaining, 0, "{algorithm:?}: nothing open to normal");
        assert_eq!(denial.left, 4, "{algorithm:?}: the reserve is left, kept");
        // High priority may take what is kept; once it has, nothing is left to anyone.
        for _ in 0..4 {
            let verdict = counter
                .decide(&policy, now, 1, Priority::High, false)
                .expect("a valid cost");
            assert!(matches!(verdict, Verdict::Granted(_)), "{algorithm:?}");
        }
        let denial = counter
            .check(&policy, now, 1, Priority::High)
            .expect("a valid cost")
            .expect("the limit is used up");
        assert_eq!(denial.reason, DenyReason::Capacity, "{algorithm:?}");
        assert_eq!(denial.left, 0, "{algorithm:?}: used up, not kept");
    }
}

#[test]
fn a_paused_denial_leaves_nothing_whatever_the_limit_holds() {
    for algorithm in algorithms() {
        let policy = policy(algorithm);
        let now = 5 * PERIOD_US;
        let mut counter = counter_with(&policy, now, 2);
        counter.pause(now + 3_000);
        let denial = counter
            .check(&policy, now, 1, Priority::Normal)
            .expect("a valid cost")
            .expect("paused");
        assert_eq!(denial.reason, DenyReason::Paused, "{algorithm:?}");
        assert_eq!(denial.retry_after_us, 3_000, "{algorithm:?}");
        assert_eq!(
            denial.remaining, 4,
            "{algorithm:?}: open to normal, once resumed"
        );
        assert_eq!(
            denial.left, 0,
            "{algorithm:?}: `left` speaks of capacity only"
        );
    }
}
