//! What the tests of every crate here do when they cannot run (a service they need is not
//! configured or not installed): `skipped`; and where they find the workspace's files
//! (`package_dir`). The conformance suite every store runs is the
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

/// The directory of the package whose tests run: the one cargo names when it runs them, else
/// `built_in` (`env!("CARGO_MANIFEST_DIR")`, the one it built them in). A test binary built in
/// another checkout of the same sources, and found up to date in a shared target directory,
/// keeps the path it was built in, which may be gone.
pub fn package_dir(built_in: &str) -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| built_in.into(), std::path::PathBuf::from)
}
