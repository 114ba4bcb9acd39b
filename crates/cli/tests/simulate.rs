//! `tollgate simulate`: workloads are checked field by field, the shipped workloads run without
//! overdrawing a limit, the same seed gives the same report, every call is accounted for and
//! said in words, the chart names its axes, and a run on the wall clock keeps the limits too.

mod common;

use common::command;
use tollgate_cli::simulate::{Report, parse, run};

/// Bulk workers and interactive arrivals on one quota with a reserve, scaled down so that a
/// wall-clock run takes a few seconds.
const SMALL: &str = r#"
duration_s = 4
seed = 7

[limits.quota]
kind = "rate"
limit = 20
period_ms = 500
algorithm = "sliding"
reserve = { high = 4 }

[[callers]]
name = "bulk"
limits = ["quota"]
priority = "low"
count = 8
call_ms = 20
wait_ms = 2000

[[callers]]
name = "interactive"
limits = ["quota"]
priority = "high"
rate = 5.0
call_ms = 20
wait_ms = 400
"#;

fn virtual_run(text: &str) -> Report {
    let workload = parse(text).expect("a valid workload");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(run(&workload, |_| {}))
        .expect("ran")
}

fn granted(report: &Report) -> u64 {
    report.callers.iter().map(|caller| caller.granted).sum()
}

#[test]
fn the_same_seed_gives_the_same_report_and_no_limit_is_overdrawn() {
    let first = virtual_run(SMALL);
    assert_eq!(first, virtual_run(SMALL));
    assert!(first.overshoots().is_empty(), "{first:?}");
    let quota = &first.limits[0];
    assert_eq!(quota.limit, 20);
    assert!(quota.max_in_window >= 16, "the limit was used: {quota:?}");
    // Demand exceeds supply the whole run, and the bulk workers may not touch the reserve.
    let utilization = quota.utilization.expect("demand exceeded supply");
    assert!(utilization > 0.7 && utilization <= 1.0, "{utilization}");
    let interactive = &first.callers[1];
    assert!(
        interactive.offered > 0 && interactive.granted > 0,
        "{interactive:?}"
    );
}

/// The virtual clock runs the same engine as the wall clock: on the wall clock too no limit is
/// overdrawn and every caller is served. How many calls a loaded machine gets through in four
/// real seconds is speed, not correctness, so it is printed and not judged.
#[test]
fn a_run_on_the_wall_clock_keeps_the_limits_too() {
    let simulated = virtual_run(SMALL);
    let workload = parse(SMALL).expect("valid");
    let real = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run(&workload, |_| {}))
        .expect("ran");
    assert!(real.overshoots().is_empty(), "{real:?}");
    eprintln!(
        "granted: virtual clock {}, wall clock {}",
        granted(&simulated),
        granted(&real)
    );
    for caller in &real.callers {
        assert!(caller.granted > 0, "{caller:?}");
        assert_accounted(caller);
    }
}

/// Every call offered is in exactly one place: granted (and in the wait figures), refused when
/// asked, queued until its wait ran out, or still waiting at the end.
fn assert_accounted(caller: &tollgate_cli::simulate::CallerReport) {
    let gave_up = &caller.gave_up;
    assert_eq!(
        caller.offered,
        caller.granted + gave_up.at_once + gave_up.at_deadline + caller.unfinished + caller.errors,
        "{caller:?}"
    );
    assert_eq!(caller.errors, 0, "{caller:?}");
    assert_eq!(
        gave_up.by_reason.values().sum::<u64>(),
        gave_up.at_once + gave_up.at_deadline,
        "{caller:?}"
    );
    // A granted call waited no longer than its caller would.
    assert!(
        caller.wait_ms.max <= caller.wait_limit_ms as f64,
        "{caller:?}"
    );
}

