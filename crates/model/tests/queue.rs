//! One counter's queue across the fleet model-checked over `tollgate_redis_protocol::queue` and
//! the real `tollgate_core::Counter`: requests of several priorities, from processes that ask
//! again, give up, crash and restart, or are slow, are served by priority then arrival, the head
//! is never starved, a dead request's place holds nobody back past its TTL, and the limit
//! holds, and a waiter holds the others back for its hold bound at most; a denied waiter that
//! never stands, places that never expire, a request that counts its own place, a renewal
//! that takes a new arrival and a waiter never let go are caught; and with a reserve, the
//! rule's caution is pinned. Each test pins its outcome and the number of distinct states, and
//! prints its counterexample (`cargo test -p tollgate-model -- --nocapture`).

use tollgate_model::queue::{self, ALL, QueueAction, QueueModel, QueueState, Rule, Setup};
use tollgate_model::{Bound, Outcome, run, trace};

/// Distinct states at the small bound (docs/lab.md lists them with the large bound and the times).
const FLEET_STATES: usize = 126_304;
const FIXED_STATES: usize = 95_289;
const RESERVE_STATES: usize = 60_599;
const RESERVE_SEARCH_STATES: usize = 3_752;
const NO_REGISTRATION_STATES: usize = 56_656;
const NO_REGISTRATION_SEARCH_STATES: usize = 2_238;
const NO_EXPIRY_STATES: usize = 182_556;
const NO_EXPIRY_SEARCH_STATES: usize = 3_801;
const NO_EXPIRY_SLOW_SEARCH_STATES: usize = 3_130;
const OWN_PLACE_STATES: usize = 316_012;
const OWN_PLACE_SEARCH_STATES: usize = 3_034;
const REARRIVES_STATES: usize = 136_014;
const REARRIVES_SEARCH_STATES: usize = 13_427;
const HOLD_STATES: usize = 5_197;
const NEVER_LET_GO_STATES: usize = 6_000;
const NEVER_LET_GO_SEARCH_STATES: usize = 3_985;

type QueueOutcome = Outcome<QueueState, QueueAction>;

