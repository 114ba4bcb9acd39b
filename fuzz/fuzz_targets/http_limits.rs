//! The `http_limits` target: its body and checks are `tollgate_fuzz::targets::http_limits`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/http_limits` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::http_limits::run_input(data));
