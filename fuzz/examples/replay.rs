//! Replays every committed corpus input, `fuzz/corpus/<target>/*`, through the body its target
//! runs under libFuzzer (`tollgate_fuzz::targets`), on stable Rust and without libFuzzer, so the
//! seeds and the inputs of past crashes are checked on every test run (`scripts/test-all`).
//!
//! Usage: `cargo run --manifest-path fuzz/Cargo.toml --example replay [TARGET...]`. Exits 1 if
//! any input panicked (a failed check), naming each; 2 if a target has no corpus or an unknown
//! target is named.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let asked: Vec<String> = std::env::args().skip(1).collect();
    for name in &asked {
        if !tollgate_fuzz::targets::ALL
            .iter()
            .any(|(target, _)| target == name)
        {
            eprintln!("replay: no target named {name:?}");
            return ExitCode::from(2);
        }
    }
    let corpus = tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR")).join("corpus");
    // The targets' SQLite URLs (`sqlite:file:...?mode=memory`) leave empty files named after
    // them in the working directory: run in a scratch directory, removed at the end.
    let scratch = std::env::temp_dir().join(format!("tollgate-fuzz-replay-{}", std::process::id()));
    if let Err(error) =
        std::fs::create_dir_all(&scratch).and_then(|()| std::env::set_current_dir(&scratch))
    {
        eprintln!("replay: {}: {error}", scratch.display());
        return ExitCode::from(2);
    }
    let code = replay(&asked, &corpus);
    let _ = std::env::set_current_dir(std::env::temp_dir());
    let _ = std::fs::remove_dir_all(&scratch);
    code
}

fn replay(asked: &[String], corpus: &Path) -> ExitCode {
    let mut failed = Vec::new();
    let mut replayed = 0usize;
    for (target, run) in tollgate_fuzz::targets::ALL {
        if !asked.is_empty() && !asked.iter().any(|name| name == target) {
            continue;
        }
        let directory = corpus.join(target);
        let mut inputs: Vec<_> = match std::fs::read_dir(&directory) {
            Ok(entries) => entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|path| path.is_file())
                .collect(),
            Err(error) => {
                eprintln!("replay: {}: {error}", directory.display());
                return ExitCode::from(2);
            }
        };
        if inputs.is_empty() {
            eprintln!("replay: {} holds no input", directory.display());
            return ExitCode::from(2);
        }
        inputs.sort();
        for input in &inputs {
            let bytes = match std::fs::read(input) {
                Ok(bytes) => bytes,
                Err(error) => {
                    eprintln!("replay: {}: {error}", input.display());
                    return ExitCode::from(2);
                }
            };
            // A failed check panics, as under libFuzzer; the panic message is printed by the
            // default hook, and the other inputs still run.
            if catch_unwind(AssertUnwindSafe(|| run(&bytes))).is_err() {
                failed.push(input.display().to_string());
            }
            replayed += 1;
        }
        println!("replay: {target}: {} inputs", inputs.len());
    }
    if failed.is_empty() {
        println!("replay: {replayed} inputs, every check held");
        ExitCode::SUCCESS
    } else {
        eprintln!("replay: {} of {replayed} inputs failed:", failed.len());
        for input in &failed {
            eprintln!("  {input}");
        }
        ExitCode::FAILURE
    }
}
