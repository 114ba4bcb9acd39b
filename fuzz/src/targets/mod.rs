//! Each target's body, as a function of the bytes libFuzzer hands over: the binaries in
//! `fuzz_targets/` call these, and so does `examples/replay.rs`, which runs every input of
//! `fuzz/corpus/<target>/` through them on stable Rust (`scripts/test-all`).

pub mod envoy_config;
pub mod envoy_descriptors;
pub mod http_acquire;
pub mod http_check;
pub mod http_commit;
pub mod http_limits;
pub mod http_pause;
pub mod limits_file;
pub mod normalize_path;
pub mod permit_id;
pub mod retry_after;
pub mod simulate_workload;
pub mod sql_rows;
pub mod stats_query;

/// Every target, by the name of its binary and corpus directory.
pub const ALL: &[(&str, fn(&[u8]))] = &[
    ("envoy_config", envoy_config::run),
    ("envoy_descriptors", envoy_descriptors::run),
    ("http_acquire", http_acquire::run),
    ("http_check", http_check::run),
    ("http_commit", http_commit::run),
    ("http_limits", http_limits::run),
    ("http_pause", http_pause::run),
    ("limits_file", limits_file::run),
    ("normalize_path", normalize_path::run),
    ("permit_id", permit_id::run),
    ("retry_after", retry_after::run),
    ("simulate_workload", simulate_workload::run),
    ("sql_rows", sql_rows::run),
    ("stats_query", stats_query::run),
];
