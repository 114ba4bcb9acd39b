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

/// The library keeps the policies it has read, by their packed numbers, from call to call, at
/// most 1,024: more limits than that, each twice over the bound, each still decides on its own
/// policy. Each pair differs only in its reserve, the last numbers of a policy, so a policy
/// known by fewer of its bytes would be taken for its neighbour's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_keeps_what_it_read_bounded_and_never_takes_one_policy_for_another() {
    let Some(binary) = nodes::redis_server(
        "the_library_keeps_what_it_read_bounded_and_never_takes_one_policy_for_another",
    ) else {
        return;
    };
    // A Redis of this test's own: its library starts with nothing kept.
    let redis = nodes::Single::start(&binary, &[]);
    let url = redis.node.url();
    let namespace = common::namespace("library-policies");
    common::declare_fresh(&url, &namespace).await;
    let store = Arc::new(common::connect(&url, &namespace).await);
    let limiter = common::limiter_on(store);
    const LIMITS: u64 = 1_100;
    let reserve = |index: u64| Reserve {
        high: index % 2,
        normal: 0,
    };
    for index in 0..LIMITS {
        let policy = Policy::rate(
            2,
            // A pair of limits, 2k and 2k + 1, differs in its reserve alone.
            60_000_000 + index / 2 * 1_000,
            0,
            // Sliding: nothing counted is forgotten within the test (a fixed window of its own
            // length could roll over mid-test).
            Algorithm::Sliding,
            reserve(index),
        )
        .expect("valid");
        limiter.set_limit(Limit::new(&format!("l{index}"), policy, None).expect("valid"));
    }
    // Twice through: the second pass reads every policy again after the first filled what the
    // library keeps past its bound.
    for pass in 0..2 {
        for index in 0..LIMITS {
            let name = format!("l{index}");
            let open = 2 - reserve(index).high;
            let granted = if pass == 0 { open } else { 0 };
            for ask in 0..=granted {
                let outcome = limiter
                    .try_acquire(&Request::new(&name).refundable(false))
                    .await
                    .expect("the store answers");
                assert_eq!(
                    outcome.is_granted(),
                    ask < granted,
                    "pass {pass}, {name} (reserve {}), ask {ask}",
                    reserve(index).high
                );
            }
        }
    }
}
