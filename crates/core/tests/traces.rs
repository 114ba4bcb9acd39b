//! Data-driven traces: hand-worked sequences of `(t, cost, priority) -> verdict`, commits,
//! renewals and pauses for each algorithm, every expected number worked out in the comments,
//! and a few focused checks of what a policy or a permit refuses.

use tollgate_core::{
    Algorithm, Committed, CostError, Counter, DenyReason, PermitError, Policy, Priority, Reserve,
    SPAN_US_MAX, UNITS_MAX, Verdict,
};

use Priority::{High, Low, Normal};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Granted {
        remaining: u64,
        reset_after_us: u64,
    },
    Denied {
        retry_after_us: u64,
        remaining: u64,
    },
    Paused {
        retry_after_us: u64,
        remaining: u64,
    },
    /// More than the priority could ever be granted.
    TooCostly {
        capacity: u64,
    },
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Acquire {
        t: u64,
        cost: u64,
        priority: Priority,
        expect: Expect,
    },
    /// Commit (or release) the `nth` permit granted in this trace.
    Commit {
        t: u64,
        nth: usize,
        used: u64,
        expect: Result<Committed, PermitError>,
    },
    /// Commit a number given outright.
    CommitSeq {
        t: u64,
        seq: u64,
        expect: Result<Committed, PermitError>,
    },
    Renew {
        t: u64,
        nth: usize,
        expect: Result<u64, PermitError>,
    },
    Pause {
        until: u64,
    },
}

fn acquire(t: u64, cost: u64, priority: Priority, expect: Expect) -> Step {
    Step::Acquire {
        t,
        cost,
        priority,
        expect,
    }
}

fn granted(remaining: u64, reset_after_us: u64) -> Expect {
    Expect::Granted {
        remaining,
        reset_after_us,
    }
}

fn denied(retry_after_us: u64, remaining: u64) -> Expect {
    Expect::Denied {
        retry_after_us,
        remaining,
    }
}

fn paused(retry_after_us: u64, remaining: u64) -> Expect {
    Expect::Paused {
        retry_after_us,
        remaining,
    }
}

fn commit(t: u64, nth: usize, used: u64, expect: Result<Committed, PermitError>) -> Step {
    Step::Commit {
        t,
        nth,
        used,
        expect,
    }
}

fn refunded(units: u64) -> Result<Committed, PermitError> {
    Ok(Committed {
        refunded: units,
        released: 0,
    })
}

fn released(slots: u64) -> Result<Committed, PermitError> {
    Ok(Committed {
        refunded: 0,
        released: slots,
    })
}

fn run(policy: Policy, mut counter: Counter, steps: &[Step]) {
    let mut seqs = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        match *step {
            Step::Acquire {
                t,
                cost,
                priority,
                expect,
            } => {
                let seen = match counter.decide(&policy, t, cost, priority, true) {
                    Ok(Verdict::Granted(grant)) => {
                        seqs.push(grant.seq);
                        granted(grant.remaining, grant.reset_after_us)
                    }
                    Ok(Verdict::Denied(denial)) => match denial.reason {
                        // The core never queues: that is the engine's answer.
                        DenyReason::Capacity | DenyReason::Queued => {
                            denied(denial.retry_after_us, denial.remaining)
                        }
                        DenyReason::Paused | DenyReason::Recovering => {
                            paused(denial.retry_after_us, denial.remaining)
                        }
                    },
                    Err(CostError { capacity, .. }) => Expect::TooCostly { capacity },
                };
                assert_eq!(seen, expect, "step {index}: {step:?}");
            }
            Step::Commit {
                t,
                nth,
                used,
                expect,
            } => {
                let seen = counter.commit(&policy, t, seqs[nth], used);
                assert_eq!(seen, expect, "step {index}: {step:?}");
            }
            Step::CommitSeq { t, seq, expect } => {
                let seen = counter.commit(&policy, t, seq, 0);
                assert_eq!(seen, expect, "step {index}: {step:?}");
            }
            Step::Renew { t, nth, expect } => {
                let seen = counter.renew(&policy, t, seqs[nth]);
                assert_eq!(seen, expect, "step {index}: {step:?}");
            }
            Step::Pause { until } => counter.pause(until),
        }
    }
}

