// crates/dispatch/examples/readme_reqwest.rs: run with `cargo run -p tollgate-dispatch --example readme_reqwest`
use tollgate::{Algorithm, Limit, Limiter, Policy, Reserve};
use tollgate_dispatch::{Classifier, Gate, GateConfig, HostLimits, Quota, TollgateMiddleware};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The host's quota: 5 calls per second, on this process's memory store.
    let limiter = Limiter::in_memory();
    let rate = Policy::rate(5, 1_000_000, 0, Algorithm::Sliding, Reserve::default())?;
    limiter.set_limit(Limit::new("vendor", rate, None)?);
    let limits = HostLimits {
        rate: Some("vendor".into()),
        concurrency: None,
    };
    let quota = Quota::limiter(limiter, limits)?;
    let gate = Gate::new(quota, Classifier::new(), GateConfig::conservative())?;

    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(TollgateMiddleware::new().host("api.vendor.example", gate))
        .build();
    // Every call to api.vendor.example now waits for the quota, and a 429 pauses the host.
    let _ = client;
    Ok(())
}
