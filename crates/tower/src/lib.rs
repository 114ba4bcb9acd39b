//! Inbound throttling for axum and hyper services: a tower [`ThrottleLayer`] that applies Tollgate
//! rules to each incoming request, per user and per endpoint (the throttle-table scenario,
//! docs/guarantees.md).
//!
//! For every request the layer normalizes the path with the rules crate's
//! [`normalize_path`](tollgate_rules::normalize_path) (the path the application routes:
//! percent-decoded, dot segments resolved, ids in any spelling become `#`, the query is
//! ignored; skipped when no rule in force names a path; a path that cannot be decoded is
//! answered `400 Bad Request`), finds the rules whose `match` fits the method
//! and normalized path, and asks the shared [`Limiter`](tollgate::Limiter) for one unit of all
//! of them at once, keyed by the user for rules counted `per` user. The request is granted on every matched limit or on none, so a
//! request the endpoint rule refuses spends nothing of the user's overall frequency or
//! concurrency. Requests that match no rule pass through untouched.
//!
//! The layer answers with axum's [`Body`](axum::body::Body): the service's own body, passed
//! through as it is, or, when the request holds a concurrency lease, that body with the lease
//! inside, released when the body ends, or when the request or response is dropped (a client
//! that disconnects mid-response gives its lease back). Refusals are `429 Too Many Requests` with
//! `Retry-After` and the IETF `RateLimit-Policy` / `RateLimit` fields (see [`headers`]).
//!
//! Every clone of the layer and of the service shares one state behind an `Arc`: a server
//! that clones its service per connection still enforces one limit.
//!
//! Counted by client address ([`Identity::Peer`]), a service is served with axum's connection
//! info: `axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())`.
//! An IPv6 client is counted by its /64 ([`ClientAddress`]), not by each of its addresses.

mod body;
pub mod headers;
mod identity;
mod layer;
mod metrics;
mod rules;
mod sweep;

pub use identity::{
    ClientAddress, DEFAULT_IPV6_PREFIX_LEN, IPV6_PREFIX_LEN_MAX, IPV6_PREFIX_LEN_MIN, Identity,
    IpNet, TrustedProxies, Unidentified,
};
pub use layer::{OnStoreError, ResponseFuture, Throttle, ThrottleConfig, ThrottleLayer};
pub use metrics::{RuleMetrics, ThrottleMetrics};
pub use rules::{FixedRules, ThrottleRules};
pub use sweep::spawn_sweeper;
