//! The `sql_rows` target: its body and checks are `tollgate_fuzz::targets::sql_rows`, which
//! `cargo run --example replay` also runs over `fuzz/corpus/sql_rows` on stable Rust.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::targets::sql_rows::run_input(data));