fn rate(limit: u64, period_us: u64, margin_us: u64, algorithm: Algorithm) -> Policy {
    Policy::rate(limit, period_us, margin_us, algorithm, Reserve::default())
        .expect("the traces use valid policies")
}

#[test]
fn sliding_counts_any_window() {
    // 3 units per 1000 us.
    run(
        rate(3, 1_000, 0, Algorithm::Sliding),
        Counter::new(0),
        &[
            acquire(0, 1, Normal, granted(2, 1_000)),
            acquire(10, 2, Normal, granted(0, 1_000)),
            // The unit granted at 0 counts until 1000.
            acquire(20, 1, Normal, denied(980, 0)),
            acquire(999, 1, Normal, denied(1, 0)),
            acquire(1_000, 1, Normal, granted(0, 1_000)),
            // Two units must go: the two granted at 10, which count until 1010.
            acquire(1_000, 2, Normal, denied(10, 0)),
            acquire(1_010, 2, Normal, granted(0, 1_000)),
            acquire(1_010, 4, High, Expect::TooCostly { capacity: 3 }),
            acquire(1_010, 0, High, Expect::TooCostly { capacity: 3 }),
        ],
    );
}

#[test]
fn sliding_keeps_reserves_for_higher_priorities() {
    // 4 units; low leaves 3 (high 2 + normal 1), normal leaves 2, high may take all 4.
    let reserve = Reserve { high: 2, normal: 1 };
    let policy = Policy::rate(4, 1_000, 0, Algorithm::Sliding, reserve).expect("valid");
    run(
        policy,
        Counter::new(0),
        &[
            acquire(0, 1, Low, granted(0, 1_000)),
            acquire(0, 1, Low, denied(1_000, 0)),
            acquire(0, 2, Low, Expect::TooCostly { capacity: 1 }),
            acquire(1, 1, Normal, granted(0, 1_000)),
            // Normal needs one of the two counted units gone: the one from 0, at 1000.
            acquire(2, 1, Normal, denied(998, 0)),
            acquire(3, 2, High, granted(0, 1_000)),
            acquire(4, 1, High, denied(996, 0)),
            // At 1000 the units from 1 (one) and 3 (two) still count: low waits for both.
            acquire(1_000, 1, Low, denied(3, 0)),
            acquire(1_003, 1, Low, granted(0, 1_000)),
            acquire(1_003, 3, High, granted(0, 1_000)),
        ],
    );
}

#[test]
fn sliding_margin_lengthens_the_window() {
    run(
        rate(1, 1_000, 500, Algorithm::Sliding),
        Counter::new(0),
        &[
            acquire(0, 1, Normal, granted(0, 1_500)),
            acquire(1_000, 1, Normal, denied(500, 0)),
            acquire(1_499, 1, Normal, denied(1, 0)),
            acquire(1_500, 1, Normal, granted(0, 1_500)),
        ],
    );
}

#[test]
fn sliding_refunds_what_was_not_used() {
    run(
        rate(3, 1_000, 0, Algorithm::Sliding),
        Counter::new(0),
        &[
            acquire(0, 3, Normal, granted(0, 1_000)),
            commit(
                5,
                0,
                4,
                Err(PermitError::UsedAboveCost { used: 4, cost: 3 }),
            ),
            commit(5, 0, 1, refunded(2)),
            commit(6, 0, 1, Err(PermitError::Gone)),
            acquire(7, 2, Normal, granted(0, 1_000)),
            acquire(8, 1, Normal, denied(992, 0)),
            // The permit from 7 stops counting at 1007: too late to commit.
            commit(1_007, 1, 0, Err(PermitError::Gone)),
            Step::CommitSeq {
                t: 1_007,
                seq: 8,
                expect: Err(PermitError::Unknown),
            },
        ],
    );
}

