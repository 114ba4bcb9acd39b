//! `Permit`, the guard over a grant: its parts, and settling them (commit, release, renew,
//! detach, and the release of leases on drop); `Limiter::commit` and `renew` settle by id
//! through the same functions.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::Committed;

use crate::error::{Error, Result};
use crate::permit_id::{LimitStatus, Part, PermitId, encode};
use crate::store::{CounterId, Take};

use super::{Shared, micros};

/// What a commit says was used: the same on every rate limit, or per limit by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Used<'a> {
    All(u64),
    /// Each rate limit of the permit, by name, once: requests, input tokens and output tokens
    /// that were taken at different costs. Leases are released whether named or not.
    Each(&'a [(&'a str, u64)]),
}

impl Used<'_> {
    /// Every rate limit of `parts` (all of a permit's) named once, and nothing else named,
    /// checked before anything is settled: a commit that names a wrong limit gives nothing back.
    pub(super) fn check<'p>(self, parts: impl Iterator<Item = &'p Part> + Clone) -> Result<()> {
        let Used::Each(each) = self else {
            return Ok(());
        };
        for (index, (name, _)) in each.iter().enumerate() {
            if each[..index].iter().any(|(earlier, _)| earlier == name) {
                return Err(Error::invalid(
                    "used",
                    format!("limit {name:?} is named twice"),
                ));
            }
            if !parts.clone().any(|part| &*part.limit == *name) {
                return Err(Error::invalid(
                    "used",
                    format!("limit {name:?} is not in this permit"),
                ));
            }
        }
        if let Some(part) = parts
            .clone()
            .find(|part| !part.lease && !each.iter().any(|(name, _)| *name == &*part.limit))
        {
            return Err(Error::invalid(
                "used",
                format!(
                    "name every rate limit of the permit: {:?} is missing",
                    &*part.limit
                ),
            ));
        }
        Ok(())
    }

    fn of(self, part: &Part) -> u64 {
        match self {
            Used::All(used) => used,
            Used::Each(each) => each
                .iter()
                .find(|(name, _)| *name == &*part.limit)
                .map_or(0, |(_, used)| *used),
        }
    }
}

