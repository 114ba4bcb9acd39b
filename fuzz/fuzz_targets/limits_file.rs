//! The `limits_file` target: its body and checks are `tollgate_fuzz::targets::limits_file`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/limits_file` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::limits_file::run_input(data));
