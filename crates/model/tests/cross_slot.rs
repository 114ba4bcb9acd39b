//! The Redis Cluster store's cross-slot protocol model-checked over `tollgate_redis_protocol::plan`
//! and the real `tollgate_core::Counter`: it never overshoots, answers all or nothing, denies only
//! when full and never livelocks, under crashes; a denial that keeps its earlier grants and slots
//! asked out of order are caught. Each test pins its outcome and the number of distinct states, and
//! prints its counterexample (`cargo test -p tollgate-model -- --nocapture`).

use tollgate_model::cross_slot::{
    self, ALL, CrossSlotAction, CrossSlotModel, CrossSlotState, OnDenial, Order, Setup,
};
use tollgate_model::{Bound, Outcome, run, trace};

/// Distinct states at the small bound (docs/lab.md lists them with the large bound and the times).
const CONTENDED_STATES: usize = 61_847;
const LIMIT_TWO_STATES: usize = 4_127;
const KEEP_GRANTS_STATES: usize = 5_552;
const KEEP_GRANTS_PARTIAL_STATES: usize = 270;
const KEEP_GRANTS_STARVES_STATES: usize = 672;
const AS_NAMED_STATES: usize = 198_338;
const AS_NAMED_LIVELOCK_STATES: usize = 799;

type CrossSlotOutcome = Outcome<CrossSlotState, CrossSlotAction>;

fn check(setup: Setup, expected_failures: &[&'static str]) -> CrossSlotOutcome {
    let model = CrossSlotModel::new(setup).expect("the model's policy is valid");
    run(model, expected_failures)
}

fn assert_all_hold(name: &str, outcome: &CrossSlotOutcome) {
    assert_breaks_exactly(name, outcome, &[]);
}

/// Of every `always` property, exactly `broken` have a counterexample.
fn assert_breaks_exactly(name: &str, outcome: &CrossSlotOutcome, broken: &[&str]) {
    for property in ALL {
        match outcome.discoveries.get(property) {
            Some(path) if !broken.contains(&property) => {
                panic!("{name}: {property:?} is broken:\n{}", trace(path))
            }
            None if broken.contains(&property) => panic!("{name}: {property:?} holds"),
            _ => {}
        }
    }
}

#[test]
fn cross_slot_requests_are_all_or_nothing_under_contention_and_crashes() {
    let outcome = check(Setup::contended(Bound::from_env()), &[]);
    outcome.report("cross-slot/contended", &[], CONTENDED_STATES);
    assert_all_hold("cross-slot/contended", &outcome);
    // Not vacuous: a request is granted across slots, a partial grant is rolled back, and a
    // crashed request's grant still counts.
    assert!(outcome.found(cross_slot::SOMETIMES_GRANTED));
    assert!(outcome.found(cross_slot::SOMETIMES_ROLLED_BACK));
    assert!(outcome.found(cross_slot::SOMETIMES_CRASH_HOLDS));
}

#[test]
fn cross_slot_requests_hold_with_a_limit_of_two() {
    let outcome = check(Setup::limit_two(Bound::from_env()), &[]);
    outcome.report("cross-slot/limit-two", &[], LIMIT_TWO_STATES);
    assert_all_hold("cross-slot/limit-two", &outcome);
    assert!(outcome.found(cross_slot::SOMETIMES_GRANTED));
    assert!(outcome.found(cross_slot::SOMETIMES_ROLLED_BACK));
}

/// A denial that leaves the grants made before it in place: the request is answered denied
/// while it still holds units (all or nothing), and those units deny requests that would
/// otherwise fit (denied only when full); it never overshoots. The whole state space tells
/// which properties break; then each is searched for on its own, so each trace is a shortest
/// one.
#[test]
fn denial_without_rollback_is_caught() {
    let setup = Setup {
        on_denial: OnDenial::KeepGrants,
        ..Setup::contended(Bound::from_env())
    };
    let broken = [
        cross_slot::ALL_OR_NOTHING,
        cross_slot::DENIED_ONLY_WHEN_FULL,
    ];
    let whole = check(setup.clone(), &[]);
    whole.report("cross-slot/keep-grants", &[], KEEP_GRANTS_STATES);
    assert_breaks_exactly("cross-slot/keep-grants", &whole, &broken);
    for (property, small_states) in [
        (cross_slot::ALL_OR_NOTHING, KEEP_GRANTS_PARTIAL_STATES),
        (
            cross_slot::DENIED_ONLY_WHEN_FULL,
            KEEP_GRANTS_STARVES_STATES,
        ),
    ] {
        let outcome = check(setup.clone(), &[property]);
        outcome.report("cross-slot/keep-grants", &[property], small_states);
        assert!(outcome.found(property));
    }
}

/// Slots asked in the order each request names them: two requests each hold the slot the
/// other needs next, and both are denied. Nothing else breaks.
#[test]
fn slots_asked_out_of_order_livelock() {
    let setup = Setup {
        order: Order::AsNamed,
        ..Setup::contended(Bound::from_env())
    };
    let whole = check(setup.clone(), &[]);
    whole.report("cross-slot/as-named", &[], AS_NAMED_STATES);
    assert_breaks_exactly("cross-slot/as-named", &whole, &[cross_slot::NO_LIVELOCK]);
    let outcome = check(setup, &[cross_slot::NO_LIVELOCK]);
    outcome.report(
        "cross-slot/as-named",
        &[cross_slot::NO_LIVELOCK],
        AS_NAMED_LIVELOCK_STATES,
    );
    assert!(outcome.found(cross_slot::NO_LIVELOCK));
}
