//! The Redis store's loss check model-checked over `tollgate_redis_protocol::loss` and the real
//! `tollgate_core::Counter`: one slot through asynchronous replication, failovers, restarts
//! and resharding keeps G6; a check that misses a replica promoted without the last writes, one
//! that uses a stale counter as it is, and the store's former rule (a moved slot kept when its
//! old owner is a live master) are caught, the last in each of the four ways the checker found
//! past it.
//! Each test pins its outcome and the number of distinct states, and prints its
//! counterexample (`cargo test -p tollgate-model -- --nocapture`).

use tollgate_model::failover::{
    self, Check, FailoverAction, FailoverModel, FailoverState, Hold, Setup,
};
use tollgate_model::{Bound, Outcome, run, trace};

/// Distinct states at the small bound (docs/lab.md lists them with the large bound and the times).
const FAILOVER_STATES: usize = 51_630;
const MISSING_ONLY_STATES: usize = 712;
const STALE_AS_IS_STATES: usize = 1_641;
const FAILBACK_STATES: usize = 2_883;
const FORCED_STATES: usize = 521;
const RESHARD_STATES: usize = 751;
const RESTART_THEN_RESHARD_STATES: usize = 15_263;
const EVERYTHING_STATES: usize = 11_773;
const MOVED_EXEMPTION_FAILBACK_STATES: usize = 517;
const MOVED_EXEMPTION_FORCED_STATES: usize = 175;
const MOVED_EXEMPTION_RESHARD_STATES: usize = 591;
const MOVED_EXEMPTION_RESTART_THEN_RESHARD_STATES: usize = 1_145;

type FailoverOutcome = Outcome<FailoverState, FailoverAction>;

