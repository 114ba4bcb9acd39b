//! The script as a function library: a Redis that lost it (restarted without persistence, or
//! its functions deleted) gets it again on the next call, which still decides.

mod common;

use tollgate::{Algorithm, Limit, Policy, Request, Reserve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_function_library_is_loaded_again() {
    let Some(url) = common::redis_url("a_lost_function_library_is_loaded_again") else {
        return;
    };
    let namespace = common::namespace("library");
    common::declare_fresh(&url, &namespace).await;
    let store = std::sync::Arc::new(common::connect(&url, &namespace).await);
    let Some(library) = store.function_library().map(str::to_owned) else {
        eprintln!(
            "SKIPPED a_lost_function_library_is_loaded_again: this Redis refused FUNCTION LOAD"
        );
        return;
    };
    let limiter = common::limiter_on(store.clone());
    let policy =
        Policy::rate(3, 60_000_000, 0, Algorithm::Sliding, Reserve::default()).expect("valid");
    limiter.set_limit(Limit::new("vendor", policy, None).expect("valid"));
    let mut connection = common::raw_connection(&url).await;
    for _ in 0..3 {
        // Other tests on this Redis may load it again at any moment: deleting is best effort.
        let _: Result<(), _> = redis::cmd("FUNCTION")
            .arg("DELETE")
            .arg(&library)
            .query_async(&mut connection)
            .await;
        assert!(
            limiter
                .try_acquire(&Request::new("vendor"))
                .await
                .expect("the store loads the library again and answers")
                .is_granted()
        );
    }
    // The limit still holds across the reloads: its state is in keys, not in the library.
    assert!(
        !limiter
            .try_acquire(&Request::new("vendor"))
            .await
            .expect("answers")
            .is_granted()
    );
}
