//! The judging mock vendor (`tests/common/judge.rs`, also `tollgate-mock-vendor`): its
//! admissions and report on arrivals placed exactly by hand, and over HTTP its 429s, its
//! endpoints and its rate-limit headers, read back through `read_advice` so that what it
//! writes and what the clients read agree.

mod common;

use std::time::{Duration, SystemTime};

use common::judge::{
    Answered, Judge, JudgeConfig, JudgeVendor, Window, advice_headers, go_duration, parse_args,
    rfc3339_ms,
};
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use tollgate_dispatch::{AdvisedQuota, Family, read_advice};

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn judge(limit: u64, period_ms: u64, window: Window) -> Judge {
    Judge::new(JudgeConfig::new(limit, ms(period_ms), window))
}

/// Ten calls in the first 10 ms, then an eleventh `at_ms`.
fn eleven_calls(at_ms: u64) -> Value {
    let mut judge = judge(10, 1000, Window::Sliding);
    for at in 0..10 {
        assert!(judge.arrive(ms(at)).admitted, "call at {at} ms");
    }
    judge.arrive(ms(at_ms));
    judge.report()
}

#[test]
fn the_eleventh_call_just_inside_the_window_is_counted_in_it() {
    let report = eleven_calls(999);
    assert_eq!(report["most_in_any_window"], 11, "{report}");
    assert_eq!(report["windows_over"], 1, "{report}");
    assert_eq!(
        (report["ok"].clone(), report["limited"].clone()),
        (json!(10), json!(1))
    );
}

#[test]
fn the_eleventh_call_just_outside_the_window_is_not() {
    // The window before an arrival at 1000 ms is (0, 1000]: the call at 0 has left it.
    let report = eleven_calls(1000);
    assert_eq!(report["most_in_any_window"], 10, "{report}");
    assert_eq!(report["windows_over"], 0, "{report}");
    assert_eq!(report["ok"], 11, "the sliding window admitted it: {report}");
}

#[test]
fn a_fixed_window_admits_a_burst_across_its_edge_that_a_sliding_one_refuses() {
    let arrivals = [900, 950, 1000, 1050];
    let mut fixed = judge(2, 1000, Window::Fixed);
    let fixed_admitted: Vec<bool> = arrivals
        .iter()
        .map(|at| fixed.arrive(ms(*at)).admitted)
        .collect();
    assert_eq!(fixed_admitted, [true, true, true, true]);
    let report = fixed.report();
    assert_eq!(report["most_in_fixed_window"], 2, "{report}");
    assert_eq!(report["most_in_any_window"], 4, "{report}");
    assert_eq!(report["windows_over"], 2, "{report}");

    let mut sliding = judge(2, 1000, Window::Sliding);
    let answers: Vec<Answered> = arrivals.iter().map(|at| sliding.arrive(ms(*at))).collect();
    let admitted: Vec<bool> = answers.iter().map(|answer| answer.admitted).collect();
    assert_eq!(admitted, [true, true, false, false]);
    // At 1000 ms the call at 900 ms comes back at 1900 ms.
    assert_eq!(answers[2].reset, ms(900));
    assert_eq!(answers[2].retry_after_s, Some(1));
    assert_eq!(answers[3].reset, ms(850));
    // The fixed window's reset is its end.
    let mut fixed = judge(2, 1000, Window::Fixed);
    fixed.arrive(ms(100));
    fixed.arrive(ms(200));
    let refused = fixed.arrive(ms(300));
    assert!(!refused.admitted);
    assert_eq!(refused.reset, ms(700));
}

#[test]
fn remaining_and_reset_follow_the_oldest_call_in_a_sliding_window() {
    let mut judge = judge(3, 1000, Window::Sliding);
    let first = judge.arrive(ms(0));
    assert_eq!((first.remaining, first.reset), (2, ms(1000)));
    let second = judge.arrive(ms(100));
    assert_eq!((second.remaining, second.reset), (1, ms(900)));
    let third = judge.arrive(ms(400));
    assert_eq!(
        (third.remaining, third.reset),
        (0, ms(600)),
        "full: the oldest comes back"
    );
    let refused = judge.arrive(ms(500));
    assert_eq!((refused.admitted, refused.reset), (false, ms(500)));
}

