//! Runs every model the tests run, at a chosen bound, and prints each one's state count, time,
//! discoveries and counterexamples. The way to check larger bounds than `cargo test` does:
//!
//! ```text
//! cargo run -p tollgate-model --release --example check -- --large
//! ```
//!
//! Exits non-zero if any model's outcome differs from what the tests expect.

use std::fmt::Display;
use std::process::ExitCode;

use tollgate_model::protocol::{self, LossHandling, ProtocolModel, SAFETY_AND_LIVENESS, Setup};
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

fn main() -> ExitCode {
    let mut bound = Bound::Small;
    for argument in std::env::args().skip(1) {
        match argument.as_str() {
            "--large" => bound = Bound::Large,
            "--small" => bound = Bound::Small,
            other => {
                eprintln!("unknown argument {other:?}; usage: check [--small | --large]");
                return ExitCode::from(2);
            }
        }
    }
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
        let outcome = run(calls::CallsModel::seed(design), failures);
        all_as_expected &= judge(
            &format!("calls/{design:?}"),
            &outcome,
            &call_properties,
            failures,
        );
    }

    let (instances, max_tokens) = if bound.is_large() { (3, 3) } else { (2, 2) };
    for (design, failures) in [
        (
            tokens::Design::LockWithTimeout,
            &[tokens::MAX_TOKENS_NOT_EXCEEDED][..],
        ),
        (tokens::Design::Lease, &[][..]),
    ] {
        let model = tokens::TokensModel {
            design,
            instances,
            max_tokens,
        };
        let outcome = run(model, failures);
        all_as_expected &= judge(
            &format!("tokens/{design:?}"),
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
        let model = match ProtocolModel::new(setup) {
            Ok(model) => model,
            Err(error) => {
                eprintln!("{name}: invalid policy: {error}");
                return ExitCode::FAILURE;
            }
        };
        let outcome = run(model, failures);
        // The broken variants stop at their expected failure; other properties may or may not
        // have been reached by then, so only the expected one is judged.
        let checked: &[&str] = if failures.is_empty() {
            &SAFETY_AND_LIVENESS
        } else {
            failures
        };
        all_as_expected &= judge(name, &outcome, checked, failures);
    }

    if all_as_expected {
        println!("every model's outcome is as expected");
        ExitCode::SUCCESS
    } else {
        println!("some outcome differs from what is expected");
        ExitCode::FAILURE
    }
}