fn check(setup: Setup, expected_failures: &[&'static str]) -> QueueOutcome {
    let model = QueueModel::new(setup).expect("the model's policy is valid");
    run(model, expected_failures)
}

/// Of every `always` property, exactly `broken` have a counterexample.
fn assert_breaks_exactly(name: &str, outcome: &QueueOutcome, broken: &[&str]) {
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

/// The whole state space of `setup` breaks exactly `broken`; then a search for `shortest`
/// alone finds it, and its counterexample's actions are returned.
fn caught(
    name: &str,
    setup: Setup,
    broken: &[&str],
    whole_states: usize,
    shortest: &'static str,
    search_states: usize,
) -> Vec<QueueAction> {
    let whole = check(setup.clone(), &[]);
    whole.report(name, &[], whole_states);
    assert_breaks_exactly(name, &whole, broken);
    search(name, setup, shortest, search_states)
}

/// A shortest counterexample to `property` in `setup`: its actions.
fn search(
    name: &str,
    setup: Setup,
    property: &'static str,
    small_states: usize,
) -> Vec<QueueAction> {
    let outcome = check(setup, &[property]);
    outcome.report(name, &[property], small_states);
    outcome
        .discoveries
        .get(property)
        .unwrap_or_else(|| panic!("{name}: {property:?} must be broken"))
        .clone()
        .into_actions()
}

/// Not vacuous: a waiter is held back while the counter has room, a request waits behind a
/// crashed request's place, and a low waiter is granted after waiting.
fn assert_not_vacuous(outcome: &QueueOutcome) {
    assert!(outcome.found(queue::SOMETIMES_HELD_BACK));
    assert!(outcome.found(queue::SOMETIMES_HELD_BY_DEAD));
    assert!(outcome.found(queue::SOMETIMES_GRANTED_AFTER_WAITING));
}

#[test]
fn the_fleet_queue_serves_by_priority_then_arrival_under_crashes() {
    let outcome = check(Setup::fleet(Bound::from_env()), &[]);
    outcome.report("queue/fleet", &[], FLEET_STATES);
    assert_breaks_exactly("queue/fleet", &outcome, &[]);
    assert_not_vacuous(&outcome);
}

#[test]
fn the_fleet_queue_holds_on_a_fixed_window() {
    let outcome = check(Setup::fixed(Bound::from_env()), &[]);
    outcome.report("queue/fixed", &[], FIXED_STATES);
    assert_breaks_exactly("queue/fixed", &outcome, &[]);
    assert_not_vacuous(&outcome);
}

/// Found by this checker: with a reserve, the rule counts the places ahead of a request against
/// the units open to the request's own priority, though a higher place ahead may take its units
/// from the reserve. A low request is denied as queued where granting it would leave the high
/// waiter ahead its unit; once the high one is granted, the low one has no unit left until the
/// period ends. Every other property holds. This test pins that behaviour; if the rule comes to
/// count each place ahead against its own priority's units, it must expect every property to
/// hold.
#[test]
fn with_a_reserve_a_low_request_waits_for_units_the_reserve_would_give() {
    let name = "queue/reserve";
    let actions = caught(
        name,
        Setup::reserve(Bound::from_env()),
        &[queue::QUEUED_ONLY_WHEN_NEEDED],
        RESERVE_STATES,
        queue::QUEUED_ONLY_WHEN_NEEDED,
        RESERVE_SEARCH_STATES,
    );
    assert_eq!(actions.len(), 6);
}

/// A denied waiter that never stands: the store grants whoever asks first when there is room,
/// so a low request takes the units a high waiter in another process is waiting for, and a
/// later low request those of an earlier one.
#[test]
fn without_registration_a_low_grant_takes_a_high_waiters_units() {
    let name = "queue/no-registration";
    let setup = Setup {
        rule: Rule::NoRegistration,
        ..Setup::fleet(Bound::from_env())
    };
    let actions = caught(
        name,
        setup,
        &[queue::NO_LOWER_GRANT, queue::FIRST_COME],
        NO_REGISTRATION_STATES,
        queue::NO_LOWER_GRANT,
        NO_REGISTRATION_SEARCH_STATES,
    );
    assert_eq!(actions.len(), 5);
}

/// Places that never expire: with waiters that always ask again in time, only a crash leaves a
/// place behind, and the crashed request's place holds a request back after its TTL, at the head
/// as well. With slow waiters, a live waiter that stopped asking does the same without a crash.
#[test]
fn places_that_never_expire_hold_requests_back_after_a_crash() {
    let name = "queue/no-expiry";
    let timely = Setup {
        rule: Rule::NoExpiry,
        slow_waiters: false,
        ..Setup::fleet(Bound::from_env())
    };
    let actions = caught(
        name,
        timely,
        &[queue::HEAD_NOT_STARVED, queue::DEAD_PLACES_BOUNDED],
        NO_EXPIRY_STATES,
        queue::DEAD_PLACES_BOUNDED,
        NO_EXPIRY_SEARCH_STATES,
    );
    assert_eq!(actions.len(), 6);
    assert!(
        actions
            .iter()
            .any(|action| matches!(action, QueueAction::Crash { .. }))
    );
    let slow = Setup {
        rule: Rule::NoExpiry,
        ..Setup::fleet(Bound::from_env())
    };
    let actions = search(
        "queue/no-expiry/slow",
        slow,
        queue::DEAD_PLACES_BOUNDED,
        NO_EXPIRY_SLOW_SEARCH_STATES,
    );
    assert_eq!(actions.len(), 5);
}

/// A request that counts its own place among the units ahead of it: at the head, it needs room
/// for twice its cost, and a waiter of the whole limit is never granted.
#[test]
fn a_request_counting_its_own_place_starves_at_the_head() {
    let name = "queue/own-place-ahead";
    let setup = Setup {
        rule: Rule::OwnPlaceAhead,
        ..Setup::fleet(Bound::from_env())
    };
    let actions = caught(
        name,
        setup,
        &[queue::HEAD_NOT_STARVED, queue::DEAD_PLACES_BOUNDED],
        OWN_PLACE_STATES,
        queue::HEAD_NOT_STARVED,
        OWN_PLACE_SEARCH_STATES,
    );
    assert_eq!(actions.len(), 5);
}

/// A renewal that takes a new arrival: a waiter that asks again goes behind those of its
/// priority that came after it, and one of them is granted the unit it was waiting for.
#[test]
fn a_renewal_that_takes_a_new_arrival_is_overtaken() {
    let name = "queue/renewal-rearrives";
    let setup = Setup {
        rule: Rule::RenewalRearrives,
        ..Setup::fleet(Bound::from_env())
    };
    let actions = caught(
        name,
        setup,
        &[
            queue::FIRST_COME,
            queue::HEAD_NOT_STARVED,
            queue::DEAD_PLACES_BOUNDED,
        ],
        REARRIVES_STATES,
        queue::FIRST_COME,
        REARRIVES_SEARCH_STATES,
    );
    assert_eq!(actions.len(), 7);
}

/// A waiter that cannot be served (a process that asks once keeps taking the unit it would
/// need) holds the others back for its hold bound at most: let go, it asks as one that does
/// not wait. Every property holds.
#[test]
fn a_waiter_holds_the_queue_for_its_bound_at_most() {
    let outcome = check(Setup::hold(Bound::from_env()), &[]);
    outcome.report("hold", &[], HOLD_STATES);
    assert_breaks_exactly("hold", &outcome, &[]);
}

/// Without the bound, the same waiter holds the others back for as long as it waits.
#[test]
fn a_waiter_never_let_go_holds_the_queue_past_the_bound() {
    let setup = Setup {
        rule: Rule::NeverLetGo,
        ..Setup::hold(Bound::from_env())
    };
    let actions = caught(
        "never let go",
        setup,
        &[queue::HOLDS_BOUNDED],
        NEVER_LET_GO_STATES,
        queue::HOLDS_BOUNDED,
        NEVER_LET_GO_SEARCH_STATES,
    );
    assert!(!actions.is_empty());
}
