//! Where the host's quota comes from: a [`tollgate::Limiter`] on any store (memory for one
//! process, Redis for a fleet), or a remote Tollgate server over HTTP API v1. Both give the same
//! three operations: acquire (waiting, in priority order), pause the host, and settle a permit.
//! No rate arithmetic lives here: every decision is the engine's.

use std::time::Duration;

use tokio::time::Instant;
use tollgate::{DenyReason, Limiter, Outcome, Priority, Request};

use crate::error::DispatchError;
use crate::remote::{RemotePermit, RemoteQuota};

/// The names of the host's limits in the quota source. At least one; both are taken together,
/// all or nothing, for every request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLimits {
    /// A rate limit (calls per period). Pauses go here when it is set.
    pub rate: Option<String>,
    /// A concurrency limit (requests in flight); each request holds a lease with a fence.
    pub concurrency: Option<String>,
}

impl HostLimits {
    pub(crate) fn names(&self) -> Vec<&str> {
        self.rate
            .iter()
            .chain(self.concurrency.iter())
            .map(String::as_str)
            .collect()
    }

    /// The limit a vendor's rate-limit answer pauses.
    pub(crate) fn pause_target(&self) -> Option<&str> {
        self.rate.as_deref().or(self.concurrency.as_deref())
    }
}

/// What a vendor's answer taught about the host's rate limit (see `Gate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lesson {
    pub source: String,
    pub quotas: Vec<crate::advice::AdvisedQuota>,
    pub remaining: Option<u64>,
    pub reset: Option<Duration>,
    pub rate_limited: bool,
}

/// The host's quota source.
#[derive(Clone, Debug)]
pub enum Quota {
    /// A limiter in this process, on any store.
    Local {
        limiter: Limiter,
        limits: HostLimits,
    },
    /// A Tollgate server (`tollgate serve`) shared by the fleet.
    Remote(RemoteQuota),
}

/// One acquire's answer.
#[derive(Debug)]
// Not boxed: one per attempt, moved once, never stored.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Acquired {
    Granted(QuotaPermit),
    Denied { retry_after: Duration, paused: bool },
}

#[derive(Debug)]
enum Held {
    /// The permit, and the limiter a grant-to-send delay is told to.
    Local(tollgate::Permit, Limiter),
    Remote(RemotePermit),
}

/// A grant on the host's limits: rate units, and a lease when the host has a concurrency limit.
#[derive(Debug)]
pub struct QuotaPermit {
    held: Held,
    fence: Option<u64>,
    /// When the grant was made, on this process's clock: the grant-to-send delay counts from
    /// it.
    pub(crate) granted_at: Instant,
    /// When the lease runs out unless renewed, on this process's clock (measured from the
    /// answer's arrival, so it errs early by the answer's transit).
    lease_expires_at: Option<Instant>,
}

impl QuotaPermit {
    /// The lease's fencing number, if the host has a concurrency limit.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    pub(crate) fn lease_expires_at(&self) -> Option<Instant> {
        self.lease_expires_at
    }

    /// `used` units were used: the rest of the rate units are refunded, the lease released.
    /// `sent_after`: how long after its grant the request left, reported so that the host's
    /// margin covers it.
    pub(crate) async fn commit(
        self,
        used: u64,
        sent_after: Option<Duration>,
    ) -> Result<(), DispatchError> {
        match self.held {
            Held::Local(permit, limiter) => {
                let id = permit.id();
                permit.commit(used).await?;
                if let Some(delay) = sent_after {
                    limiter.note_sent(id.as_str(), delay)?;
                }
            }
            Held::Remote(permit) => permit.commit(used, sent_after).await?,
        }
        Ok(())
    }

    /// Extend the lease. Fails when the lease expired: its fence is stale.
    pub(crate) async fn renew(&mut self) -> Result<(), DispatchError> {
        let expires_in = match &mut self.held {
            Held::Local(permit, _) => permit.renew().await?,
            Held::Remote(permit) => permit.renew().await?,
        };
        self.lease_expires_at = Some(Instant::now() + expires_in);
        Ok(())
    }
}

impl Quota {
    /// A limiter's limits; every name must be in the limiter's table now.
    pub fn limiter(limiter: Limiter, limits: HostLimits) -> Result<Quota, DispatchError> {
        check_limits(&limits)?;
        let table = limiter.limits();
        for name in limits.names() {
            let limit = table.get(name).ok_or_else(|| {
                DispatchError::Quota(tollgate::Error::UnknownLimit {
                    name: name.to_owned(),
                })
            })?;
            if limit.per().is_some() {
                return Err(DispatchError::config(
                    "limits",
                    format!("limit {name:?} counts per key; a host's limits are one counter each"),
                ));
            }
        }
        Ok(Quota::Local { limiter, limits })
    }

