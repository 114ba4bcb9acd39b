//! The `retry_after` target: its body and checks are `tollgate_fuzz::targets::retry_after`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/retry_after` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::retry_after::run_input(data));
