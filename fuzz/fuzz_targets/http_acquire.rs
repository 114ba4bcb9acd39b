//! The `http_acquire` target: its body and checks are `tollgate_fuzz::targets::http_acquire`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/http_acquire` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::http_acquire::run_input(data));
