//! `tollgate simulate`: workloads are checked field by field, the shipped workloads run without
//! overdrawing a limit, the same seed gives the same report, and a run on the virtual clock
//! agrees with the same workload on the wall clock.

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

/// The virtual clock runs the same engine as the wall clock: the same workload grants the same
/// number of calls within 15 % (the wall-clock run loses a little to scheduling on a busy
/// machine), and neither overdraws the limit.
#[test]
fn a_virtual_run_agrees_with_the_wall_clock() {
    let simulated = virtual_run(SMALL);
    let workload = parse(SMALL).expect("valid");
    let real = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run(&workload, |_| {}))
        .expect("ran");
    assert!(real.overshoots().is_empty(), "{real:?}");
    let (virtual_granted, real_granted) = (granted(&simulated) as f64, granted(&real) as f64);
    let difference = (virtual_granted - real_granted).abs() / virtual_granted;
    eprintln!("granted: virtual clock {virtual_granted}, wall clock {real_granted}");
    assert!(
        difference <= 0.15,
        "virtual {virtual_granted}, wall clock {real_granted}: {:.1} % apart",
        difference * 100.0
    );
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
    let examples =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workloads");
    for name in ["bulk-and-interactive.toml", "escalating-vendor.toml"] {
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
    }
    let missing = command(directory.path())
        .args(["simulate", "nowhere.toml"])
        .output()
        .expect("runs");
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nowhere.toml"));
}