#[test]
fn a_limit_change_mid_run_is_judged_from_then_on() {
    let mut judge = judge(5, 1000, Window::Sliding);
    for at in 0..5 {
        assert!(judge.arrive(ms(at)).admitted);
    }
    judge.set_limit(ms(10), 3);
    let refused = judge.arrive(ms(20));
    assert!(!refused.admitted);
    assert_eq!(refused.limit, 3);
    // Two of the five are still in the window at 1002 ms (3 and 4 ms): a third fits.
    let admitted = judge.arrive(ms(1002));
    assert_eq!(
        (admitted.admitted, admitted.remaining),
        (true, 0),
        "{admitted:?}"
    );
    let report = judge.report();
    assert_eq!(
        report["limit_changes"],
        json!([{"at_ms": 10.0, "limit": 3}]),
        "{report}"
    );
    // The five under the old limit were not over; under the new one the sixth was, and so
    // was the seventh (the refused call at 20 ms is an arrival in its window too).
    assert_eq!(report["windows_over"], 2, "{report}");
    // 5 per second for 10 ms, then 3 per second for 992 ms.
    let capacity = report["capacity"].as_f64().expect("capacity");
    assert!((capacity - (0.05 + 2.976)).abs() < 1e-9, "{report}");
    let used = report["used_share"].as_f64().expect("used_share");
    assert!((used - 6.0 / capacity).abs() < 1e-9, "{report}");
}

#[test]
fn a_reset_forgets_everything_and_restores_the_limit() {
    let mut judge = judge(2, 1000, Window::Sliding);
    judge.arrive(ms(0));
    judge.set_limit(ms(1), 1);
    judge.reset();
    let report = judge.report();
    assert_eq!(report["calls"], 0, "{report}");
    assert_eq!(report["limit_changes"], json!([]));
    assert_eq!(report["used_share"], Value::Null, "no capacity yet");
    assert_eq!(judge.arrive(ms(0)).limit, 2);
}

#[test]
fn go_durations_are_written_as_go_writes_them() {
    for (ms, text) in [
        (0, "0s"),
        (20, "20ms"),
        (850, "850ms"),
        (1000, "1s"),
        (1200, "1.2s"),
        (1005, "1.005s"),
        (360_000, "6m0s"),
        (3_723_500, "1h2m3.5s"),
    ] {
        assert_eq!(go_duration(ms), text);
    }
}

#[test]
fn rfc3339_instants_are_written_in_utc_with_milliseconds() {
    assert_eq!(rfc3339_ms(1_795_910_310_250), "2026-11-28T23:58:30.250Z");
    assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339_ms(1_835_395_200_000), "2028-02-29T00:00:00.000Z");
}

fn header_map(pairs: &[(&'static str, String)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(
            HeaderName::from_static(name),
            HeaderValue::from_str(value).expect("a header value"),
        );
    }
    headers
}

#[test]
fn every_family_written_is_read_back_exactly() {
    let now = SystemTime::UNIX_EPOCH + ms(1_795_910_310_250);
    let answered = Answered {
        admitted: true,
        limit: 7,
        remaining: 3,
        reset: Duration::from_micros(1_234_400),
        retry_after_s: None,
    };
    for family in Family::ALL {
        let headers = header_map(&advice_headers(family, &answered, ms(60_000), now));
        let advice = read_advice(&headers, now).expect("advice");
        assert_eq!(advice.family, family);
        let window = (family == Family::Ietf).then_some(ms(60_000));
        assert_eq!(
            advice.quotas,
            [AdvisedQuota { quota: 7, window }],
            "{family:?}"
        );
        assert_eq!(advice.remaining, Some(3), "{family:?}");
        // Rounded up to the family's unit: never earlier than the truth.
        let reset = match family {
            Family::OpenAi | Family::Anthropic => ms(1235),
            Family::GitHub => ms(1750), // 23:58:31.484 rounded up to :32
            Family::Ietf | Family::IetfDraft => ms(2000),
        };
        assert_eq!(advice.reset, Some(reset), "{family:?}");
    }
    // A period that is not whole seconds is advertised without a window.
    let headers = header_map(&advice_headers(Family::Ietf, &answered, ms(1500), now));
    let advice = read_advice(&headers, now).expect("advice");
    assert_eq!(advice.quotas[0].window, None);
}

