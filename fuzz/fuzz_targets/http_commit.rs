//! The `http_commit` target: its body and checks are `tollgate_fuzz::targets::http_commit`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/http_commit` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::http_commit::run_input(data));
