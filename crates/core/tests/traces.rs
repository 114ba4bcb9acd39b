//! Data-driven traces: hand-worked sequences of `(t, cost, priority) -> verdict`, commits,
//! renewals and pauses for each algorithm, every expected number worked out in the comments;
//! what a policy change, a resume and a refund do to a counter; and focused checks of what a
//! policy or a permit refuses and how each names itself.

use tollgate_core::{
    Algorithm, Committed, CostError, Counter, DenyReason, Kind, PermitError, Policy, Priority,
    Reserve, SPAN_US_MAX, UNITS_MAX, Verdict,
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

#[test]
fn sliding_above_64_units_merges_close_grants_and_counts_them_until_the_latest() {
    // 128 units per 128000 us: a bucket spans 128000 / 64 = 2000 us. The grant at 1000 joins
    // the bucket opened at 0, which then counts all 128 units until 1000 + 128000.
    run(
        rate(128, 128_000, 0, Algorithm::Sliding),
        Counter::new(0),
        &[
            acquire(0, 127, Normal, granted(1, 128_000)),
            acquire(1_000, 1, Normal, granted(0, 128_000)),
            // Exact counting would free the 127 units at 128000; the merged bucket holds them
            // (never shorter than needed) until 129000.
            acquire(128_500, 1, Normal, denied(500, 0)),
            acquire(129_000, 1, Normal, granted(127, 128_000)),
        ],
    );
}

#[test]
fn a_sliding_log_stays_within_its_bucket_cap_however_many_grants() {
    // 1000 units per 64 s: buckets span a second. A grant every 10 ms for 10 s makes about
    // ten buckets; one bucket per grant would be a thousand, which no counter may hold (its
    // words would not read back).
    let policy = rate(1_000, 64_000_000, 0, Algorithm::Sliding);
    let mut counter = Counter::new(0);
    for step in 0..1_000 {
        let verdict = counter.decide(&policy, step * 10_000, 1, Normal, false);
        assert!(matches!(verdict, Ok(Verdict::Granted(_))), "grant {step}");
    }
    let words = counter.to_words();
    assert_eq!(
        Counter::from_words(&words),
        Ok(counter),
        "{} words",
        words.len()
    );
    assert!(words.len() < 3 + 2 + 3 * 66, "{} words", words.len());
}

#[test]
fn a_full_refund_leaves_nothing_counted() {
    let policy = rate(3, 1_000, 0, Algorithm::Sliding);
    let mut counter = Counter::new(0);
    let Ok(Verdict::Granted(grant)) = counter.decide(&policy, 0, 1, Normal, true) else {
        panic!("an empty counter grants one unit");
    };
    assert_eq!(counter.commit(&policy, 10, grant.seq, 0), refunded(1));
    // Nothing counts, so nothing is left to reset.
    assert_eq!(counter.usage(&policy, 20), (0, 0));
    assert_eq!(counter.status(&policy, 20, Normal), (3, 0));
}

#[test]
fn usage_and_status_count_what_is_used_and_what_is_open() {
    let policy = Policy::rate(
        5,
        1_000,
        0,
        Algorithm::Sliding,
        Reserve { high: 1, normal: 0 },
    )
    .expect("valid");
    let mut counter = Counter::new(0);
    assert!(matches!(
        counter.decide(&policy, 0, 2, High, true),
        Ok(Verdict::Granted(_))
    ));
    // Two units used, counting until 1000; normal may use 5 - 1 - 2, high 5 - 2.
    assert_eq!(counter.usage(&policy, 100), (2, 900));
    assert_eq!(counter.status(&policy, 100, Normal), (2, 900));
    assert_eq!(counter.status(&policy, 100, High), (3, 900));
}

#[test]
fn resume_lifts_a_pause_but_never_a_hold() {
    let policy = rate(1, 1_000, 0, Algorithm::Sliding);
    let check = |counter: &mut Counter, now| {
        counter
            .check(&policy, now, 1, Normal)
            .expect("one unit fits the limit")
            .map(|denial| (denial.reason, denial.retry_after_us))
    };
    // A pause past now is lifted: the counter grants at once.
    let mut counter = Counter::new(0);
    counter.pause(1_000);
    assert!(counter.resume(500, 0));
    assert_eq!(check(&mut counter, 500), None);
    // Nothing paused, or a pause that ended at now: nothing lifted.
    assert!(!Counter::new(0).resume(500, 0));
    let mut counter = Counter::new(0);
    counter.pause(1_000);
    assert!(!counter.resume(1_000, 0));
    // A pause beyond the store's hold is cut to the hold, which stays.
    let mut counter = Counter::new(0);
    counter.pause(3_000);
    assert!(counter.resume(500, 2_000));
    assert_eq!(check(&mut counter, 500), Some((DenyReason::Paused, 1_500)));
    // A pause within the hold lifts nothing the hold does not keep anyway.
    let mut counter = Counter::new(0);
    counter.pause(1_500);
    assert!(!counter.resume(500, 2_000));
    assert_eq!(check(&mut counter, 500), Some((DenyReason::Paused, 1_000)));
}

#[test]
fn a_fixed_window_that_changes_length_keeps_its_units_until_the_new_window_ends() {
    let shorter = rate(3, 1_000, 0, Algorithm::Fixed);
    let longer = rate(3, 2_000, 0, Algorithm::Fixed);
    let mut counter = Counter::new(0);
    assert!(matches!(
        counter.decide(&shorter, 500, 3, Normal, false),
        Ok(Verdict::Granted(_))
    ));
    // Under the longer window [0, 2000) the three units still count, until 2000: the counter
    // may not be forgotten before then.
    assert_eq!(counter.usage(&longer, 1_500), (3, 500));
    assert!(
        counter.idle_at(&longer) >= 2_000,
        "{}",
        counter.idle_at(&longer)
    );
    let denial = counter
        .check(&longer, 1_500, 1, Normal)
        .expect("fits the limit");
    assert_eq!(denial.map(|denial| denial.retry_after_us), Some(500));
}

#[test]
fn a_gcra_rate_change_carries_the_backlog_in_units() {
    // 10 a second (T = 100 ms), then 100 a second (T = 10 ms), bursts of 10 both.
    let slow = rate(10, 1_000_000, 0, Algorithm::Gcra { burst: 10 });
    let fast = rate(100, 1_000_000, 0, Algorithm::Gcra { burst: 10 });
    let mut counter = Counter::new(0);
    assert!(matches!(
        counter.decide(&slow, 0, 10, Normal, false),
        Ok(Verdict::Granted(_))
    ));
    // Decided on its backlog alone under its own policy; not under another interval, whose
    // units the backlog does not count.
    assert_eq!(counter.gcra_alone(&slow, 0), Some(1_000_000));
    assert_eq!(counter.gcra_alone(&fast, 0), None);
    // The 10 units carry over as 10 units of the new interval: the next fits after one T.
    let denial = counter.check(&fast, 0, 1, Normal).expect("fits the limit");
    assert_eq!(denial.map(|denial| denial.retry_after_us), Some(10_000));
    assert!(matches!(
        counter.decide(&fast, 10_000, 1, Normal, false),
        Ok(Verdict::Granted(_))
    ));
}

#[test]
fn a_fixed_window_turned_sliding_keeps_counting_its_units() {
    let fixed = rate(3, 1_000, 0, Algorithm::Fixed);
    let sliding = rate(3, 1_000, 0, Algorithm::Sliding);
    let mut counter = Counter::new(0);
    assert!(matches!(
        counter.decide(&fixed, 100, 3, Normal, false),
        Ok(Verdict::Granted(_))
    ));
    // The three units count as granted at the change, for a whole window.
    let denial = counter
        .check(&sliding, 200, 1, Normal)
        .expect("fits the limit");
    assert_eq!(
        denial.map(|denial| (denial.retry_after_us, denial.remaining)),
        Some((1_000, 0))
    );
}

#[test]
fn a_refund_never_comes_out_of_a_bucket_that_closed_before_the_reservation() {
    // The clock steps back across two policy changes: the sliding log is rebuilt at 4000 with
    // the unit granted at 5000 in it. No bucket holds the reservation (none was open at 5000),
    // so the refund gives nothing back: refunds are conservative.
    let sliding = rate(3, 1_000, 0, Algorithm::Sliding);
    let fixed = rate(3, 1_000, 0, Algorithm::Fixed);
    let mut counter = Counter::new(0);
    let Ok(Verdict::Granted(grant)) = counter.decide(&sliding, 5_000, 1, Normal, true) else {
        panic!("an empty counter grants one unit");
    };
    assert_eq!(counter.check(&fixed, 5_000, 1, Normal), Ok(None));
    assert_eq!(counter.check(&sliding, 4_000, 1, Normal), Ok(None));
    assert_eq!(counter.commit(&sliding, 4_000, grant.seq, 0), refunded(0));
    assert_eq!(counter.usage(&sliding, 4_000), (1, 1_000));
}

#[test]
fn a_rate_permit_from_before_the_limit_held_leases_is_gone() {
    let sliding = rate(2, 1_000, 0, Algorithm::Sliding);
    let leases = Policy::concurrency(2, 1_000, Reserve::default()).expect("valid");
    let mut counter = Counter::new(0);
    let Ok(Verdict::Granted(grant)) = counter.decide(&sliding, 0, 1, Normal, true) else {
        panic!("an empty counter grants one unit");
    };
    assert_eq!(counter.check(&leases, 10, 1, Normal), Ok(None));
    assert_eq!(counter.check(&sliding, 20, 1, Normal), Ok(None));
    assert_eq!(
        counter.commit(&sliding, 30, grant.seq, 0),
        Err(PermitError::Gone)
    );
}

#[test]
fn policies_are_refused_at_their_bounds_naming_the_field() {
    let field = |policy: Result<Policy, tollgate_core::PolicyError>| policy.map_err(|e| e.field);
    let sliding = |period_us| rate_result(1, period_us, 0, Algorithm::Sliding, Reserve::default());
    // Periods from one millisecond to 366 days (31,622,400 s).
    assert_eq!(SPAN_US_MAX, 31_622_400_000_000);
    assert_eq!(field(sliding(999)), Err("period_us"));
    assert!(sliding(1_000).is_ok());
    assert!(sliding(31_622_400_000_000).is_ok());
    assert_eq!(field(sliding(31_622_400_000_001)), Err("period_us"));
    let lease_ttl = |ttl_us| Policy::concurrency(1, ttl_us, Reserve::default());
    assert_eq!(field(lease_ttl(999)), Err("lease_ttl_us"));
    assert_eq!(field(lease_ttl(31_622_400_000_001)), Err("lease_ttl_us"));
    // Reserves must leave every priority a unit.
    let reserved =
        |high, normal| rate_result(3, 1_000, 0, Algorithm::Sliding, Reserve { high, normal });
    assert!(reserved(2, 0).is_ok());
    assert_eq!(field(reserved(3, 0)), Err("reserve"));
    assert_eq!(field(reserved(2, 1)), Err("reserve"));
    // GCRA: one unit per microsecond of the window at most.
    let gcra = |limit| {
        rate_result(
            limit,
            1_000,
            0,
            Algorithm::Gcra { burst: 1 },
            Reserve::default(),
        )
    };
    assert!(gcra(1_000).is_ok());
    assert_eq!(field(gcra(1_001)), Err("limit"));
    // Leases: at most LEASES_MAX.
    assert!(Policy::concurrency(100_000, 1_000, Reserve::default()).is_ok());
    assert_eq!(
        field(Policy::concurrency(100_001, 1_000, Reserve::default())),
        Err("limit")
    );
}

fn rate_result(
    limit: u64,
    period_us: u64,
    margin_us: u64,
    algorithm: Algorithm,
    reserve: Reserve,
) -> Result<Policy, tollgate_core::PolicyError> {
    Policy::rate(limit, period_us, margin_us, algorithm, reserve)
}

#[test]
fn a_policy_reads_back_what_it_was_made_of() {
    let reserve = Reserve { high: 2, normal: 1 };
    let policy = Policy::rate(7, 2_000, 500, Algorithm::Gcra { burst: 4 }, reserve).expect("valid");
    let Kind::Rate(rate) = policy.kind() else {
        panic!("a rate policy");
    };
    assert_eq!(
        (rate.limit(), rate.period_us(), rate.margin_us()),
        (7, 2_000, 500)
    );
    assert_eq!(policy.reserve(), reserve);
    assert!(policy.is_gcra() && !policy.is_concurrency());
    assert!(!rate_result(7, 2_000, 0, Algorithm::Fixed, reserve).is_ok_and(|p| p.is_gcra()));
    let leases = Policy::concurrency(9, 1_000, Reserve::default()).expect("valid");
    let Kind::Concurrency(concurrency) = leases.kind() else {
        panic!("a concurrency policy");
    };
    assert_eq!(
        (concurrency.limit(), concurrency.lease_ttl_us()),
        (9, 1_000)
    );
    assert!(leases.is_concurrency() && !leases.is_gcra());
}

#[test]
fn names_read_back_and_errors_say_what_is_wrong() {
    for priority in Priority::ALL {
        assert_eq!(Priority::parse(priority.as_str()), Some(priority));
        assert_eq!(priority.to_string(), priority.as_str());
    }
    assert_eq!(
        Priority::ALL.map(Priority::as_str),
        ["low", "normal", "high"]
    );
    assert_eq!(Priority::parse("urgent"), None);
    assert_eq!(
        [
            Algorithm::Sliding,
            Algorithm::Fixed,
            Algorithm::Gcra { burst: 1 }
        ]
        .map(Algorithm::name),
        ["sliding", "fixed", "gcra"]
    );
    let refusal =
        rate_result(0, 1_000, 0, Algorithm::Sliding, Reserve::default()).expect_err("a zero limit");
    assert_eq!(refusal.to_string(), "limit: must be at least 1");
    assert_eq!(
        CostError {
            cost: 0,
            capacity: 3
        }
        .to_string(),
        "cost must be at least 1"
    );
    assert_eq!(
        CostError {
            cost: 4,
            capacity: 3
        }
        .to_string(),
        "cost 4 exceeds the 3 units this limit can ever grant at this priority"
    );
    assert_eq!(
        PermitError::UsedAboveCost { used: 4, cost: 3 }.to_string(),
        "used 4 is above the permit's cost 3"
    );
    for error in [
        PermitError::Unknown,
        PermitError::Gone,
        PermitError::LeaseExpired,
        PermitError::WrongKind,
    ] {
        assert!(!error.to_string().is_empty(), "{error:?}");
    }
    let unreadable = Counter::from_words(&[0]).expect_err("too short");
    assert_eq!(unreadable.to_string(), "counter state: too short");
}
