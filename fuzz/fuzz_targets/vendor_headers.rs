//! The `vendor_headers` target: its body and checks are `tollgate_fuzz::targets::vendor_headers`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/vendor_headers` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::vendor_headers::run_input(data));