/// The shipped bulk-and-interactive workload, read as a user reads it: every interactive call is
/// granted within its wait or counted as given up with the reason, and the report says so in one
/// sentence per caller.
#[test]
fn the_report_accounts_for_every_call_and_says_why_calls_gave_up() {
    let text = std::fs::read_to_string(
        tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/workloads/bulk-and-interactive.toml"),
    )
    .expect("the example");
    let report = virtual_run(&text);
    assert!(report.overshoots().is_empty(), "{report:?}");
    for caller in &report.callers {
        assert_accounted(caller);
        let sentence = &caller.summary;
        assert!(
            sentence.starts_with(&format!("{} ({})", caller.name, caller.priority)),
            "{sentence}"
        );
        assert!(
            sentence.contains(&format!("{:.0} ms at p50", caller.wait_ms.p50))
                && sentence.contains(&format!("{:.0} ms at p99", caller.wait_ms.p99)),
            "{sentence}"
        );
        let gave_up = caller.gave_up.at_once + caller.gave_up.at_deadline;
        if gave_up > 0 {
            assert!(
                sentence.contains(&format!("{gave_up} gave up")),
                "{sentence}"
            );
            for (reason, count) in &caller.gave_up.by_reason {
                assert!(
                    sentence.contains(&format!("{reason} {count}")),
                    "{sentence}"
                );
            }
        } else {
            assert!(sentence.contains("none gave up"), "{sentence}");
        }
    }
    let table = tollgate_cli::simulate::table(&report);
    for caller in &report.callers {
        assert!(table.contains(&caller.summary), "{table}");
    }
    // The 40 bulk workers wait up to a minute each: when the hour ends, some are still queued,
    // and the report says how many rather than dropping them.
    let bulk = &report.callers[0];
    assert!(bulk.unfinished > 0, "{bulk:?}");
}