#[test]
fn the_command_line_is_read_and_bad_flags_are_named() {
    let args = |text: &str| text.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let (listen, config) = parse_args(&args(
        "--listen 127.0.0.1:0 --limit 5 --period-ms 250 --window fixed --headers github --retry-after-s 3",
    ))
    .expect("valid flags");
    assert_eq!(listen, "127.0.0.1:0");
    assert_eq!(
        (config.limit, config.period, config.window),
        (5, ms(250), Window::Fixed)
    );
    assert_eq!(
        (config.headers, config.retry_after_s),
        (Some(Family::GitHub), Some(3))
    );
    let (_, config) = parse_args(&args("--headers=none --limit=2")).expect("= forms");
    assert_eq!((config.headers, config.limit), (None, 2));
    for (bad, named) in [
        ("--limit 0", "--limit"),
        ("--limit ten", "--limit"),
        ("--period-ms 0", "--period-ms"),
        ("--window tumbling", "--window"),
        ("--headers stripe", "--headers"),
        ("--limit", "--limit"),
        ("--speed 3", "--speed"),
    ] {
        let error = parse_args(&args(bad)).expect_err(bad);
        assert!(error.starts_with(named), "{bad}: {error}");
    }
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, HeaderMap, String) {
    let response = client.get(url).send().await.expect("the vendor answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.expect("a body"))
}

async fn report(client: &reqwest::Client, vendor: &JudgeVendor) -> Value {
    let (status, _, body) = get(client, &vendor.url("/_vendor/report")).await;
    assert_eq!(status, 200);
    serde_json::from_str(&body).expect("the report is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_limit_the_vendor_answers_429_with_retry_after() {
    let vendor = JudgeVendor::start(JudgeConfig::new(2, ms(3000), Window::Sliding)).await;
    let client = reqwest::Client::new();
    let url = vendor.url("/v1/anything?x=1");
    for _ in 0..2 {
        let (status, headers, body) = get(&client, &url).await;
        assert_eq!((status, body.as_str()), (200, "ok"));
        assert!(headers.get("retry-after").is_none());
        assert!(headers.get("ratelimit").is_none(), "--headers none");
    }
    let (status, headers, body) = get(&client, &url).await;
    assert_eq!((status, body.as_str()), (429, "rate limited"));
    // The first call comes back a little under 3 s from now: rounded up, 3.
    assert_eq!(headers["retry-after"], "3");

    let report = report(&client, &vendor).await;
    let keys: Vec<&str> = report
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = [
        "calls",
        "ok",
        "limited",
        "most_in_any_window",
        "most_in_fixed_window",
        "windows_over",
        "capacity",
        "used_share",
        "limit_changes",
        "arrivals_ms",
    ];
    expected.sort_unstable();
    assert_eq!(keys, expected, "{report}");
    assert_eq!(
        (report["calls"].clone(), report["ok"].clone()),
        (json!(3), json!(2))
    );
    assert_eq!(report["limited"], 1);
    assert_eq!(report["most_in_any_window"], 3);
    assert_eq!(report["most_in_fixed_window"], 3);
    assert_eq!(report["windows_over"], 1);
    assert!(report["capacity"].is_f64(), "{report}");
    assert!(
        report["used_share"]
            .as_f64()
            .is_some_and(|share| share > 0.0),
        "{report}"
    );
    let arrivals = report["arrivals_ms"].as_array().expect("arrivals");
    assert_eq!(arrivals.len(), 3);
    assert!(
        arrivals
            .windows(2)
            .all(|pair| pair[0].as_f64() <= pair[1].as_f64()),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_retry_after_is_sent_when_configured() {
    let mut config = JudgeConfig::new(1, ms(60_000), Window::Fixed);
    config.retry_after_s = Some(7);
    let vendor = JudgeVendor::start(config).await;
    let client = reqwest::Client::new();
    assert_eq!(get(&client, &vendor.url("/")).await.0, 200);
    let (status, headers, _) = get(&client, &vendor.url("/")).await;
    assert_eq!(
        (status, &headers["retry-after"]),
        (429, &HeaderValue::from(7))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_changes_through_the_vendor_endpoint_and_reset_forgets() {
    let vendor = JudgeVendor::start(JudgeConfig::new(5, ms(60_000), Window::Sliding)).await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: &'static str| {
        client
            .post(vendor.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(get(&client, &vendor.url("/call")).await.0, 200);
    for (body, named) in [
        ("{\"limit\": 0}", "limit"),
        ("{\"limit\": \"2\"}", "limit"),
        ("{}", "limit"),
        ("{\"limit\": 2, \"extra\": 1}", "extra"),
        ("not json", "body"),
    ] {
        let response = post("/_vendor/limit", body).await.expect("answer");
        assert_eq!(response.status(), 400, "{body}");
        let text = response.text().await.expect("a body");
        assert!(text.starts_with(named), "{body}: {text}");
    }
    let response = post("/_vendor/limit", "{\"limit\": 2}")
        .await
        .expect("answer");
    assert_eq!(response.status(), 200);
    assert_eq!(get(&client, &vendor.url("/call")).await.0, 200);
    let (status, headers, _) = get(&client, &vendor.url("/call")).await;
    assert_eq!(status, 429, "the new limit is in force");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(get(&client, &vendor.url("/_vendor/other")).await.0, 404);

    let report = report(&client, &vendor).await;
    assert_eq!(
        report["calls"], 3,
        "vendor endpoints are not calls: {report}"
    );
    let changes = report["limit_changes"].as_array().expect("changes");
    assert_eq!(changes.len(), 1, "{report}");
    assert_eq!(changes[0]["limit"], 2);

    let response = post("/_vendor/reset", "").await.expect("answer");
    assert!(response.status().is_success());
    let report_after = self::report(&client, &vendor).await;
    assert_eq!(report_after["calls"], 0, "{report_after}");
    assert_eq!(get(&client, &vendor.url("/call")).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_on_the_wire_reads_back_through_read_advice() {
    for family in Family::ALL {
        let mut config = JudgeConfig::new(2, ms(2000), Window::Sliding);
        config.headers = Some(family);
        let vendor = JudgeVendor::start(config).await;
        let client = reqwest::Client::new();
        let url = vendor.url("/call");

        let (status, headers, _) = get(&client, &url).await;
        assert_eq!(status, 200);
        let advice = read_advice(&headers, SystemTime::now()).expect("advice");
        assert_eq!(advice.family, family);
        let window = (family == Family::Ietf).then_some(ms(2000));
        assert_eq!(
            advice.quotas,
            [AdvisedQuota { quota: 2, window }],
            "{family:?}"
        );
        assert_eq!(advice.remaining, Some(1), "{family:?}");
        let reset = advice.reset.expect("a reset");
        // The only call comes back a period after it arrived; whole-second families round
        // the instant up.
        assert!(
            reset > ms(1000) && reset <= ms(3000),
            "{family:?}: {reset:?}"
        );

        assert_eq!(get(&client, &url).await.0, 200);
        let (status, headers, _) = get(&client, &url).await;
        assert_eq!(status, 429, "{family:?}");
        let advice = read_advice(&headers, SystemTime::now()).expect("advice on a 429");
        assert_eq!((advice.family, advice.remaining), (family, Some(0)));
        let reset = advice.reset.expect("a reset on a 429");
        assert!(reset <= ms(3000), "{family:?}: {reset:?}");
        let retry_after: u64 = headers["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        assert_eq!(retry_after, 2, "{family:?}: a little under 2 s, rounded up");
    }
}
