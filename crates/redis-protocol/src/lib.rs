//! The Redis store's protocol, as plain functions over slot numbers and generations: how a
//! request over several Redis Cluster slots is asked and rolled back (`plan`), when a slot's
//! state may have been lost (`loss`), and one counter's queue of waiters across the fleet
//! (`queue`). `tollgate-redis` runs them against Redis; `tollgate-model`
//! model-checks the very same functions, without building a Redis client.

pub mod loss;
pub mod plan;
pub mod queue;