#[test]
fn fixed_counts_aligned_windows() {
    run(
        rate(2, 1_000, 0, Algorithm::Fixed),
        Counter::new(0),
        &[
            // The window [0, 1000) resets 10 us after a grant at 990.
            acquire(990, 2, Normal, granted(0, 10)),
            acquire(999, 1, Normal, denied(1, 0)),
            acquire(1_000, 2, Normal, granted(0, 1_000)),
            // Units of the previous window no longer count: nothing to give back.
            commit(1_001, 0, 0, refunded(0)),
            commit(
                1_001,
                1,
                3,
                Err(PermitError::UsedAboveCost { used: 3, cost: 2 }),
            ),
            commit(1_001, 1, 1, refunded(1)),
            commit(1_001, 1, 1, Err(PermitError::Gone)),
            acquire(1_002, 1, Normal, granted(0, 998)),
            acquire(1_002, 1, Normal, denied(998, 0)),
            // Committable while its units could count: until 1002 + 1000.
            commit(2_002, 2, 0, Err(PermitError::Gone)),
        ],
    );
}

#[test]
fn gcra_spreads_a_burst() {
    // 2 units per 1000 us: one every T = 500 us, bursts of 3.
    run(
        rate(2, 1_000, 0, Algorithm::Gcra { burst: 3 }),
        Counter::new(0),
        &[
            // TAT 0 + 3 * 500 = 1500.
            acquire(0, 3, Normal, granted(0, 1_500)),
            // One more fits once TAT - t <= (3 - 1) * 500, at 500.
            acquire(0, 1, Normal, denied(500, 0)),
            acquire(499, 1, Normal, denied(1, 0)),
            acquire(500, 1, Normal, granted(0, 1_500)),
            // Only the newest grant can be given back.
            commit(999, 0, 0, refunded(0)),
            // TAT 2000; two fit once TAT - t <= 500, at 1500. One unit is open now.
            acquire(1_000, 2, Normal, denied(500, 1)),
            commit(1_000, 1, 0, refunded(1)),
            // TAT back to 1500: two fit at 1000.
            acquire(1_000, 2, Normal, granted(0, 1_500)),
        ],
    );
}

#[test]
fn gcra_rounds_the_emission_interval_up() {
    // 3 per 1000 us: T = ceil(1000 / 3) = 334, so at most 3 units in any 1000 us.
    // With T = 333 a fourth unit would fit at 999.
    run(
        rate(3, 1_000, 0, Algorithm::Gcra { burst: 1 }),
        Counter::new(0),
        &[
            acquire(0, 1, Normal, granted(0, 334)),
            acquire(333, 1, Normal, denied(1, 0)),
            acquire(334, 1, Normal, granted(0, 334)),
            acquire(667, 1, Normal, denied(1, 0)),
            acquire(668, 1, Normal, granted(0, 334)),
            acquire(999, 1, Normal, denied(3, 0)),
            acquire(1_002, 1, Normal, granted(0, 334)),
        ],
    );
}

#[test]
fn leases_expire_renew_and_release_once() {
    let policy = Policy::concurrency(2, 1_000, Reserve::default()).expect("valid");
    run(
        policy,
        Counter::new(0),
        &[
            acquire(0, 1, Normal, granted(1, 1_000)),
            acquire(10, 1, Normal, granted(0, 1_000)),
            // The first lease expires at 1000.
            acquire(20, 1, Normal, denied(980, 0)),
            Step::Renew {
                t: 500,
                nth: 0,
                expect: Ok(1_500),
            },
            // Now the second one, at 1010, is the first to go.
            acquire(600, 1, Normal, denied(410, 0)),
            commit(700, 1, 0, released(1)),
            commit(700, 1, 0, released(0)),
            Step::Renew {
                t: 700,
                nth: 1,
                expect: Err(PermitError::LeaseExpired),
            },
            acquire(700, 1, Normal, granted(0, 1_000)),
            // The first lease ends at 1500 exactly.
            Step::Renew {
                t: 1_500,
                nth: 0,
                expect: Err(PermitError::LeaseExpired),
            },
            commit(1_500, 0, 0, released(0)),
            acquire(1_500, 1, Normal, granted(0, 1_000)),
            Step::CommitSeq {
                t: 1_500,
                seq: 1_501,
                expect: Err(PermitError::Unknown),
            },
        ],
    );
}

