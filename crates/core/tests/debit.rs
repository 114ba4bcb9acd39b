//! `Counter::debit` against the units it stands for: units a vendor counted beyond what was
//! granted (a model's answer longer than its estimate) are a debt that every later grant waits
//! out. Each case drives one counter through random grants, debits and refunds-free steps of
//! time, and keeps its own list of every grant and every unit debited, with its time. The
//! check reads that list alone: no grant is made while the units counted before it in its
//! window (grants and debts alike, the way a vendor counts them), with its own, pass the limit:
//! sliding, in the window of time ending at the grant; fixed, in the grant's aligned window;
//! GCRA, the list replayed through the virtual scheduling algorithm, written here again. It
//! also holds the bound: a debit never counts more than one capacity past the limit.

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use tollgate_core::{Algorithm, Counter, Policy, Priority, Reserve, Verdict};

#[derive(Clone, Copy, Debug)]
enum Shape {
    Sliding,
    Fixed,
    Gcra { burst: u64 },
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Acquire(u64),
    Debit(u64),
    Advance(u64),
}

#[derive(Clone, Copy, Debug)]
struct Counted {
    at: u64,
    units: u64,
    granted: bool,
}

const PERIOD_US: u64 = 1_000_000;

fn policy(shape: Shape, limit: u64) -> Policy {
    let algorithm = match shape {
        Shape::Sliding => Algorithm::Sliding,
        Shape::Fixed => Algorithm::Fixed,
        Shape::Gcra { burst } => Algorithm::Gcra { burst },
    };
    Policy::rate(limit, PERIOD_US, 0, algorithm, Reserve::default())
        .expect("the strategy builds valid policies")
}

fn fail(message: String) -> TestCaseError {
    TestCaseError::fail(message)
}

fn run(shape: Shape, limit: u64, steps: &[Step]) -> Result<Vec<Counted>, TestCaseError> {
    let policy = policy(shape, limit);
    let capacity = policy.capacity();
    let mut now = 5 * PERIOD_US;
    let mut counter = Counter::new(now);
    let mut counted = Vec::new();
    for step in steps {
        match *step {
            Step::Acquire(cost) => {
                let cost = 1 + cost % capacity;
                if let Ok(Verdict::Granted(_)) =
                    counter.decide(&policy, now, cost, Priority::Normal, true)
                {
                    counted.push(Counted {
                        at: now,
                        units: cost,
                        granted: true,
                    });
                }
            }
            Step::Debit(units) => {
                let debited = counter.debit(&policy, now, units);
                if debited > units {
                    return Err(fail(format!("debited {debited} of {units}")));
                }
                counted.push(Counted {
                    at: now,
                    units: debited,
                    granted: false,
                });
            }
            Step::Advance(by) => now += by % (2 * PERIOD_US),
        }
        let (used, _) = counter.usage(&policy, now);
        if used > 2 * capacity {
            return Err(fail(format!(
                "{used} counted at {now}: over twice the capacity {capacity}"
            )));
        }
    }
    Ok(counted)
}

fn check(shape: Shape, limit: u64, counted: &[Counted]) -> Result<(), TestCaseError> {
    let capacity = policy(shape, limit).capacity();
    match shape {
        Shape::Sliding => {
            for (index, grant) in counted.iter().enumerate().filter(|(_, c)| c.granted) {
                let within: u64 = counted[..=index]
                    .iter()
                    .filter(|earlier| earlier.at + PERIOD_US > grant.at)
                    .map(|earlier| earlier.units)
                    .sum();
                if within > capacity {
                    return Err(fail(format!(
                        "a grant at {} with {within} units counted in its window: over {capacity}",
                        grant.at
                    )));
                }
            }
        }
        Shape::Fixed => {
            for (index, grant) in counted.iter().enumerate().filter(|(_, c)| c.granted) {
                let within: u64 = counted[..=index]
                    .iter()
                    .filter(|earlier| earlier.at / PERIOD_US == grant.at / PERIOD_US)
                    .map(|earlier| earlier.units)
                    .sum();
                if within > capacity {
                    return Err(fail(format!(
                        "a grant at {} with {within} units counted in its fixed window: over \
                         {capacity}",
                        grant.at
                    )));
                }
            }
        }
        Shape::Gcra { burst } => {
            let emission = PERIOD_US.div_ceil(limit);
            let mut tat = 0u64;
            for entry in counted {
                if entry.granted && tat.saturating_sub(entry.at) > (burst - entry.units) * emission
                {
                    return Err(fail(format!(
                        "a grant of {} at {} with a backlog to {tat}: over a burst of {burst}",
                        entry.units, entry.at
                    )));
                }
                tat = tat.max(entry.at) + entry.units * emission;
            }
        }
    }
    Ok(())
}

fn shapes() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::Sliding),
        Just(Shape::Fixed),
        (1..6u64).prop_map(|burst| Shape::Gcra { burst }),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            4 => any::<u64>().prop_map(Step::Acquire),
            1 => (0..40u64).prop_map(Step::Debit),
            3 => (0..800_000u64).prop_map(Step::Advance),
        ],
        1..80,
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_grant_passes_a_debt_counted_before_it(
        shape in shapes(),
        limit in 1..12u64,
        steps in steps(),
    ) {
        let shape = match shape {
            Shape::Gcra { burst } => Shape::Gcra { burst: burst.min(limit).max(1) },
            other => other,
        };
        let counted = run(shape, limit, &steps)?;
        check(shape, limit, &counted)?;
    }
}

#[test]
fn a_debt_is_counted_past_the_limit_up_to_one_capacity() {
    for shape in [Shape::Sliding, Shape::Fixed, Shape::Gcra { burst: 10 }] {
        let policy = policy(shape, 10);
        let now = 3 * PERIOD_US;
        let mut counter = Counter::new(now);
        assert!(
            counter
                .decide(&policy, now, 10, Priority::Normal, true)
                .expect("a cost within the limit")
                .is_granted()
        );
        assert_eq!(counter.debit(&policy, now, 4), 4, "{shape:?}");
        assert_eq!(
            counter.debit(&policy, now, 100),
            6,
            "{shape:?}: one capacity past at most"
        );
        assert_eq!(counter.usage(&policy, now).0, 20, "{shape:?}");
        let denied = counter
            .check(&policy, now, 1, Priority::High)
            .expect("a cost within the limit")
            .expect("a debt is paid before anything is granted");
        assert!(denied.retry_after_us > 0, "{shape:?}");
    }
}

#[test]
fn a_lease_is_never_debited() {
    let policy = Policy::concurrency(2, 1_000_000, Reserve::default()).expect("a valid policy");
    let mut counter = Counter::new(1);
    assert_eq!(counter.debit(&policy, 1, 5), 0);
}
