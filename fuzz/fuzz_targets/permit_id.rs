//! The `permit_id` target: its body and checks are `tollgate_fuzz::targets::permit_id`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/permit_id` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::permit_id::run_input(data));
