//! Every function of the script (`lua/*.lua`) and its Rust twin: the function in Rust that
//! does the same arithmetic (the core's, which decides in process and which the differential
//! tests compare the script with, or the reference a part of the script follows), or why it has
//! none. The tests below hold the table whole: every function the parts define is in it once,
//! and every twin it names is a function of the file it names.

/// A Lua function's twin.
pub(crate) enum Twin {
    /// `function` in `file` (from the workspace's root) does the same in Rust.
    Rust {
        file: &'static str,
        function: &'static str,
    },
    /// Nothing in Rust does this, for the reason given.
    LuaOnly(&'static str),
}

use Twin::{LuaOnly, Rust};

const COUNTER: &str = "crates/core/src/counter/mod.rs";
const SLIDING: &str = "crates/core/src/counter/sliding.rs";
const FIXED: &str = "crates/core/src/counter/fixed.rs";
const GCRA: &str = "crates/core/src/counter/gcra.rs";
const LEASES: &str = "crates/core/src/counter/leases.rs";
const RESERVATIONS: &str = "crates/core/src/counter/reservations.rs";
const WORDS: &str = "crates/core/src/counter/words.rs";
const QUEUE: &str = "crates/redis-protocol/src/queue.rs";
const LOSS: &str = "crates/redis-protocol/src/loss.rs";
const TALLY: &str = "crates/redis/src/tally.rs";
const CALL: &str = "crates/redis/src/call.rs";

const fn rust(file: &'static str, function: &'static str) -> Twin {
    Rust { file, function }
}

/// Each `T.<name>` the script defines, by name, and its twin.
pub(crate) const LUA_TWINS: &[(&str, Twin)] = &[
    // common.lua
    ("div_ceil", LuaOnly("Rust's u64::div_ceil")),
    ("sub0", LuaOnly("Rust's u64::saturating_sub")),
    ("ttl_ms", LuaOnly("an expiry in Redis's whole milliseconds")),
    ("read_policy", rust(CALL, "policy_args")),
    (
        "capacity_for",
        rust("crates/core/src/policy.rs", "capacity_for"),
    ),
    ("head", rust("crates/redis/src/batch.rs", "head")),
    // words.lua
    ("empty", rust(COUNTER, "new")),
    ("decode", rust(WORDS, "from_words")),
    ("encode", rust(WORDS, "to_words")),
    // logs.lua
    (
        "log_append",
        LuaOnly("a list kept in a Redis key; the core keeps it in memory"),
    ),
    (
        "log_rewrite",
        LuaOnly("a list kept in a Redis key; the core keeps it in memory"),
    ),
    (
        "log_read",
        LuaOnly("a list kept in a Redis key; the core keeps it in memory"),
    ),
    // reservations.lua
    ("clear_reservations", rust(RESERVATIONS, "clear")),
    ("reservations_expire", rust(RESERVATIONS, "expire")),
    ("reservations_record", rust(RESERVATIONS, "record")),
    ("reservations_find", rust(RESERVATIONS, "find")),
    ("reservations_remove", rust(RESERVATIONS, "remove")),
    // sliding.lua
    (
        "repair_buckets",
        LuaOnly("a bucket log lost to an eviction"),
    ),
    (
        "closed_buckets",
        LuaOnly("reads the bucket log, which the core keeps in memory"),
    ),
    ("clear_closed", LuaOnly("a bucket log past its expiry")),
    ("sliding_expire", rust(SLIDING, "sliding_expire")),
    ("sliding_carried", rust(SLIDING, "sliding_carried")),
    (
        "sliding_wait_for_room",
        rust(SLIDING, "sliding_wait_for_room"),
    ),
    ("sliding_grant", rust(SLIDING, "sliding_grant")),
    ("sliding_refund", rust(SLIDING, "sliding_refund")),
    // fixed.lua
    ("fixed_roll", rust(FIXED, "fixed_roll")),
    ("fixed_carried", rust(FIXED, "fixed_carried")),
    ("fixed_wait_for_room", rust(FIXED, "fixed_wait_for_room")),
    ("fixed_refund", rust(FIXED, "fixed_refund")),
    // gcra.lua
    ("gcra_carried", rust(GCRA, "gcra_carried")),
    ("gcra_wait_for_room", rust(GCRA, "gcra_wait_for_room")),
    ("gcra_refund", rust(GCRA, "gcra_refund")),
    // leases.lua
    ("leases_expire", rust(LEASES, "leases_expire")),
    ("leases_used", rust(LEASES, "leases_used")),
    ("leases_wait_for_room", rust(LEASES, "leases_wait_for_room")),
    ("leases_grant", rust(LEASES, "leases_grant")),
    ("leases_release", rust(LEASES, "leases_release")),
    ("leases_find", rust(LEASES, "leases_find")),
    ("leases_counted_until", rust(LEASES, "leases_counted_until")),
    // counter.lua
    ("units_counted", rust(COUNTER, "rate_units_counted")),
    ("normalise", rust(COUNTER, "normalise")),
    ("used", rust(COUNTER, "used")),
    ("wait_for_room", rust(COUNTER, "wait_for_room")),
    ("counted_until", rust(COUNTER, "counted_until")),
    ("idle_at", rust(COUNTER, "idle_at")),
    ("check", rust(COUNTER, "check")),
    ("grant", rust(COUNTER, "grant")),
    ("debit", rust(COUNTER, "debit")),
    (
        "save",
        LuaOnly("writes the counter back to Redis with its expiry; the core's is a value"),
    ),
    // keys.lua
    ("span", rust(TALLY, "span_us")),
    (
        "need",
        LuaOnly("until when a counter's keys must live, from its idle time"),
    ),
    ("cover_end", rust(TALLY, "cover_end")),
    ("admit", rust(TALLY, "admit")),
    ("read_admission", rust(CALL, "admission")),
    (
        "cover",
        LuaOnly("asks the key budget before a write; in another slot the store asks it"),
    ),
    (
        "uncovered",
        LuaOnly("the reply of an operation the key budget stopped"),
    ),
    // loss.lua
    (
        "identity",
        LuaOnly("reads the Redis master's ids; loss.rs's Owner is what it makes"),
    ),
    ("generation", rust(LOSS, "generation")),
    ("evictions", LuaOnly("reads Redis's count of evicted keys")),
    ("load", rust(LOSS, "hold_until")),
    // pauses.lua
    ("hold", rust(COUNTER, "recovering")),
    ("pause_op", rust(COUNTER, "pause")),
    ("resume_op", rust(COUNTER, "resume")),
    // queue.lua
    ("queue_read", rust(QUEUE, "decode")),
    ("before", rust(QUEUE, "before")),
    ("queue_rank", rust(QUEUE, "rank_of")),
    ("queue_leave", rust(QUEUE, "leave")),
    ("queue_stand", rust(QUEUE, "stand")),
    ("queue_write", rust(QUEUE, "encode")),
    (
        "wake_channel",
        rust("crates/redis/src/keys.rs", "wake_channel"),
    ),
    ("wake", LuaOnly("a PUBLISH on the wake channel")),
    // acquire.lua
    ("acquire", rust(COUNTER, "decide")),
    // operations.lua
    ("commit_op", rust(COUNTER, "commit")),
    ("renew_op", rust(COUNTER, "renew")),
    ("usage_op", rust(COUNTER, "usage")),
    (
        "charge_op",
        rust("crates/engine/src/memory/decide.rs", "charge_now"),
    ),
    // entry.lua
    (
        "format",
        LuaOnly("unpacks the numbers call.rs's Numbers packs"),
    ),
    (
        "numbers",
        LuaOnly("unpacks the numbers call.rs's Numbers packs"),
    ),
    ("decide", LuaOnly("the dispatch on the operation code")),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{LUA_TWINS, Twin};
    use crate::abi::{PARTS, tests::code_of};

    /// Every function a part defines (`function T.<name>` or `local function <name>`), with its
    /// part.
    pub(crate) fn lua_functions() -> BTreeMap<String, Vec<&'static str>> {
        let mut functions: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for (part, text) in PARTS {
            for line in code_of(text).lines() {
                let line = line.trim_start();
                let name = line
                    .strip_prefix("function T.")
                    .or_else(|| line.strip_prefix("local function "))
                    .and_then(|rest| rest.split('(').next());
                if let Some(name) = name {
                    functions
                        .entry(name.trim().to_owned())
                        .or_default()
                        .push(part);
                }
            }
        }
        functions
    }

