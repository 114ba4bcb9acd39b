//! Concurrency: a list of leases, each `slots` held until `expires_at` unless released or
//! renewed, numbered by fencing tokens. This file owns that list's arithmetic (expiry, room,
//! grants, release, renewal); `mod.rs` calls it for a `Body::Leases`.

/// Outstanding leases per counter; a concurrency limit above this cannot be written.
pub const LEASES_MAX: u64 = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Lease {
    pub(super) fence: u64,
    pub(super) slots: u64,
    pub(super) expires_at: u64,
}

/// Drop the leases that have ended at `now`.
#[inline]
pub(super) fn leases_expire(leases: &mut Vec<Lease>, now: u64) {
    leases.retain(|lease| lease.expires_at > now);
}

#[inline]
pub(super) fn leases_used(leases: &[Lease]) -> u64 {
    leases.iter().map(|lease| lease.slots).sum()
}

/// Time from `now` until the leases ending first have freed `excess` slots.
pub(super) fn leases_wait_for_room(leases: &[Lease], now: u64, excess: u64) -> u64 {
    let mut expiries: Vec<(u64, u64)> = leases
        .iter()
        .map(|lease| (lease.expires_at, lease.slots))
        .collect();
    expiries.sort_unstable();
    let mut freed = 0;
    for (expires_at, slots) in expiries {
        freed += slots;
        if freed >= excess {
            return expires_at.saturating_sub(now);
        }
    }
    unreachable!("cost is at most the capacity, so expiring every lease makes room")
}

/// A lease of `cost` slots numbered `fence`, until `expires_at`.
#[inline]
pub(super) fn leases_grant(leases: &mut Vec<Lease>, fence: u64, cost: u64, expires_at: u64) {
    leases.push(Lease {
        fence,
        slots: cost,
        expires_at,
    });
}

/// End the lease `fence`; the slots it freed (0 when it had already ended).
pub(super) fn leases_release(leases: &mut Vec<Lease>, fence: u64) -> u64 {
    match leases.iter().position(|lease| lease.fence == fence) {
        Some(index) => leases.swap_remove(index).slots,
        None => 0,
    }
}

/// The lease `fence`, to be renewed; `None` when it has ended.
pub(super) fn leases_find(leases: &mut [Lease], fence: u64) -> Option<&mut Lease> {
    leases.iter_mut().find(|lease| lease.fence == fence)
}

/// When the last lease ends (0 for none).
#[inline]
pub(super) fn leases_counted_until(leases: &[Lease]) -> u64 {
    leases
        .iter()
        .map(|lease| lease.expires_at)
        .max()
        .unwrap_or(0)
}
