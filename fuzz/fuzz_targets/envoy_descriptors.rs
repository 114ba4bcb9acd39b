//! The `envoy_descriptors` target: its body and checks are `tollgate_fuzz::targets::envoy_descriptors`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/envoy_descriptors` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(
    |data: &[u8]| tollgate_fuzz::targets::envoy_descriptors::run_input(data)
);
