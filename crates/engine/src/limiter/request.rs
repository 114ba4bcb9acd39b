//! What a caller asks (`Request`) and what it is answered: a permit or a denial (`Outcome`),
//! or, without a permit, `Check` with a `Status` per limit. `Answer` turns one decision into
//! either.

use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{DenyReason, Priority};

use crate::error::{Error, Result};
use crate::limits::Limit;
use crate::permit_id::LimitStatus;
use crate::store::{Costs, CounterOutcome, Decision};

use super::{Limiter, Permit, QueueFull, Resolved};

/// A request for units of one or more limits, granted on all of them or none.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// Inline up to four: the throttle-table scenario's chain of three allocates nothing.
    pub(super) limits: SmallVec<[&'a str; 4]>,
    pub(super) key: Option<&'a str>,
    pub(super) cost: u64,
    /// A cost per limit, in `limits`' order, where they differ (`costs`); empty: `cost` on
    /// every limit.
    pub(super) costs: SmallVec<[u64; 4]>,
    pub(super) priority: Priority,
    pub(super) wait: Duration,
    pub(super) refundable: bool,
}

impl<'a> Request<'a> {
    /// One unit of `limit`, at normal priority, not waiting.
    pub fn new(limit: &'a str) -> Request<'a> {
        Request::all(&[limit])
    }

    /// One unit of every limit in `limits`, granted on all or none.
    pub fn all(limits: &[&'a str]) -> Request<'a> {
        Request {
            limits: SmallVec::from_slice(limits),
            key: None,
            cost: 1,
            costs: SmallVec::new(),
            priority: Priority::Normal,
            wait: Duration::ZERO,
            refundable: true,
        }
    }

    /// The key for limits counted `per` key (ignored by the others).
    pub fn key(mut self, key: &'a str) -> Request<'a> {
        self.key = Some(key);
        self
    }

    /// Units to take of every limit (default 1).
    pub fn cost(mut self, cost: u64) -> Request<'a> {
        self.cost = cost;
        self.costs.clear();
        self
    }

    /// Units to take of each limit, in the order the limits were named: one request's
    /// requests, input tokens and output tokens, granted all or none in one decision. One
    /// cost per limit, each 1 to `UNITS_MAX`; a request with any other number of costs is
    /// refused (field `costs`).
    pub fn costs(mut self, costs: &[u64]) -> Request<'a> {
        self.costs = SmallVec::from_slice(costs);
        self
    }

    /// What is asked of each limit, in order.
    pub(super) fn costs_asked(&self) -> Costs<'_> {
        if self.costs.is_empty() {
            Costs::Same(self.cost)
        } else {
            Costs::Each(&self.costs)
        }
    }

    pub fn priority(mut self, priority: Priority) -> Request<'a> {
        self.priority = priority;
        self
    }

    /// How long to wait for a grant (capped by `LimiterConfig::wait_max`). Zero: answer now.
    pub fn wait(mut self, wait: Duration) -> Request<'a> {
        self.wait = wait;
        self
    }

    /// Whether the permit's rate units may be given back by `commit(used)` (the default).
    /// `refundable(false)` is for callers that never commit for a refund, a plain "may I go
    /// now": the store need not record the reservation, which makes the counter smaller and
    /// the decision cheaper. The units count the same either way; committing such a permit
    /// refunds nothing (and by id it is `Gone`), and its leases are leases as always.
    pub fn refundable(mut self, refundable: bool) -> Request<'a> {
        self.refundable = refundable;
        self
    }
}

/// What `Limiter::charge` counted on one limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charged {
    pub name: String,
    /// Units counted: the charge, less what would have put the counter more than one capacity
    /// past its limit.
    pub charged: u64,
    /// The counter after the charge.
    pub usage: crate::store::Usage,
}

/// A request not granted within its wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    /// When to try again: exact if nothing else changes.
    pub retry_after: Duration,
    pub reason: DenyReason,
    pub limits: Vec<LimitStatus>,
    /// Set when the request asked to wait but a cap on waiting requests was full, so it was
    /// decided at once instead.
    pub not_queued: Option<QueueFull>,
    /// A `Capacity` denial on a limit that is not used up: the units it has left are kept by
    /// its `reserve` for higher priorities than the request's.
    pub kept: Option<Kept>,
}

