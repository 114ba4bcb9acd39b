//! Token budgets for language-model APIs: one grant over requests per period, input tokens and
//! output tokens before a request goes, settled as the answer comes.
//!
//! - [`Api`] and [`estimate`]: which API a request speaks (by its path) and what it may cost,
//!   read from its JSON body before it is sent (`estimate.rs`).
//! - [`UsageReader`]: the answer read as it passes, JSON or server-sent events, for what the
//!   vendor reports it used and what has streamed so far (`usage.rs`).
//! - [`TokenBudget`] and [`Metered`]: the grant on a Tollgate server, top-ups while a stream
//!   outruns its estimate, debts, and the settlement of every way an answer can end
//!   (`budget.rs`). [`TokenBudget::send`] does all of it for a `reqwest` request.

mod budget;
mod estimate;
mod usage;

pub use budget::{BudgetLimits, BudgetStats, Metered, Reservation, TokenBudget};
pub use estimate::{Api, Estimate, EstimateConfig, estimate};
pub use usage::{Usage, UsageReader};
