//! The designs of the vendor-quota scenario (calls against a central counter) and of the token-pool
//! scenario (docs/guarantees.md), model-checked: every flawed design must be caught with a
//! counterexample, every fixed design must pass. Each test pins its outcome and the number of
//! distinct states explored, and prints its counterexample (`cargo test -p tollgate-model --
//! --nocapture` shows them).

use tollgate_model::calls::{self, CallsAction, CallsModel, Design};
use tollgate_model::tokens::{self, TokensAction, TokensModel};
use tollgate_model::{Bound, run};

/// Distinct states at the small bound (docs/lab.md lists them with the large bound and the times).
const NAIVE_STATES: usize = 432;
const CHECK_THEN_ACT_STATES: usize = 2_112;
const AWAIT_NO_RESET_STATES: usize = 420;
const AWAIT_WITH_RESET_STATES: usize = 816;
const RESERVATION_STATES: usize = 2_998;
const LOCK_WITH_TIMEOUT_STATES: usize = 133;
const LEASE_STATES: usize = 91;

fn tokens_model(design: tokens::Design) -> TokensModel {
    let (instances, max_tokens) = if Bound::from_env().is_large() {
        (3, 3)
    } else {
        (2, 2)
    };
    TokensModel {
        design,
        instances,
        max_tokens,
    }
}

#[test]
fn naive_calls_overshoot_the_limit() {
    let outcome = run(CallsModel::seed(Design::Naive), &[calls::NO_OVERSHOOT]);
    outcome.report("calls/naive", &[calls::NO_OVERSHOOT], NAIVE_STATES);
    let path = outcome
        .discoveries
        .get(calls::NO_OVERSHOOT)
        .expect("calling without looking must overshoot");
    let last = path.last_state();
    assert!(last.made_calls > last.max_calls);
}

#[test]
fn check_then_act_across_workers_races() {
    let outcome = run(
        CallsModel::seed(Design::CheckThenAct),
        &[calls::NO_OVERSHOOT],
    );
    outcome.report(
        "calls/check-then-act",
        &[calls::NO_OVERSHOOT],
        CHECK_THEN_ACT_STATES,
    );
    let path = outcome
        .discoveries
        .get(calls::NO_OVERSHOOT)
        .expect("a check in one step and the call in another must race");
    // The overshooting call was made by a process that had checked there was room: the room
    // was spent by another process between its check and its call.
    let steps = path.clone().into_vec();
    let (before_last, last_action) = steps
        .iter()
        .rev()
        .find_map(|(state, action)| action.map(|action| (state, action)))
        .expect("a counterexample has at least one step");
    let caller_had_checked = match last_action {
        CallsAction::BulkCall { .. } => before_last.bulk == calls::Step::Checked,
        CallsAction::PriorityCall { process, .. } => {
            before_last.priority[process] == calls::Step::Checked
        }
        _ => false,
    };
    assert!(
        caller_had_checked,
        "the last step should be a call after a passed check"
    );
}

#[test]
fn await_without_reset_deadlocks() {
    let outcome = run(
        CallsModel::seed(Design::AwaitNoReset),
        &[calls::NO_DEADLOCK],
    );
    outcome.report(
        "calls/await-no-reset",
        &[calls::NO_DEADLOCK],
        AWAIT_NO_RESET_STATES,
    );
    let path = outcome
        .discoveries
        .get(calls::NO_DEADLOCK)
        .expect("waiting for a reset that never comes must deadlock");
    let last = path.last_state();
    assert!(last.made_calls <= last.max_calls);
    assert!(!outcome.found(calls::NO_OVERSHOOT));
}

#[test]
fn await_with_reset_passes() {
    let outcome = run(CallsModel::seed(Design::AwaitWithReset), &[]);
    outcome.report("calls/await-with-reset", &[], AWAIT_WITH_RESET_STATES);
    assert!(!outcome.found(calls::NO_OVERSHOOT));
    assert!(!outcome.found(calls::NO_DEADLOCK));
    assert!(outcome.found(calls::PRIORITY_ALL_DONE));
}

#[test]
fn reservation_never_overshoots() {
    let outcome = run(CallsModel::seed(Design::Reservation), &[]);
    outcome.report("calls/reservation", &[], RESERVATION_STATES);
    assert!(!outcome.found(calls::NO_OVERSHOOT));
    assert!(!outcome.found(calls::NO_DEADLOCK));
    assert!(outcome.found(calls::PRIORITY_ALL_DONE));
}

#[test]
fn lock_with_timeout_overdraws_the_pool() {
    let outcome = run(
        tokens_model(tokens::Design::LockWithTimeout),
        &[tokens::MAX_TOKENS_NOT_EXCEEDED],
    );
    outcome.report(
        "tokens/lock-with-timeout",
        &[tokens::MAX_TOKENS_NOT_EXCEEDED],
        LOCK_WITH_TIMEOUT_STATES,
    );
    let path = outcome
        .discoveries
        .get(tokens::MAX_TOKENS_NOT_EXCEEDED)
        .expect("a lock that times out between check and fetch must overdraw");
    assert!(
        path.clone()
            .into_actions()
            .contains(&TokensAction::LockExpires),
        "the overdraw needs the lock to time out"
    );
}

#[test]
fn leases_never_overdraw_the_pool() {
    let outcome = run(tokens_model(tokens::Design::Lease), &[]);
    outcome.report("tokens/lease", &[], LEASE_STATES);
    assert!(!outcome.found(tokens::MAX_TOKENS_NOT_EXCEEDED));
    assert!(outcome.found(tokens::POOL_FULLY_USED));
}
