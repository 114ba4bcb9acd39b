//! The `http_learn` target: its body and checks are `tollgate_fuzz::targets::http_learn`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/http_learn` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::http_learn::run_input(data));
