//! The `http_check` target: its body and checks are `tollgate_fuzz::targets::http_check`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/http_check` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::http_check::run_input(data));
