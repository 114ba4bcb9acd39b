//! Runs every model the tests run, at a chosen bound, and prints each one's state count, time,
//! discoveries and counterexamples. The way to check larger bounds than `cargo test` does:
//!
//! ```text
//! cargo run -p tollgate-model --release --example check -- --large
//! ```
//!
//! Names after the bound keep only the models whose name starts with one of them
//! (`check --large cross-slot failover queue`).
//!
//! Exits non-zero if any model's outcome differs from what the tests expect.

use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::process::ExitCode;

use stateright::Model;
use tollgate_model::cross_slot::{self, CrossSlotModel, OnDenial, Order};
use tollgate_model::failover::{self, Check, FailoverModel, Hold};
use tollgate_model::protocol::{self, LossHandling, ProtocolModel, SAFETY_AND_LIVENESS, Setup};
use tollgate_model::queue::{self, QueueModel, Rule};
use tollgate_model::{Bound, Outcome, calls, run, tokens, trace};

/// Print an outcome and tell whether it found exactly the failures it was expected to.
fn judge<S, A>(
    name: &str,
    outcome: &Outcome<S, A>,
    checked: &[&str],
    expected_failures: &[&str],
) -> bool
where
    S: Clone + Display,
    A: Clone + Display,
{
    println!("{}", outcome.summary(name));
    let mut as_expected = true;
    for property in checked {
        let found = outcome.found(property);
        let expected = expected_failures.contains(property);
        if let Some(path) = outcome.discoveries.get(property) {
            println!("  counterexample to {property:?}:\n{}", trace(path));
        }
        if found != expected {
            println!("  UNEXPECTED: {property:?} found={found}, expected={expected}");
            as_expected = false;
        }
    }
    as_expected
}

