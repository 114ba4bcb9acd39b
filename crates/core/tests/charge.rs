//! `Counter::charge` against the grants it stands for: a store that records a counter, grants
//! at most a budget of units after each record, and after a crash puts the record back and
//! charges the whole budget at the restart's time, never lets through more than the limit over
//! the crashed runs and the run after them together.
//!
//! Each case drives one counter through random grants, records and crashes (any number of
//! each, the budget counted from the last record, as the memory store's write-ahead counts it)
//! and keeps its own list of every grant, with its time. The check reads that list alone:
//! sliding, at most the limit in any interval of one window; fixed, at most the limit in each
//! aligned window; GCRA, the list replayed through the virtual scheduling algorithm, written
//! here again. The counter's own numbers are never consulted.

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
struct Spec {
    shape: Shape,
    limit: u64,
    period_us: u64,
    margin_us: u64,
    reserve_high: u64,
    /// Units the store may grant after a record before the next one.
    budget: u64,
}

impl Spec {
    fn policy(&self) -> Policy {
        let algorithm = match self.shape {
            Shape::Sliding => Algorithm::Sliding,
            Shape::Fixed => Algorithm::Fixed,
            Shape::Gcra { burst } => Algorithm::Gcra { burst },
        };
        let reserve = Reserve {
            high: self.reserve_high,
            normal: 0,
        };
        Policy::rate(
            self.limit,
            self.period_us,
            self.margin_us,
            algorithm,
            reserve,
        )
        .expect("the strategy builds valid policies")
    }

    fn capacity(&self) -> u64 {
        match self.shape {
            Shape::Sliding | Shape::Fixed => self.limit,
            Shape::Gcra { burst } => burst,
        }
    }

    fn window_us(&self) -> u64 {
        self.period_us + self.margin_us
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Acquire {
        cost: u64,
        priority: Priority,
        refundable: bool,
    },
    Advance(u64),
    /// The state database takes the counter as it stands: the budget starts again.
    Record,
    /// The process dies; the next one starts `gap` later from the last record.
    Crash {
        gap: u64,
    },
}

/// One grant as the test saw it.
#[derive(Clone, Copy, Debug)]
struct Granted {
    at: u64,
    cost: u64,
}

fn fail(message: String) -> TestCaseError {
    TestCaseError::fail(message)
}

/// Drive the steps; returns every grant, and how many were made after a crash.
fn run(spec: &Spec, start: u64, steps: &[Step]) -> Result<(Vec<Granted>, usize), TestCaseError> {
    let policy = spec.policy();
    let mut now = start;
    let mut counter = Counter::new(now);
    let mut record = counter.to_words();
    let mut spent = 0;
    let mut grants = Vec::new();
    let mut after_crash = 0;
    let mut crashed = false;
    for step in steps {
        match *step {
            Step::Acquire {
                cost,
                priority,
                refundable,
            } => {
                let cost = 1 + cost % spec.capacity();
                // The store asks for a record before it spends past the budget.
                if spent + cost > spec.budget {
                    continue;
                }
                if let Ok(Verdict::Granted(_)) =
                    counter.decide(&policy, now, cost, priority, refundable)
                {
                    spent += cost;
                    grants.push(Granted { at: now, cost });
                    if crashed {
                        after_crash += 1;
                    }
                }
            }
            Step::Advance(by) => now += by % (2 * spec.window_us() + 1),
            Step::Record => {
                record = counter.to_words();
                spent = 0;
            }
            Step::Crash { gap } => {
                now += gap % (2 * spec.window_us() + 1);
                counter = Counter::from_words(&record)
                    .map_err(|error| fail(format!("record unreadable: {error}")))?;
                spent = counter.charge(&policy, now, spec.budget);
                if spent > spec.budget {
                    return Err(fail(format!(
                        "charged {spent}, above the budget {}",
                        spec.budget
                    )));
                }
                crashed = true;
            }
        }
    }
    Ok((grants, after_crash))
}

/// The guarantee, read from the grants alone.
fn check(spec: &Spec, grants: &[Granted]) -> Result<(), TestCaseError> {
    let capacity = spec.capacity();
    let window = spec.window_us();
    match spec.shape {
        Shape::Sliding => {
            for (index, first) in grants.iter().enumerate() {
                let within: u64 = grants[index..]
                    .iter()
                    .filter(|grant| grant.at < first.at + window)
                    .map(|grant| grant.cost)
                    .sum();
                if within > capacity {
                    return Err(fail(format!(
                        "{within} units in [{}, {}): over {capacity}",
                        first.at,
                        first.at + window
                    )));
                }
            }
        }
        Shape::Fixed => {
            let mut windows = std::collections::BTreeMap::<u64, u64>::new();
            for grant in grants {
                *windows.entry(grant.at / window).or_default() += grant.cost;
            }
            if let Some((index, units)) = windows.iter().find(|(_, units)| **units > capacity) {
                return Err(fail(format!(
                    "{units} units in fixed window {index}: over {capacity}"
                )));
            }
        }
        Shape::Gcra { burst } => {
            // Virtual scheduling: a grant of `cost` at `t` conforms when the backlog left by
            // the grants before it, `tat - t`, leaves room for `cost` within `burst` intervals.
            let emission = window.div_ceil(spec.limit);
            let mut tat = 0u64;
            for grant in grants {
                let backlog = tat.saturating_sub(grant.at);
                if backlog + grant.cost * emission > burst * emission {
                    return Err(fail(format!(
                        "{} units at {} on a backlog of {backlog} us: over a burst of {burst} \
                         at {emission} us each",
                        grant.cost, grant.at
                    )));
                }
                tat = tat.max(grant.at) + grant.cost * emission;
            }
        }
    }
    Ok(())
}

fn spec() -> impl Strategy<Value = Spec> {
    let shape = prop_oneof![
        Just(Shape::Sliding),
        Just(Shape::Fixed),
        prop_oneof![1..=10u64, 20..=50u64].prop_map(|burst| Shape::Gcra { burst }),
    ];
    // Up to 64 units the sliding log is exact; above, buckets merge.
    let limit = prop_oneof![3 => 1..=10u64, 1 => 60..=70u64, 1 => 100..=300u64];
    (
        shape,
        limit,
        1_000..=50_000u64,
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(shape, limit, period_us, margin, high, budget)| {
            let mut spec = Spec {
                shape,
                limit,
                period_us,
                margin_us: if margin % 3 == 0 {
                    0
                } else {
                    margin % (period_us + 1)
                },
                reserve_high: 0,
                budget: 0,
            };
            let capacity = spec.capacity();
            spec.reserve_high = high % capacity;
            spec.budget = 1 + budget % capacity;
            spec
        })
}

fn step() -> impl Strategy<Value = Step> {
    let cost = prop_oneof![4 => 0..=2u64, 1 => any::<u64>()];
    let priority = prop::sample::select(Priority::ALL.to_vec());
    prop_oneof![
        10 => (cost, priority, any::<bool>()).prop_map(|(cost, priority, refundable)| {
            Step::Acquire { cost, priority, refundable }
        }),
        4 => prop_oneof![Just(0u64), 0..=2_000u64, any::<u64>()].prop_map(Step::Advance),
        2 => Just(Step::Record),
        1 => prop_oneof![Just(0u64), any::<u64>()].prop_map(|gap| Step::Crash { gap }),
    ]
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 4096,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/charge.txt",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_record_and_a_charged_budget_never_let_through_more_than_the_limit(
        spec in spec(),
        start in prop_oneof![Just(0u64), 0..=10_000_000u64],
        steps in prop::collection::vec(step(), 1..120),
    ) {
        let (grants, _) = run(&spec, start, &steps)?;
        check(&spec, &grants)?;
    }
}

