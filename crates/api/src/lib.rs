//! The HTTP API v1 wire contract, written once: every body the server reads and answers, the
//! error codes, the denial reasons and the rule as written. The server answers with these
//! types; dispatch's remote quota, the `tollgate` commands and the tower layer read and write
//! them; the Python and TypeScript clients are held to the OpenAPI document they derive
//! (feature `openapi`, module `schema`).
//!
//! This crate knows no HTTP status and decides nothing: which status goes with which code, and
//! what a field's value means to the engine, belong to the server and the rules. Requests
//! refuse unknown fields; answers do not, so that a client reads a newer server's answer.

pub mod admin;
pub mod data;
pub mod error;
mod number;
pub mod ops;
pub mod reason;
pub mod rule;
#[cfg(feature = "openapi")]
pub mod schema;
pub mod stats;

pub use error::{Code, ErrorBody, ErrorDetail};
pub use reason::Reason;
pub use rule::{RawMatch, RawReserve, RawRule};

/// A `Duration` as the wire's whole milliseconds, rounded up: a wait or a reset answered early
/// would be retried too soon.
pub fn ms_ceil(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX)
}