fn check(setup: Setup, expected_failures: &[&'static str]) -> FailoverOutcome {
    let model = FailoverModel::new(setup).expect("the model's policy is valid");
    run(model, expected_failures)
}

/// The counterexample to G6, which must contain an action `wanted` accepts.
fn caught(outcome: &FailoverOutcome, wanted: impl Fn(&FailoverAction) -> bool) {
    let path = outcome
        .discoveries
        .get(failover::G6_LOSS)
        .expect("G6 must be broken");
    assert!(path.clone().into_actions().iter().any(wanted));
}

/// The real check keeps G6 in `setup`, and a loss is followed by a grant.
fn holds(name: &str, setup: Setup, small_states: usize) {
    let outcome = check(setup, &[]);
    outcome.report(name, &[], small_states);
    if let Some(path) = outcome.discoveries.get(failover::G6_LOSS) {
        panic!("{name}: G6 is broken:\n{}", trace(path));
    }
    assert!(outcome.found(failover::SOMETIMES_LOSS_DETECTED));
    assert!(outcome.found(failover::SOMETIMES_GRANT_AFTER_LOSS));
}

/// The store's former rule, `Check::MovedExemption`, in `setup`: G6 is broken.
fn moved_exemption(name: &str, setup: Setup, small_states: usize) -> FailoverOutcome {
    let setup = Setup {
        check: Check::MovedExemption,
        ..setup
    };
    let outcome = check(setup, &[failover::G6_LOSS]);
    outcome.report(name, &[failover::G6_LOSS], small_states);
    outcome
}

#[test]
fn loss_check_keeps_g6_through_a_failover_and_a_restart() {
    let outcome = check(Setup::failover(Bound::from_env()), &[]);
    outcome.report("failover/failover", &[], FAILOVER_STATES);
    if let Some(path) = outcome.discoveries.get(failover::G6_LOSS) {
        panic!("G6 is broken:\n{}", trace(path));
    }
    // Not vacuous: a loss is detected, and a master grants again once its hold is over.
    assert!(outcome.found(failover::SOMETIMES_LOSS_DETECTED));
    assert!(outcome.found(failover::SOMETIMES_GRANT_AFTER_LOSS));
}

/// A check that only notices a missing generation: the promoted replica keeps the old
/// generation, and its stale counter grants again what the old master granted.
#[test]
fn loss_check_that_misses_a_promoted_replica_is_caught() {
    let setup = Setup {
        check: Check::MissingOnly,
        ..Setup::failover(Bound::from_env())
    };
    let outcome = check(setup, &[failover::G6_LOSS]);
    outcome.report(
        "failover/missing-only",
        &[failover::G6_LOSS],
        MISSING_ONLY_STATES,
    );
    caught(&outcome, |action| {
        matches!(action, FailoverAction::Failover { .. })
    });
}

/// A check that starts a new generation but uses a counter written before it as it is: the
/// promoted replica's copy, which lacks the old master's last grant.
#[test]
fn loss_check_that_uses_a_stale_counter_is_caught() {
    let setup = Setup {
        hold: Hold::StaleAsIs,
        ..Setup::failover(Bound::from_env())
    };
    let outcome = check(setup, &[failover::G6_LOSS]);
    outcome.report(
        "failover/stale-as-is",
        &[failover::G6_LOSS],
        STALE_AS_IS_STATES,
    );
    // The stale counter is a replica's copy or a snapshot.
    caught(&outcome, |action| {
        matches!(
            action,
            FailoverAction::Replicate { .. } | FailoverAction::Snapshot { .. }
        )
    });
}

/// Found by this checker: a failover back to a master that has not caught up with its
/// successor's writes. Under the former rule it finds the generation it owned itself,
/// unchanged, so nothing looks lost; with the term in the owner, it is another owner's.
#[test]
fn failback_to_a_master_that_missed_its_successors_writes() {
    let bound = Bound::from_env();
    holds("failover/failback", Setup::failback(bound), FAILBACK_STATES);
    let outcome = moved_exemption(
        "failover/moved-exemption/failback",
        Setup::failback(bound),
        MOVED_EXEMPTION_FAILBACK_STATES,
    );
    let path = outcome
        .discoveries
        .get(failover::G6_LOSS)
        .expect("the failback is not noticed");
    let failovers = path
        .clone()
        .into_actions()
        .iter()
        .filter(|action| matches!(action, FailoverAction::Failover { .. }))
        .count();
    assert_eq!(failovers, 2);
}

/// Found by this checker: a forced failover promotes the replica while the old master is
/// still listed as a live master, so under the former rule the promoted replica takes its stale
/// copy for a slot moved to it.
#[test]
fn forced_failover_before_the_old_master_is_marked_failing() {
    let bound = Bound::from_env();
    holds(
        "failover/forced",
        Setup::forced_failover(bound),
        FORCED_STATES,
    );
    let outcome = moved_exemption(
        "failover/moved-exemption/forced",
        Setup::forced_failover(bound),
        MOVED_EXEMPTION_FORCED_STATES,
    );
    caught(&outcome, |action| {
        matches!(action, FailoverAction::Failover { forced: true, .. })
    });
}

/// Found by this checker: a replica copies a slot just resharded to its master, before the
/// master's first call takes the generation over; promoted after the master's next grants, it
/// finds the generation of the slot's previous master, still a live master, and under the
/// former rule keeps it.
#[test]
fn failover_after_a_reshard_before_the_first_call() {
    let bound = Bound::from_env();
    holds("failover/reshard", Setup::reshard(bound), RESHARD_STATES);
    let outcome = moved_exemption(
        "failover/moved-exemption/reshard",
        Setup::reshard(bound),
        MOVED_EXEMPTION_RESHARD_STATES,
    );
    caught(&outcome, |action| {
        matches!(action, FailoverAction::Reshard { .. })
    });
}

/// Found by this checker: a master restarts from a snapshot that lacks its last grants, and
/// the slot is resharded before a call on it notices: the new master finds the generation of
/// the restarted node, a live master, and under the former rule keeps it.
#[test]
fn reshard_after_a_restart_from_a_snapshot() {
    let bound = Bound::from_env();
    holds(
        "failover/restart-then-reshard",
        Setup::restart_then_reshard(bound),
        RESTART_THEN_RESHARD_STATES,
    );
    let outcome = moved_exemption(
        "failover/moved-exemption/restart-then-reshard",
        Setup::restart_then_reshard(bound),
        MOVED_EXEMPTION_RESTART_THEN_RESHARD_STATES,
    );
    caught(&outcome, |action| {
        matches!(
            action,
            FailoverAction::Restart {
                from_snapshot: true,
                ..
            }
        )
    });
}

/// Every event at once: a reshard, two failovers of either kind, a restart.
#[test]
fn loss_check_keeps_g6_with_every_event_at_once() {
    holds(
        "failover/everything",
        Setup::everything(Bound::from_env()),
        EVERYTHING_STATES,
    );
}