/// The check above can fail: restored from the record without the charge, a counter grants
/// again what the crashed run granted after its record.
#[test]
fn without_the_charge_the_check_finds_the_overdraft() {
    for shape in [Shape::Sliding, Shape::Fixed, Shape::Gcra { burst: 8 }] {
        let spec = Spec {
            shape,
            limit: 8,
            period_us: 1_000_000,
            margin_us: 0,
            reserve_high: 0,
            budget: 1,
        };
        let policy = spec.policy();
        let mut counter = Counter::new(10);
        let record = counter.to_words();
        let mut grants = vec![];
        // The crashed run's one unit after the record.
        assert!(
            counter
                .decide(&policy, 10, 1, Priority::Normal, false)
                .expect("cost fits")
                .is_granted()
        );
        grants.push(Granted { at: 10, cost: 1 });
        let mut restored = Counter::from_words(&record).expect("record");
        for at in 11..19 {
            if restored
                .decide(&policy, at, 1, Priority::Normal, false)
                .expect("cost fits")
                .is_granted()
            {
                grants.push(Granted { at, cost: 1 });
            }
        }
        assert!(check(&spec, &grants).is_err(), "{shape:?}: {grants:?}");
        // With the charge, the same requests stay within the limit, and no fewer than the
        // limit less the budget go through.
        let mut restored = Counter::from_words(&record).expect("record");
        assert_eq!(restored.charge(&policy, 11, spec.budget), 1);
        let mut grants = vec![Granted { at: 10, cost: 1 }];
        for at in 11..19 {
            if restored
                .decide(&policy, at, 1, Priority::Normal, false)
                .expect("cost fits")
                .is_granted()
            {
                grants.push(Granted { at, cost: 1 });
            }
        }
        check(&spec, &grants).expect("within the limit");
        assert_eq!(grants.len(), 8, "{shape:?}");
    }
}

/// The server's target: a limit of 100 per hour that granted 10, the last 3 after its latest
/// record, grants 77 more after the crash, with a budget of 13 (an eighth of the limit).
#[test]
fn a_crash_after_ten_of_a_hundred_leaves_seventy_seven() {
    const HOUR_US: u64 = 3_600_000_000;
    for algorithm in [
        Algorithm::Sliding,
        Algorithm::Fixed,
        Algorithm::Gcra { burst: 100 },
    ] {
        let policy = Policy::rate(100, HOUR_US, 0, algorithm, Reserve::default()).expect("policy");
        let start = 5 * HOUR_US;
        let mut counter = Counter::new(start);
        let mut record = Vec::new();
        for unit in 0..10 {
            if unit == 7 {
                record = counter.to_words();
            }
            let granted = counter.decide(&policy, start + unit, 1, Priority::Normal, false);
            assert!(granted.expect("cost fits").is_granted());
        }
        let mut restored = Counter::from_words(&record).expect("record");
        assert_eq!(restored.charge(&policy, start + 1_000, 13), 13);
        let mut more = 0;
        while restored
            .decide(&policy, start + 2_000, 1, Priority::Normal, false)
            .expect("cost fits")
            .is_granted()
        {
            more += 1;
        }
        assert_eq!(more, 80, "{algorithm:?}: 100 - 7 recorded - 13 charged");
        assert!(more >= 77);
    }
}
