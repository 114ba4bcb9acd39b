//! The `normalize_path` target: its body and checks are `tollgate_fuzz::targets::normalize_path`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/normalize_path` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::normalize_path::run_input(data));
