//! The store conformance suite on Redis: two stores (two connections) on one namespace, as two
//! processes would be.

mod common;

use std::sync::Arc;

use tollgate_conformance::Stores;

async fn redis_stores(test: &'static str) -> Option<Stores> {
    let url = common::redis_url(test)?;
    let namespace = common::namespace(test);
    common::declare_fresh(&url, &namespace).await;
    Some(Stores {
        first: Arc::new(common::connect(&url, &namespace).await),
        second: Arc::new(common::connect(&url, &namespace).await),
    })
}

tollgate_conformance::conformance_tests!(redis_stores);