/// Settle every part in turn, whatever the others answer; the totals, or the first error. The
/// caller checked `used` against the whole permit (`Used::check`).
pub(super) async fn settle_parts<'a>(
    shared: &Shared,
    parts: impl Iterator<Item = &'a Part>,
    used: Used<'_>,
) -> Result<Committed> {
    let mut total = Committed {
        refunded: 0,
        released: 0,
    };
    let mut first_error = None;
    for part in parts {
        match settle_part(shared, part, used.of(part)).await {
            Ok(committed) => {
                total.refunded += committed.refunded;
                total.released += committed.released;
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(total), Err)
}

async fn settle_part(shared: &Shared, part: &Part, used: u64) -> Result<Committed> {
    let table = shared.table();
    let Some(limit) = table.get(&part.limit) else {
        // The limit is gone, and with it anything its permits could give back.
        return Err(tollgate_core::PermitError::Gone.into());
    };
    let counter = CounterId {
        limit: &part.limit,
        key: part.key.as_deref(),
    };
    let take = Take {
        counter,
        policy: limit.policy(),
    };
    let committed = shared.store.commit(take, part.seq, used).await?;
    if committed.refunded > 0 || committed.released > 0 {
        shared.waiters.wake_head(counter);
    }
    Ok(committed)
}

pub(super) async fn renew_parts(
    shared: &Shared,
    parts: impl Iterator<Item = &Part>,
) -> Result<Duration> {
    let table = shared.table();
    let mut earliest: Option<u64> = None;
    for part in parts.filter(|part| part.lease) {
        let limit = table
            .get(&part.limit)
            .ok_or(Error::from(tollgate_core::PermitError::LeaseExpired))?;
        let take = Take {
            counter: CounterId {
                limit: &part.limit,
                key: part.key.as_deref(),
            },
            policy: limit.policy(),
        };
        let renewed = shared.store.renew(take, part.seq).await?;
        earliest = Some(earliest.map_or(renewed.expires_in_us, |e| e.min(renewed.expires_in_us)));
    }
    earliest
        .map(Duration::from_micros)
        .ok_or(Error::from(tollgate_core::PermitError::WrongKind))
}

#[derive(Debug)]
pub(super) struct GrantedPart {
    pub(super) part: Part,
    /// False for a rate part granted not refundable: nothing recorded, nothing to refund.
    pub(super) refundable: bool,
    pub(super) remaining: u64,
    pub(super) reset_after_us: u64,
    pub(super) lease_expires_in_us: Option<u64>,
}

/// A grant on one or more limits.
///
/// Rate units count as used from the grant; `commit(used)` gives back the ones not used.
/// Dropping a permit without committing keeps every rate unit used (the calls may have
/// happened) and **releases its leases** (whoever held the guard no longer holds the resource),
/// at once for an in-process store, or from a spawned task for a remote one; with no runtime
/// to spawn on, the lease runs out at its TTL. To keep a lease beyond the guard, `detach` it.
#[must_use = "a permit holds units or a lease; commit or release it when the work is done"]
#[derive(Debug)]
pub struct Permit {
    pub(super) shared: Arc<Shared>,
    /// One part inline: most permits are for one limit, and a permit is moved several times on
    /// its way to the caller, so its size is paid on every grant.
    pub(super) parts: SmallVec<[GrantedPart; 1]>,
    pub(super) decided_at_us: u64,
    pub(super) settled: bool,
}

impl Permit {
    /// The text form, to commit, renew or release from elsewhere (`Limiter::commit`).
    pub fn id(&self) -> PermitId {
        let parts = self.parts.iter().map(|granted| &granted.part);
        encode(&self.shared.config.permit_secret, parts)
    }

    /// Per limit: what remains, when it resets, and the lease's fence and expiry.
    pub fn limits(&self) -> Vec<LimitStatus> {
        self.parts
            .iter()
            .map(|granted| LimitStatus {
                name: granted.part.limit.to_string(),
                remaining: granted.remaining,
                reset_after: Duration::from_micros(granted.reset_after_us),
                fence: granted.part.lease.then_some(granted.part.seq),
                lease_expires_in: granted.lease_expires_in_us.map(Duration::from_micros),
            })
            .collect()
    }

    /// When the store granted it, in microseconds on the store's clock (Redis `TIME`, or the
    /// memory store's clock): the time limits count it at.
    pub fn decided_at_us(&self) -> u64 {
        self.decided_at_us
    }

    /// The fencing token of the first lease in this permit.
    pub fn fence(&self) -> Option<u64> {
        self.parts
            .iter()
            .find(|granted| granted.part.lease)
            .map(|granted| granted.part.seq)
    }

    /// Done: `used` units of each rate limit were used (the rest are refunded) and leases are
    /// released. Once per permit, which the move enforces. Every part is settled even when an
    /// earlier one fails (a lease left behind would hold its slot until its TTL); the first
    /// error is returned.
    pub async fn commit(self, used: u64) -> Result<Committed> {
        self.commit_used(Used::All(used)).await
    }

    /// `commit` with what was used of each rate limit, by name (`Used::Each`): for a permit
    /// granted a cost per limit (`Request::costs`). A wrong or missing name settles nothing:
    /// the permit is dropped uncommitted (its rate units stay used, its leases are released),
    /// as by an id that `Limiter::commit_used` refuses, which may be committed again.
    pub async fn commit_used(mut self, used: Used<'_>) -> Result<Committed> {
        let parts = self
            .parts
            .iter()
            // A part with nothing recorded to give back: the store would only say so.
            .filter(|granted| granted.refundable || granted.part.lease)
            .map(|granted| &granted.part);
        used.check(self.parts.iter().map(|granted| &granted.part))?;
        self.settled = true;
        settle_parts(&self.shared, parts, used).await
    }

    /// Release the leases; rate units stay used. Like `commit`, every lease is released even
    /// when an earlier one fails, and the first error is returned.
    pub async fn release(mut self) -> Result<Committed> {
        self.settled = true;
        let leases = self
            .parts
            .iter()
            .filter(|granted| granted.part.lease)
            .map(|granted| &granted.part);
        let released = settle_parts(&self.shared, leases, Used::All(u64::MAX)).await?;
        Ok(Committed {
            refunded: 0,
            released: released.released,
        })
    }

    /// Extend every lease by its TTL. Returns the time until the earliest expiry.
    pub async fn renew(&mut self) -> Result<Duration> {
        let expires_in = renew_parts(&self.shared, self.parts.iter().map(|g| &g.part)).await?;
        for granted in self.parts.iter_mut().filter(|g| g.part.lease) {
            granted.lease_expires_in_us = Some(micros(expires_in));
        }
        Ok(expires_in)
    }

    /// Give up the guard, keeping every unit and lease; returns the id to settle it later.
    pub fn detach(mut self) -> PermitId {
        self.settled = true;
        self.id()
    }
}

/// Release the leases among `parts` (their rate units stay used).
async fn release_leases<'a>(shared: &Shared, parts: impl Iterator<Item = &'a Part>) {
    for part in parts.filter(|part| part.lease) {
        // Nothing to report to: a failed release leaves the lease to its TTL.
        let _ = settle_part(shared, part, 0).await;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.settled || !self.parts.iter().any(|granted| granted.part.lease) {
            return;
        }
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        let leases: Vec<Part> = self
            .parts
            .iter()
            .filter(|granted| granted.part.lease)
            .map(|granted| granted.part.clone())
            .collect();
        let shared = self.shared.clone();
        let release = async move { release_leases(&shared, leases.iter()).await };
        // An in-process store releases on the first poll; a remote one may need a runtime:
        // spawn it if it waits.
        let mut release = Box::pin(release);
        if release.as_mut().poll(&mut context).is_pending()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(release);
        }
    }
}
