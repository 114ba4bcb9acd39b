//! Each target's body, as a function of the bytes libFuzzer hands over: the binaries in
//! `fuzz_targets/` call these, and so does `examples/replay.rs`, which runs every input of
//! `fuzz/corpus/<target>/` through them on stable Rust (`scripts/test-all`).

pub mod envoy_config;
pub mod envoy_descriptors;
pub mod http_acquire;
pub mod http_check;
pub mod http_commit;
pub mod http_learn;
pub mod http_limits;
pub mod http_pause;
pub mod limits_file;
pub mod normalize_path;
pub mod permit_id;
pub mod retry_after;
pub mod simulate_workload;
pub mod sql_rows;
pub mod stats_query;
pub mod vendor_headers;

/// A target's body: one input, as libFuzzer hands it over; a failed check panics.
pub type Target = fn(&[u8]);

/// Every target, by the name of its binary and corpus directory.
pub const ALL: &[(&str, Target)] = &[
    ("envoy_config", envoy_config::run_input),
    ("envoy_descriptors", envoy_descriptors::run_input),
    ("http_acquire", http_acquire::run_input),
    ("http_check", http_check::run_input),
    ("http_commit", http_commit::run_input),
    ("http_learn", http_learn::run_input),
    ("http_limits", http_limits::run_input),
    ("http_pause", http_pause::run_input),
    ("limits_file", limits_file::run_input),
    ("normalize_path", normalize_path::run_input),
    ("permit_id", permit_id::run_input),
    ("retry_after", retry_after::run_input),
    ("simulate_workload", simulate_workload::run_input),
    ("sql_rows", sql_rows::run_input),
    ("stats_query", stats_query::run_input),
    ("vendor_headers", vendor_headers::run_input),
];