#[test]
fn pauses_only_extend() {
    run(
        rate(5, 1_000, 0, Algorithm::Sliding),
        Counter::new(0),
        &[
            Step::Pause { until: 1_000 },
            acquire(0, 1, High, paused(1_000, 5)),
            Step::Pause { until: 500 },
            acquire(999, 1, High, paused(1, 5)),
            acquire(1_000, 1, Normal, granted(4, 1_000)),
            // Paused until 1500, and no room for 5 before 2000: the later of the two.
            Step::Pause { until: 1_500 },
            acquire(1_000, 5, Normal, paused(1_000, 4)),
            acquire(1_500, 5, Normal, denied(500, 4)),
            acquire(2_000, 5, Normal, granted(0, 1_000)),
        ],
    );
}

#[test]
fn recovering_counter_waits_for_what_was_lost() {
    run(
        rate(3, 1_000, 0, Algorithm::Fixed),
        Counter::recovering(100, 5_000),
        &[
            acquire(100, 1, Normal, paused(4_900, 3)),
            acquire(4_999, 3, Normal, paused(1, 3)),
            acquire(5_000, 3, Normal, granted(0, 1_000)),
            // Numbers start at the end of the recovery.
            Step::CommitSeq {
                t: 5_000,
                seq: 4_999,
                expect: Err(PermitError::Gone),
            },
            commit(5_000, 0, 0, refunded(3)),
        ],
    );
}

#[test]
fn renew_on_a_rate_limit_is_the_wrong_kind() {
    let policy = rate(3, 1_000, 0, Algorithm::Sliding);
    let mut counter = Counter::new(0);
    let Ok(Verdict::Granted(grant)) = counter.decide(&policy, 0, 1, Normal, true) else {
        panic!("an empty counter grants one unit");
    };
    assert_eq!(
        counter.renew(&policy, 1, grant.seq),
        Err(PermitError::WrongKind)
    );
}

#[test]
fn gcra_refuses_a_rate_finer_than_a_microsecond() {
    // A million a second is one unit per microsecond: fine. More would round the emission
    // interval up to a microsecond and silently run at a million a second.
    let gcra = |limit| {
        Policy::rate(
            limit,
            1_000_000,
            0,
            Algorithm::Gcra { burst: 10 },
            Reserve::default(),
        )
    };
    assert!(gcra(1_000_000).is_ok());
    assert_eq!(gcra(1_000_001).map_err(|error| error.field), Err("limit"));
    // The margin widens the window the limit counts in.
    let with_margin = Policy::rate(
        2_000_000,
        1_000_000,
        1_000_000,
        Algorithm::Gcra { burst: 10 },
        Reserve::default(),
    );
    assert!(with_margin.is_ok());
    // Sliding and fixed windows count units, not intervals: no such bound.
    let sliding = Policy::rate(
        UNITS_MAX,
        1_000_000,
        0,
        Algorithm::Sliding,
        Reserve::default(),
    );
    assert!(sliding.is_ok());
}

#[test]
fn gcra_burst_must_drain_within_two_spans() {
    // 1 unit per 366 days: a burst of 2 drains in 732 days, the longest window a rate limit
    // can have (period plus margin); 3 would take longer, and 10^9 would overflow the clock.
    let gcra = |burst| {
        Policy::rate(
            1,
            SPAN_US_MAX,
            0,
            Algorithm::Gcra { burst },
            Reserve::default(),
        )
    };
    assert!(gcra(2).is_ok());
    assert_eq!(gcra(3).map_err(|error| error.field), Err("burst"));
    assert_eq!(gcra(UNITS_MAX).map_err(|error| error.field), Err("burst"));
    // The same burst at a sustainable rate is fine.
    let policy = Policy::rate(
        UNITS_MAX,
        UNITS_MAX,
        0,
        Algorithm::Gcra { burst: UNITS_MAX },
        Reserve::default(),
    );
    assert!(policy.is_ok());
}