    /// A remote server's limits (see [`RemoteQuota::new`]).
    pub fn remote(remote: RemoteQuota) -> Quota {
        Quota::Remote(remote)
    }

    /// The names of the host's limits.
    pub fn limits(&self) -> &HostLimits {
        match self {
            Quota::Local { limits, .. } => limits,
            Quota::Remote(remote) => remote.limits(),
        }
    }

    /// Take one unit of every host limit, waiting up to `wait` in priority order.
    pub(crate) async fn acquire(
        &self,
        priority: Priority,
        wait: Duration,
    ) -> Result<Acquired, DispatchError> {
        match self {
            Quota::Local { limiter, limits } => {
                let names = limits.names();
                let request = Request::all(&names).priority(priority).wait(wait);
                match limiter.acquire(&request).await? {
                    Outcome::Granted(permit) => {
                        let status = permit.limits();
                        let lease = status.iter().find(|limit| limit.fence.is_some());
                        let fence = lease.and_then(|limit| limit.fence);
                        let lease_expires_at = lease
                            .and_then(|limit| limit.lease_expires_in)
                            .map(|expires_in| Instant::now() + expires_in);
                        Ok(Acquired::Granted(QuotaPermit {
                            held: Held::Local(permit, limiter.clone()),
                            fence,
                            granted_at: Instant::now(),
                            lease_expires_at,
                        }))
                    }
                    Outcome::Denied(denied) => Ok(Acquired::Denied {
                        retry_after: denied.retry_after,
                        paused: denied.reason == DenyReason::Paused,
                    }),
                }
            }
            Quota::Remote(remote) => match remote.acquire(priority, wait).await? {
                crate::remote::RemoteAcquired::Granted {
                    permit,
                    fence,
                    granted_at,
                    lease_expires_in,
                } => Ok(Acquired::Granted(QuotaPermit {
                    held: Held::Remote(permit),
                    fence,
                    granted_at,
                    lease_expires_at: lease_expires_in
                        .map(|expires_in| Instant::now() + expires_in),
                })),
                crate::remote::RemoteAcquired::Denied {
                    retry_after,
                    paused,
                } => Ok(Acquired::Denied {
                    retry_after,
                    paused,
                }),
            },
        }
    }

    /// Teach the host's rate limit what the vendor said (`Limiter::learn`, and a pause until
    /// the vendor's reset when it said nothing remains). Returns the pause in force after it
    /// (zero: none).
    pub(crate) async fn learn(&self, lesson: &Lesson) -> Result<Duration, DispatchError> {
        match self {
            Quota::Local { limiter, limits } => {
                let Some(target) = limits.rate.as_deref() else {
                    return Ok(Duration::ZERO);
                };
                let quotas: Vec<tollgate::AdvertisedQuota> = lesson
                    .quotas
                    .iter()
                    .map(|quota| tollgate::AdvertisedQuota {
                        quota: quota.quota,
                        window: quota.window,
                    })
                    .collect();
                limiter.learn(
                    target,
                    &tollgate::Lesson {
                        source: &lesson.source,
                        quotas: &quotas,
                        rate_limited: lesson.rate_limited,
                    },
                )?;
                match (lesson.remaining, lesson.reset) {
                    (Some(0), Some(reset)) => Ok(limiter.vendor_exhausted(target, reset).await?),
                    _ => Ok(Duration::ZERO),
                }
            }
            Quota::Remote(remote) => remote.learn(lesson).await,
        }
    }

    /// Pause the host, fleet-wide, for at least `duration`. Returns the time until the pause
    /// ends (longer if a pause already in force runs longer: pauses only extend).
    pub(crate) async fn pause(&self, duration: Duration) -> Result<Duration, DispatchError> {
        match self {
            Quota::Local { limiter, limits } => {
                let target = limits
                    .pause_target()
                    .ok_or_else(|| DispatchError::config("limits", "name at least one limit"))?;
                Ok(limiter.pause(target, None, duration).await?)
            }
            Quota::Remote(remote) => remote.pause(duration).await,
        }
    }
}

pub(crate) fn check_limits(limits: &HostLimits) -> Result<(), DispatchError> {
    if limits.names().is_empty() {
        return Err(DispatchError::config(
            "limits",
            "name a rate limit, a concurrency limit, or both",
        ));
    }
    for name in limits.names() {
        tollgate::check_limit_name(name)
            .map_err(|reason| DispatchError::config("limits", reason))?;
    }
    Ok(())
}
