// crates/engine/examples/readme_library.rs: run with `cargo run -p tollgate --example readme_library`
use std::time::Duration;

use tollgate::{Algorithm, Limit, Limiter, Policy, Priority, Request, Reserve};

#[tokio::main]
async fn main() -> Result<(), tollgate::Error> {
    let limiter = Limiter::in_memory();
    // 10 calls per second in any second; the last 2 are kept for high-priority calls.
    let reserve = Reserve { high: 2, normal: 0 };
    let policy = Policy::rate(10, 1_000_000, 0, Algorithm::Sliding, reserve)?;
    limiter.set_limit(Limit::new("vendor-x", policy, None)?);

    let request = Request::new("vendor-x")
        .priority(Priority::Low)
        .wait(Duration::from_secs(5));
    if let Some(permit) = limiter.acquire(&request).await?.granted() {
        println!("calling vendor-x");
        permit.commit(1).await?; // one unit used; a permit dropped uncommitted keeps all its units
    }
    // The vendor answered 429 "retry after 15 s": every caller of the limit waits.
    limiter
        .pause("vendor-x", None, Duration::from_secs(15))
        .await?;
    Ok(())
}
