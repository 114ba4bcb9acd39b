//! The `stats_query` target: its body and checks are `tollgate_fuzz::targets::stats_query`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/stats_query` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::stats_query::run_input(data));
