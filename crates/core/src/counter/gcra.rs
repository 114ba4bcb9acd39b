//! GCRA: a theoretical arrival time, the end of the backlog of granted units at one emission
//! interval each. Every admission is `gcra_admit`, on that one number; this file owns it and the
//! rest of GCRA's arithmetic (room, refunds, carrying units over); `mod.rs` calls it for a
//! `Body::Gcra`.

use crate::policy::{Algorithm, Kind, Policy, Priority};

use super::{Body, open_for};

/// A GCRA grant worked out from the backlog's end alone (`gcra_admit`).
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraStep {
    /// The backlog's end after the grant.
    pub tat: u64,
    /// Units still open to the request's priority after the grant.
    pub remaining: u64,
    /// Time until every unit counted now stops counting.
    pub reset_after_us: u64,
}

/// GCRA admission: the grant of `cost` at `priority` on a backlog ending at `tat`, or `None`
/// when it does not fit (or the cost can never be granted, or the policy is not GCRA). Every
/// GCRA decision is this one: a counter's (`Counter::decide`) and a lock-free word's, which
/// holds nothing but `tat` (for a counter `Counter::gcra_alone` allows). The test is
/// `backlog <= (open - cost) * T`, GCRA's `max(tat, now) + cost * T <= now + open * T`.
#[inline]
pub fn gcra_admit(
    tat: u64,
    policy: &Policy,
    now: u64,
    cost: u64,
    priority: Priority,
) -> Option<GcraStep> {
    let open = open_for(policy, cost, priority).ok()?;
    let Kind::Rate(rate) = policy.kind() else {
        return None;
    };
    if !matches!(rate.algorithm(), Algorithm::Gcra { .. }) {
        return None;
    }
    let emission = rate.emission_us();
    let backlog = tat.saturating_sub(now);
    if backlog > (open - cost) * emission {
        return None;
    }
    let tat = tat.max(now) + cost * emission;
    Some(GcraStep {
        tat,
        remaining: open - backlog.div_ceil(emission) - cost,
        reset_after_us: (tat - now).min(policy.memory_us()),
    })
}

/// A GCRA body that counts `used_before` units carried over from another algorithm's, as a
/// backlog from `now`.
pub(super) fn gcra_carried(used_before: u64, emission_us: u64, now: u64) -> Body {
    Body::Gcra {
        tat: now.saturating_add(used_before.saturating_mul(emission_us)),
        emission_us,
        last_seq: 0,
    }
}

/// Units the bucket holds: the backlog in emission intervals, rounded up. A grant of `cost`
/// fits when this plus `cost` is within the burst, which is GCRA's own test
/// `max(tat, now) + cost * T <= now + burst * T`.
#[inline]
pub(super) fn gcra_used(tat: u64, emission_us: u64, now: u64) -> u64 {
    tat.saturating_sub(now).div_ceil(emission_us)
}

/// Time from `now` until `cost` more units fit under `open`.
#[inline]
pub(super) fn gcra_wait_for_room(
    tat: u64,
    emission_us: u64,
    now: u64,
    cost: u64,
    open: u64,
) -> u64 {
    // Fits once the backlog `tat - t` is at most `(open - cost) * T`.
    tat.saturating_sub((open - cost) * emission_us)
        .saturating_sub(now)
}

/// Give back `give_back` units of the grant numbered `seq`: only the newest grant can be taken
/// back exactly, as an older one's time may since have been absorbed by an idle gap (see
/// ARCHITECTURE.md). Returns the units given back.
pub(super) fn gcra_refund(
    tat: &mut u64,
    last_seq: u64,
    seq: u64,
    give_back: u64,
    emission_us: u64,
) -> u64 {
    if last_seq == seq {
        *tat = tat.saturating_sub(give_back * emission_us);
        give_back
    } else {
        0
    }
}
