//! The reqwest middleware against the counting mock vendor: a reqwest user adds one layer and
//! gets the host's quota, the pause on 429, and retries; hosts without a gate pass through.

mod common;

use std::time::Duration;

use common::{Vendor, VendorRules};
use tollgate::{Algorithm, Limit, Limiter, Policy, Reserve};
use tollgate_dispatch::{
    Classifier, Gate, GateConfig, HostLimits, Priority, Quota, TollgateMiddleware,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reqwest_client_with_the_middleware_never_escalates() {
    let vendor = Vendor::start(VendorRules {
        limit: 5,
        period: Duration::from_secs(1),
        retry_after_s: 1,
        retry_after_s_max: 8,
    })
    .await;
    let limiter = Limiter::in_memory();
    // Looser than the vendor (10 vs 5 per second), so the vendor does answer 429.
    let rate =
        Policy::rate(10, 1_000_000, 0, Algorithm::Sliding, Reserve::default()).expect("rate");
    let inflight = Policy::concurrency(1, 5_000_000, Reserve::default()).expect("concurrency");
    limiter.set_limit(Limit::new("vendor", rate, None).expect("limit"));
    limiter.set_limit(Limit::new("vendor-inflight", inflight, None).expect("limit"));
    let quota = Quota::limiter(
        limiter,
        HostLimits {
            rate: Some("vendor".into()),
            concurrency: Some("vendor-inflight".into()),
        },
    )
    .expect("quota");
    let mut config = GateConfig::conservative();
    config.retries_max = 20;
    config.retry_after_ms_default = 1_000;
    let gate = Gate::new(quota, Classifier::new(), config).expect("gate");
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(TollgateMiddleware::new().host(&vendor.address.to_string(), gate.clone()))
        .build();
    let mut calls = Vec::new();
    for index in 0..20 {
        let client = client.clone();
        let url = vendor.url();
        calls.push(tokio::spawn(async move {
            let priority = if index % 5 == 0 {
                Priority::High
            } else {
                Priority::Low
            };
            client
                .get(url)
                .with_extension(priority)
                .send()
                .await
                .map(|response| response.status().as_u16())
        }));
    }
    for call in calls {
        assert_eq!(call.await.expect("task").expect("sent"), 200);
    }
    let tally = vendor.tally();
    assert!(
        tally.limited >= 1,
        "the vendor must have been provoked: {tally:?}"
    );
    assert_eq!(tally.escalations, 0, "{tally:?}");
    assert_eq!(tally.ok, 20);
    assert_eq!(
        gate.stats().sent,
        tally.calls,
        "every call went through the gate"
    );

    // A host without a gate: straight through, not counted by the gate.
    let other = Vendor::start(VendorRules {
        limit: 1_000,
        period: Duration::from_secs(1),
        retry_after_s: 1,
        retry_after_s_max: 1,
    })
    .await;
    let status = client.get(other.url()).send().await.expect("sent").status();
    assert_eq!(status, 200);
    assert_eq!(gate.stats().sent, tally.calls);
}
