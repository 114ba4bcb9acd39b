//! The `http_pause` target: its body and checks are `tollgate_fuzz::targets::http_pause`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/http_pause` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::http_pause::run_input(data));
