//! The `envoy_config` target: its body and checks are `tollgate_fuzz::targets::envoy_config`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/envoy_config` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::envoy_config::run_input(data));
