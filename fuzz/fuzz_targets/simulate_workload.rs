//! The `simulate_workload` target: its body and checks are `tollgate_fuzz::targets::simulate_workload`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/simulate_workload` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(
    |data: &[u8]| tollgate_fuzz::targets::simulate_workload::run_input(data)
);