    /// Whether `source` defines a function `name` (`fn name(` or `fn name<`).
    fn defines(source: &str, name: &str) -> bool {
        source
            .match_indices(&format!("fn {name}"))
            .any(|(at, found)| {
                let before = source[..at].chars().next_back();
                let after = source[at + found.len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && matches!(after, Some('(' | '<'))
            })
    }

    #[test]
    fn every_lua_function_has_its_twin_or_says_why_not() {
        let functions = lua_functions();
        let mut problems = Vec::new();
        for (name, parts) in &functions {
            if parts.len() > 1 {
                problems.push(format!("T.{name} is defined in {parts:?}"));
            }
            match LUA_TWINS.iter().filter(|(lua, _)| lua == name).count() {
                1 => {}
                0 => problems.push(format!("T.{name} ({parts:?}) has no row in LUA_TWINS")),
                _ => problems.push(format!("T.{name} has more than one row in LUA_TWINS")),
            }
        }
        let root = &tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR")).join("../..");
        for (lua, twin) in LUA_TWINS {
            if !functions.contains_key(*lua) {
                problems.push(format!("LUA_TWINS names T.{lua}, which no part defines"));
            }
            match twin {
                Twin::Rust { file, function } => match std::fs::read_to_string(root.join(file)) {
                    Ok(source) if defines(&source, function) => {}
                    Ok(_) => problems.push(format!("T.{lua}: no fn {function} in {file}")),
                    Err(error) => problems.push(format!("T.{lua}: {file}: {error}")),
                },
                Twin::LuaOnly(reason) => {
                    if reason.trim().is_empty() {
                        problems.push(format!("T.{lua} is Lua only without a reason"));
                    }
                }
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
        // The check of a Rust twin itself.
        assert!(defines("pub fn commit(&mut self)", "commit"));
        assert!(!defines("fn committed(&self)", "commit"));
    }

    /// The files under `directory` (from the workspace's root) whose text holds or dispatches
    /// to an algorithm's arithmetic: each algorithm has its wait for room, `<name>_wait_for_room`.
    fn algorithm_files(root: &std::path::Path, directory: &str) -> Vec<String> {
        let mut files: Vec<String> = std::fs::read_dir(root.join(directory))
            .unwrap_or_else(|error| panic!("{directory}: {error}"))
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .map(|name| format!("{directory}/{name}"))
            .filter(|path| {
                std::fs::read_to_string(root.join(path))
                    .is_ok_and(|text| text.contains("_wait_for_room("))
            })
            .collect();
        files.sort();
        files
    }

    #[test]
    fn the_recipe_for_an_algorithm_names_every_file_it_touches_and_only_files_that_exist() {
        let root = &tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR")).join("../..");
        let architecture =
            std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
        let start = architecture
            .find("\n### Add an algorithm\n")
            .expect("ARCHITECTURE.md has the recipe");
        let recipe = &architecture[start + 1..];
        let recipe = &recipe[..recipe.find("\n#").unwrap_or(recipe.len())];
        let named: Vec<&str> = recipe
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|quoted| quoted.starts_with("crates/"))
            .collect();
        let mut problems = Vec::new();
        for path in &named {
            if !root.join(path).exists() {
                problems.push(format!("the recipe names {path}, which does not exist"));
            }
        }
        let algorithm_files = [
            algorithm_files(root, "crates/core/src/counter"),
            algorithm_files(root, "crates/redis/src/lua"),
        ];
        for (directory, files) in ["counter", "lua"].iter().zip(&algorithm_files) {
            assert!(
                files.len() >= 5,
                "{directory}: the algorithms and their dispatch"
            );
        }
        for path in algorithm_files.iter().flatten() {
            if !named.contains(&path.as_str()) {
                problems.push(format!("the recipe does not name {path}"));
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