/// The chart names its axes, and the wait figures do not reuse the priorities' colours.
#[test]
fn the_chart_labels_its_axes_and_keeps_colours_apart() {
    let report = virtual_run(SMALL);
    let svg = tollgate_cli::simulate::chart(&report);
    for label in [
        "simulated time (s)",
        "units per window",
        "wait (ms)",
        "high priority",
        ">p50<",
        ">p99<",
        ">max<",
        "limit 20",
    ] {
        assert!(svg.contains(label), "{label} missing");
    }
    let fills = |from: &str, to: &str| -> std::collections::BTreeSet<String> {
        let part = &svg[svg.find(from).expect("part")..svg.find(to).expect("part")];
        part.split("fill=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .filter(|colour| colour.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    let priorities = fills("units granted per window", "how long granted calls waited");
    let waits = fills("how long granted calls waited", "</svg>");
    assert!(
        priorities.len() >= 2 && waits.len() >= 3,
        "{priorities:?} {waits:?}"
    );
    assert!(priorities.is_disjoint(&waits), "{priorities:?} {waits:?}");
}

#[test]
fn a_bad_workload_is_refused_naming_the_field() {
    for (change, says) in [
        (
            (
                "limits = [\"quota\"]\npriority = \"low\"",
                "limits = [\"nope\"]\npriority = \"low\"",
            ),
            "callers[0] (bulk).limits: no limit named \"nope\"",
        ),
        (("count = 8", "count = 0"), "callers[0] (bulk).count"),
        (
            ("rate = 5.0", "rate = -1.0"),
            "callers[1] (interactive).count",
        ),
        (("limit = 20", "limit = 0"), "limits.quota.limit"),
        (
            ("priority = \"high\"", "priority = \"urgent\""),
            "callers[1] (interactive).priority",
        ),
        (("duration_s = 4", "duration_s = 0"), "duration_s"),
        (("seed = 7", "seed = 7\nspeed = 2"), "unknown field `speed`"),
        // Requests the engine would refuse on every try.
        (
            ("count = 8", "count = 8\ncost = 17"),
            "callers[0] (bulk).cost",
        ),
        (
            (
                "limits = [\"quota\"]\npriority = \"low\"",
                "limits = [\"quota\", \"quota\"]\npriority = \"low\"",
            ),
            "callers[0] (bulk).limits: limit \"quota\" is named twice",
        ),
        (
            (
                "algorithm = \"sliding\"",
                "algorithm = \"sliding\"\nper = \"user\"",
            ),
            "callers[0] (bulk).key",
        ),
        (
            ("count = 8", "count = 8\nkey = \"a\\u0007\""),
            "callers[0] (bulk).key",
        ),
    ] {
        let text = SMALL.replacen(change.0, change.1, 1);
        assert_ne!(text, SMALL, "{change:?} changed nothing");
        let error = parse(&text).expect_err("refused").to_string();
        assert!(error.contains(says), "{change:?}: {error}");
    }
}

/// The shipped workloads run from the command line, as JSON and as a chart.
#[test]
fn the_shipped_workloads_run_without_overdrawing() {
    let directory = tempfile::tempdir().expect("tempdir");
    let examples = tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/workloads");
    for name in [
        "bulk-and-interactive.toml",
        "escalating-vendor.toml",
        "vendor-learning.toml",
    ] {
        let chart = directory.path().join(format!("{name}.svg"));
        let output = command(directory.path())
            .args(["simulate", "--json", "--chart"])
            .arg(&chart)
            .arg(examples.join(name))
            .output()
            .expect("runs");
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        for limit in report["limits"].as_array().expect("limits") {
            assert!(
                limit["max_in_window"].as_u64() <= limit["limit"].as_u64(),
                "{name}: {limit}"
            );
        }
        for caller in report["callers"].as_array().expect("callers") {
            assert!(caller["granted"].as_u64() > Some(0), "{name}: {caller}");
            assert!(caller["wait_ms"]["p99"].is_number(), "{name}: {caller}");
        }
        let svg = std::fs::read_to_string(&chart).expect("the chart");
        assert!(svg.starts_with("<svg") && svg.contains("<line"), "{name}");
        if name == "vendor-learning.toml" {
            // The callers learn the vendor's 10 a second (and its 5 for a minute) from its
            // headers: few refusals, nearly all of its capacity used.
            let vendor = &report["vendor"];
            assert!(vendor["limited"].as_u64() <= Some(10), "{vendor}");
            assert!(vendor["used_share"].as_f64() >= Some(0.95), "{vendor}");
            assert_eq!(vendor["window"], "sliding", "{vendor}");
        }
    }
    let missing = command(directory.path())
        .args(["simulate", "nowhere.toml"])
        .output()
        .expect("runs");
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nowhere.toml"));
}

/// Sync workers behind a limit of `configured` a second, calling a vendor described by
/// `vendor` (the `[vendor]` table's fields beyond `guarded_by`), learning from it or not.
fn behind_a_vendor(configured: u64, workers: u64, vendor: &str, learn: bool) -> String {
    format!(
        r#"
duration_s = 60
seed = 3
learn = {learn}

[limits.vendor-x]
kind = "rate"
limit = {configured}
period_ms = 1000
algorithm = "sliding"

[[callers]]
name = "sync"
limits = ["vendor-x"]
count = {workers}
call_ms = 50
wait_ms = 30000

[vendor]
guarded_by = "vendor-x"
{vendor}
"#
    )
}

fn vendor_of(report: &Report) -> &tollgate_cli::simulate::VendorReport {
    report.vendor.as_ref().expect("a vendor report")
}

/// Configured for 20 a second, the vendor allows 10 and says so in its headers: callers that
/// learn teach the limiter 10 from the first answer, so the vendor refuses at most one call
/// after it while most of its capacity is used; callers that only pause on a 429 keep calling
/// into refusals.
#[test]
fn callers_that_learn_the_advertised_limit_stop_meeting_refusals() {
    let vendor = "limit = 10\nperiod_ms = 1000\nheaders = true";
    let learning = virtual_run(&behind_a_vendor(20, 4, vendor, true));
    let pausing = virtual_run(&behind_a_vendor(20, 4, vendor, false));
    assert_eq!(learning, virtual_run(&behind_a_vendor(20, 4, vendor, true)));
    let (on, off) = (vendor_of(&learning), vendor_of(&pausing));
    eprintln!("learning: {on:?}\npausing only: {off:?}");
    assert!(learning.overshoots().is_empty() && pausing.overshoots().is_empty());
    assert!(on.limited_after_first_answer <= 1, "{on:?}");
    assert!(on.used_share >= 0.9, "{on:?}");
    assert!(on.lessons > 0 && on.effective_at_end == Some(10), "{on:?}");
    assert!(
        off.limited_after_first_answer > on.limited_after_first_answer,
        "pausing only: {off:?}"
    );
    assert_eq!(off.lessons, 0, "{off:?}");
}

/// The vendor halves its limit from 10 to 5 in the middle of the run, and its headers say so:
/// the callers learn it from the first refusal and meet at most two.
#[test]
fn a_vendor_that_lowers_its_limit_mid_run_is_followed() {
    let vendor = "limit = 10\nperiod_ms = 1000\nheaders = true\nsteps = [{at_s = 30.5, limit = 5}]";
    let learning = virtual_run(&behind_a_vendor(10, 2, vendor, true));
    let pausing = virtual_run(&behind_a_vendor(10, 2, vendor, false));
    let (on, off) = (vendor_of(&learning), vendor_of(&pausing));
    eprintln!("learning: {on:?}\npausing only: {off:?}");
    assert!(on.limited <= 2, "{on:?}");
    assert_eq!(on.effective_at_end, Some(5), "{on:?}");
    // 10 a second for 30.5 s, then 5: 457.5 calls; all but the refusals' pauses used.
    assert!(on.used_share >= 0.85, "{on:?}");
    assert!(off.limited > on.limited, "pausing only: {off:?}");
}

/// A vendor that says nothing but 429 with `Retry-After`: callers that learn halve the limit
/// on a refusal and meet fewer than callers that only pause.
#[test]
fn refusals_without_headers_teach_a_lower_limit() {
    let vendor = "limit = 10\nperiod_ms = 1000";
    let learning = virtual_run(&behind_a_vendor(20, 4, vendor, true));
    let pausing = virtual_run(&behind_a_vendor(20, 4, vendor, false));
    let (on, off) = (vendor_of(&learning), vendor_of(&pausing));
    eprintln!("learning: {on:?}\npausing only: {off:?}");
    assert!(
        on.limited < off.limited,
        "learning: {on:?}\npausing only: {off:?}"
    );
    assert!(on.lessons > 0, "{on:?}");
}

/// The vendor counts arrivals itself: in fixed windows, with a load curve, every arrival past
/// its limit in its window is counted whether admitted or not, and the capacity follows the
/// curve.
#[test]
fn the_vendor_counts_its_own_windows_and_capacity() {
    let vendor = "limit = 10\nperiod_ms = 1000\nwindow = \"fixed\"\nload_curve = {every_s = 10, low = 4, high = 8}";
    let report = virtual_run(&behind_a_vendor(10, 4, vendor, false));
    let seen = vendor_of(&report);
    eprintln!("{seen:?}");
    // 8 a second for 10 s, then 4, over 60 s.
    assert_eq!(seen.capacity, 360.0, "{seen:?}");
    assert_eq!(seen.calls, seen.ok + seen.limited, "{seen:?}");
    assert!(
        seen.over_limit >= seen.limited && seen.limited > 0,
        "{seen:?}"
    );
    assert!(seen.ok as f64 <= seen.capacity, "{seen:?}");
}

#[test]
fn a_bad_vendor_is_refused_naming_the_field() {
    let good = behind_a_vendor(20, 4, "limit = 10\nperiod_ms = 1000", true);
    parse(&good).expect("valid");
    for (change, says) in [
        (
            (
                "limit = 10\n",
                "limit = 10\nsteps = [{at_s = 20, limit = 5}, {at_s = 10, limit = 8}]\n",
            ),
            "vendor.steps[1].at_s",
        ),
        (
            (
                "limit = 10\n",
                "limit = 10\nsteps = [{at_s = 20, limit = 0}]\n",
            ),
            "vendor.steps[0].limit",
        ),
        (
            (
                "limit = 10\n",
                "limit = 10\nsteps = [{at_s = 61, limit = 5}]\n",
            ),
            "vendor.steps[0].at_s",
        ),
        (
            (
                "limit = 10\n",
                "limit = 10\nload_curve = {every_s = 10, low = 0, high = 8}\n",
            ),
            "vendor.load_curve.low",
        ),
        (
            (
                "limit = 10\n",
                "limit = 10\nload_curve = {every_s = 10, low = 9, high = 8}\n",
            ),
            "vendor.load_curve.high",
        ),
        (
            (
                "limit = 10\n",
                "limit = 10\nload_curve = {every_s = 0.0, low = 4, high = 8}\n",
            ),
            "vendor.load_curve.every_s",
        ),
        (
            ("limit = 10\n", "limit = 10\nwindow = \"rolling\"\n"),
            "unknown variant `rolling`",
        ),
        (
            ("limit = 10\n", "limit = 10\nretry_after_ms = 0\n"),
            "vendor.retry_after_ms",
        ),
        (("limit = 10\n", "limit = 0\n"), "vendor.limit"),
    ] {
        let text = replace_last(&good, change.0, change.1);
        assert_ne!(text, good, "{change:?} changed nothing");
        let error = parse(&text).expect_err("refused").to_string();
        assert!(error.contains(says), "{change:?}: {error}");
    }
    // Only a rate limit learns; pausing alone works on any limit.
    let concurrency = good.replace(
        "kind = \"rate\"\nlimit = 20\nperiod_ms = 1000\nalgorithm = \"sliding\"",
        "kind = \"concurrency\"\nlimit = 20\nlease_ttl_ms = 30000",
    );
    assert_ne!(concurrency, good);
    let error = parse(&concurrency).expect_err("refused").to_string();
    assert!(
        error.contains("vendor.guarded_by: limit \"vendor-x\" cannot learn"),
        "{error}"
    );
    parse(&concurrency.replace("learn = true", "learn = false")).expect("pausing only");
}

/// `text` with the last `from` replaced: the vendor's fields come last in these workloads.
fn replace_last(text: &str, from: &str, to: &str) -> String {
    match text.rfind(from) {
        Some(at) => format!("{}{to}{}", &text[..at], &text[at + from.len()..]),
        None => text.to_owned(),
    }
}
