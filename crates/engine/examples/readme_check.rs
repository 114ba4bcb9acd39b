// crates/engine/examples/readme_check.rs: run with `cargo run -p tollgate --example readme_check`
use tollgate::{Algorithm, Check, Limit, Limiter, Policy, Priority, Request, Reserve};

#[tokio::main]
async fn main() -> Result<(), tollgate::Error> {
    let limiter = Limiter::in_memory();
    let policy = Policy::rate(
        100,
        60_000_000,
        0,
        Algorithm::Gcra { burst: 10 },
        Reserve::default(),
    )?;
    limiter.set_limit(Limit::new("vendor-x", policy, None)?);
    limiter.set_limit(Limit::new("api", policy, Some("user"))?); // counted per user

    match limiter.check(&Request::new("vendor-x")).await? {
        Check::Allowed(statuses) => println!("go; {} left", statuses[0].remaining),
        Check::Denied(denied) => println!("come back in {:?}", denied.retry_after),
    }
    let per_user = limiter.handle("api")?;
    let allowed = per_user.check(Some("user-42"), 1, Priority::Normal).await?;
    println!("user-42 allowed: {}", allowed.is_allowed());
    // On the memory store the same decision needs no executor: `None` only when it must wait
    // for a remote store (then `check` above is the way).
    if let Some(on_the_spot) = per_user.check_now(Some("user-42"), 1, Priority::Normal) {
        println!("user-42 allowed again: {}", on_the_spot?.is_allowed());
    }
    Ok(())
}