/// Run a model made from a setup, print it and judge it: every one of `properties` when no
/// failure is expected; else only the expected failures, as the run stops at them and other
/// properties may or may not have been reached by then. `None` when the setup is invalid.
fn check<M, E>(
    name: &str,
    model: Result<M, E>,
    properties: &[&str],
    failures: &[&'static str],
) -> Option<bool>
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Display + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + Display + PartialEq,
    E: Display,
{
    let model = match model {
        Ok(model) => model,
        Err(error) => {
            eprintln!("{name}: invalid policy: {error}");
            return None;
        }
    };
    let outcome = run(model, failures);
    let checked = if failures.is_empty() {
        properties
    } else {
        failures
    };
    Some(judge(name, &outcome, checked, failures))
}

fn main() -> ExitCode {
    let mut bound = Bound::Small;
    let mut prefixes: Vec<String> = Vec::new();
    for argument in std::env::args().skip(1) {
        match argument.as_str() {
            "--large" => bound = Bound::Large,
            "--small" => bound = Bound::Small,
            other if other.starts_with("--") => {
                eprintln!(
                    "unknown argument {other:?}; usage: check [--small | --large] [NAME-PREFIX...]"
                );
                return ExitCode::from(2);
            }
            other => prefixes.push(other.to_owned()),
        }
    }
    let wanted = |name: &str| {
        prefixes.is_empty()
            || prefixes
                .iter()
                .any(|prefix| name.starts_with(prefix.as_str()))
    };
    println!("bound: {bound:?}");
    let mut all_as_expected = true;

    let call_properties = [calls::NO_OVERSHOOT, calls::NO_DEADLOCK];
    for (design, failures) in [
        (calls::Design::Naive, &[calls::NO_OVERSHOOT][..]),
        (calls::Design::CheckThenAct, &[calls::NO_OVERSHOOT][..]),
        (calls::Design::AwaitNoReset, &[calls::NO_DEADLOCK][..]),
        (calls::Design::AwaitWithReset, &[][..]),
        (calls::Design::Reservation, &[][..]),
    ] {
        let name = format!("calls/{design:?}");
        if !wanted(&name) {
            continue;
        }
        let outcome = run(calls::CallsModel::seed(design), failures);
        all_as_expected &= judge(&name, &outcome, &call_properties, failures);
    }

    let (instances, max_tokens) = if bound.is_large() { (3, 3) } else { (2, 2) };
    for (design, failures) in [
        (
            tokens::Design::LockWithTimeout,
            &[tokens::MAX_TOKENS_NOT_EXCEEDED][..],
        ),
        (tokens::Design::Lease, &[][..]),
    ] {
        let name = format!("tokens/{design:?}");
        if !wanted(&name) {
            continue;
        }
        let model = tokens::TokensModel {
            design,
            instances,
            max_tokens,
        };
        let outcome = run(model, failures);
        all_as_expected &= judge(
            &name,
            &outcome,
            &[tokens::MAX_TOKENS_NOT_EXCEEDED],
            failures,
        );
    }

    let protocol_checks: [(&str, Setup, &[&'static str]); 5] = [
        ("protocol/faults", Setup::faults(bound), &[]),
        ("protocol/sliding", Setup::sliding(bound), &[]),
        ("protocol/shared-leases", Setup::shared_leases(bound), &[]),
        (
            "protocol/forgets",
            Setup {
                loss_handling: LossHandling::Forgets,
                ..Setup::faults(bound)
            },
            &[protocol::G6_LOSS],
        ),
        (
            "protocol/long-pause-and-loss",
            Setup {
                pause_ticks: 3,
                ..Setup::faults(bound)
            },
            &[protocol::G4_PAUSE],
        ),
    ];
    for (name, setup, failures) in protocol_checks {
        if wanted(name) {
            let model = ProtocolModel::new(setup);
            match check(name, model, &SAFETY_AND_LIVENESS, failures) {
                Some(as_expected) => all_as_expected &= as_expected,
                None => return ExitCode::FAILURE,
            }
        }
    }

    let cross_slot_checks: [(&str, cross_slot::Setup, &[&'static str]); 4] = [
        (
            "cross-slot/contended",
            cross_slot::Setup::contended(bound),
            &[],
        ),
        (
            "cross-slot/limit-two",
            cross_slot::Setup::limit_two(bound),
            &[],
        ),
        (
            "cross-slot/keep-grants",
            cross_slot::Setup {
                on_denial: OnDenial::KeepGrants,
                ..cross_slot::Setup::contended(bound)
            },
            &[
                cross_slot::ALL_OR_NOTHING,
                cross_slot::DENIED_ONLY_WHEN_FULL,
            ],
        ),
        (
            "cross-slot/as-named",
            cross_slot::Setup {
                order: Order::AsNamed,
                ..cross_slot::Setup::contended(bound)
            },
            &[cross_slot::NO_LIVELOCK],
        ),
    ];
    for (name, setup, failures) in cross_slot_checks {
        if wanted(name) {
            let model = CrossSlotModel::new(setup);
            match check(name, model, &cross_slot::ALL, failures) {
                Some(as_expected) => all_as_expected &= as_expected,
                None => return ExitCode::FAILURE,
            }
        }
    }

    let g6: &[&'static str] = &[failover::G6_LOSS];
    let mut failover_checks: Vec<(String, failover::Setup, &[&'static str])> = vec![
        (
            "failover/failover".into(),
            failover::Setup::failover(bound),
            &[],
        ),
        (
            "failover/missing-only".into(),
            failover::Setup {
                check: Check::MissingOnly,
                ..failover::Setup::failover(bound)
            },
            g6,
        ),
        (
            "failover/stale-as-is".into(),
            failover::Setup {
                hold: Hold::StaleAsIs,
                ..failover::Setup::failover(bound)
            },
            g6,
        ),
    ];
    let findings = [
        ("failback", failover::Setup::failback(bound)),
        ("forced", failover::Setup::forced_failover(bound)),
        ("reshard", failover::Setup::reshard(bound)),
        (
            "restart-then-reshard",
            failover::Setup::restart_then_reshard(bound),
        ),
    ];
    // The real check on each finding and everything at once; the store's former rule, caught
    // on each finding.
    let everything = ("everything", failover::Setup::everything(bound));
    for (name, setup) in findings.iter().cloned().chain([everything]) {
        failover_checks.push((format!("failover/{name}"), setup, &[]));
    }
    for (name, setup) in findings {
        let former = failover::Setup {
            check: Check::MovedExemption,
            ..setup
        };
        failover_checks.push((format!("failover/moved-exemption/{name}"), former, g6));
    }
    for (name, setup, failures) in failover_checks {
        if wanted(&name) {
            let model = FailoverModel::new(setup);
            match check(&name, model, g6, failures) {
                Some(as_expected) => all_as_expected &= as_expected,
                None => return ExitCode::FAILURE,
            }
        }
    }

    let queue_checks: [(&str, queue::Setup, &[&'static str]); 8] = [
        ("queue/fleet", queue::Setup::fleet(bound), &[]),
        ("queue/fixed", queue::Setup::fixed(bound), &[]),
        (
            "queue/reserve",
            queue::Setup::reserve(bound),
            &[queue::QUEUED_ONLY_WHEN_NEEDED],
        ),
        (
            "queue/no-registration",
            queue::Setup {
                rule: Rule::NoRegistration,
                ..queue::Setup::fleet(bound)
            },
            &[queue::NO_LOWER_GRANT, queue::FIRST_COME],
        ),
        (
            "queue/no-expiry",
            queue::Setup {
                rule: Rule::NoExpiry,
                slow_waiters: false,
                ..queue::Setup::fleet(bound)
            },
            &[queue::HEAD_NOT_STARVED, queue::DEAD_PLACES_BOUNDED],
        ),
        (
            "queue/no-expiry/slow",
            queue::Setup {
                rule: Rule::NoExpiry,
                ..queue::Setup::fleet(bound)
            },
            &[
                queue::FIRST_COME,
                queue::HEAD_NOT_STARVED,
                queue::DEAD_PLACES_BOUNDED,
            ],
        ),
        (
            "queue/own-place-ahead",
            queue::Setup {
                rule: Rule::OwnPlaceAhead,
                ..queue::Setup::fleet(bound)
            },
            &[queue::HEAD_NOT_STARVED, queue::DEAD_PLACES_BOUNDED],
        ),
        (
            "queue/renewal-rearrives",
            queue::Setup {
                rule: Rule::RenewalRearrives,
                ..queue::Setup::fleet(bound)
            },
            &[
                queue::FIRST_COME,
                queue::HEAD_NOT_STARVED,
                queue::DEAD_PLACES_BOUNDED,
            ],
        ),
    ];
    for (name, setup, failures) in queue_checks {
        if wanted(name) {
            let model = QueueModel::new(setup);
            match check(name, model, &queue::ALL, failures) {
                Some(as_expected) => all_as_expected &= as_expected,
                None => return ExitCode::FAILURE,
            }
        }
    }

    if all_as_expected {
        println!("every model's outcome is as expected");
        ExitCode::SUCCESS
    } else {
        println!("some outcome differs from what is expected");
        ExitCode::FAILURE
    }
}