/// Units a limit has left but keeps for higher priorities (its `reserve`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub limit: String,
    /// Units left unused to every priority (at most what the reserve keeps from the request's).
    pub left: u64,
}

/// The answer to an acquire.
#[must_use]
#[derive(Debug)]
pub enum Outcome {
    Granted(Permit),
    Denied(Denied),
}

impl Outcome {
    pub fn is_granted(&self) -> bool {
        matches!(self, Outcome::Granted(_))
    }

    pub fn granted(self) -> Option<Permit> {
        match self {
            Outcome::Granted(permit) => Some(permit),
            Outcome::Denied(_) => None,
        }
    }
}

/// One limit's state after a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Units still open to the request's priority.
    pub remaining: u64,
    /// Time until everything counted now stops counting.
    pub reset_after: Duration,
}

/// The statuses of an allowed `check`, one per limit in the request's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Statuses(pub(super) SmallVec<[Status; 2]>);

impl std::ops::Deref for Statuses {
    type Target = [Status];

    fn deref(&self) -> &[Status] {
        &self.0
    }
}

impl<'s> IntoIterator for &'s Statuses {
    type Item = &'s Status;
    type IntoIter = std::slice::Iter<'s, Status>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<Status> for Statuses {
    fn from_iter<I: IntoIterator<Item = Status>>(statuses: I) -> Statuses {
        Statuses(statuses.into_iter().collect())
    }
}

/// The answer to `Limiter::check`.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Granted and counted for good; one status per limit, in the request's order.
    Allowed(Statuses),
    Denied(Denied),
}

impl Check {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Check::Allowed(_))
    }
}

pub(super) fn status(remaining: u64, reset_after_us: u64) -> Status {
    Status {
        remaining,
        reset_after: Duration::from_micros(reset_after_us),
    }
}

/// What one decision is turned into: a permit (`try_acquire`) or an answer (`check`).
pub(super) trait Answer: Sized {
    /// Refuse what this answer cannot carry (a lease without a permit).
    fn admits(limit: &Limit) -> Result<()>;
    /// Whether the store records the grant for a refund.
    fn refundable(request: &Request<'_>) -> bool;
    fn decided(
        limiter: &Limiter,
        resolved: &Resolved<'_>,
        request: &Request<'_>,
        decision: Decision,
    ) -> Self;
    fn denied(denied: Denied) -> Self;
}

impl Answer for Outcome {
    fn admits(_: &Limit) -> Result<()> {
        Ok(())
    }

    fn refundable(request: &Request<'_>) -> bool {
        request.refundable
    }

    fn decided(
        limiter: &Limiter,
        resolved: &Resolved<'_>,
        request: &Request<'_>,
        decision: Decision,
    ) -> Outcome {
        limiter.outcome(resolved, request, decision)
    }

    fn denied(denied: Denied) -> Outcome {
        Outcome::Denied(denied)
    }
}

impl Answer for Check {
    /// `check` hands out no permit, so it cannot grant a lease.
    fn admits(limit: &Limit) -> Result<()> {
        if limit.policy().is_concurrency() {
            return Err(Error::invalid(
                "limits",
                format!(
                    "limit {:?} is a concurrency limit; its lease needs a permit (acquire)",
                    limit.name()
                ),
            ));
        }
        Ok(())
    }

    fn refundable(_: &Request<'_>) -> bool {
        false
    }

    fn decided(
        limiter: &Limiter,
        resolved: &Resolved<'_>,
        request: &Request<'_>,
        decision: Decision,
    ) -> Check {
        limiter.note_shares(resolved, request, &decision);
        if !decision.is_granted() {
            return Check::Denied(Limiter::denied(resolved, &decision));
        }
        let mut statuses = Statuses::default();
        for outcome in decision.outcomes() {
            if let CounterOutcome::Granted(grant) = outcome {
                statuses
                    .0
                    .push(status(grant.remaining, grant.reset_after_us));
            }
        }
        Check::Allowed(statuses)
    }

    fn denied(denied: Denied) -> Check {
        Check::Denied(denied)
    }
}
