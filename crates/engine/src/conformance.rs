//! What the tests of every crate here do when they cannot run (a service they need is not
//! configured or not installed): `skipped`. The conformance suite every store runs is the
//! `tollgate-conformance` crate.

/// Say that a test, or a part of one, did not run and why (`SKIPPED ...` on stderr), for the
/// tests of every crate here. Under `CI=true` it panics instead: CI runs every test, so one that
/// cannot run fails the run (`scripts/test-all`).
#[track_caller]
pub fn skipped(what: &str) {
    if std::env::var("CI").is_ok_and(|value| value == "true") {
        panic!("SKIPPED under CI=true, where every test must run: {what}");
    }
    eprintln!("SKIPPED {what}");
}
