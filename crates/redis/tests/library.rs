//! The script as a function library: a Redis that lost it (restarted without persistence, or
//! its functions deleted) gets it again on the next call, which still decides.

mod common;
mod nodes;

use std::sync::Arc;

use tollgate::{Algorithm, Limit, Policy, Request, Reserve};

/// Whether the Redis behind `connection` holds the function library `library` now.
async fn library_loaded(connection: &mut redis::aio::MultiplexedConnection, library: &str) -> bool {
    let listed: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(library)
        .query_async(connection)
        .await
        .expect("FUNCTION LIST answers");
    match listed {
        redis::Value::Array(libraries) => !libraries.is_empty(),
        other => panic!("FUNCTION LIST answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_function_library_is_loaded_again() {
    let Some(binary) = nodes::redis_server("a_lost_function_library_is_loaded_again") else {
        return;
    };
    // A Redis of this test's own: no other test loads the library again behind its back, so
    // each reload seen here is the store's.
    let redis = nodes::Single::start(&binary, &[]);
    let url = redis.node.url();
    let namespace = common::namespace("library");
    common::declare_fresh(&url, &namespace).await;
    let store = Arc::new(common::connect(&url, &namespace).await);
    let Some(library) = store.function_library().map(str::to_owned) else {
        tollgate::conformance::skipped(
            "a_lost_function_library_is_loaded_again: this Redis refused FUNCTION LOAD",
        );
        return;
    };
    let limiter = common::limiter_on(store.clone());
    let policy =
        Policy::rate(3, 60_000_000, 0, Algorithm::Sliding, Reserve::default()).expect("valid");
    limiter.set_limit(Limit::new("vendor", policy, None).expect("valid"));
    let mut connection = common::raw_connection(&url).await;
    for round in 0..3 {
        let deleted: String = redis::cmd("FUNCTION")
            .arg("DELETE")
            .arg(&library)
            .query_async(&mut connection)
            .await
            .unwrap_or_else(|error| panic!("round {round}: FUNCTION DELETE refused: {error}"));
        assert_eq!(deleted, "OK", "round {round}");
        assert!(
            !library_loaded(&mut connection, &library).await,
            "round {round}: still loaded after FUNCTION DELETE"
        );
        assert!(
            limiter
                .try_acquire(&Request::new("vendor"))
                .await
                .expect("the store loads the library again and answers")
                .is_granted(),
            "round {round}"
        );
        assert!(
            library_loaded(&mut connection, &library).await,
            "round {round}: the call decided without loading the library again"
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
