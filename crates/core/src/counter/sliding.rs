//! The sliding window: a log of at most `SLIDING_BUCKETS_MAX` buckets, each counting the units
//! granted from its opening to its stamp, every one counted until its stamp plus the window.
//! This file owns that log's arithmetic: expiry, room, grants, refunds and when it stops
//! counting; `mod.rs` calls it for a `Body::Sliding`.

use std::collections::VecDeque;

use super::Body;

/// A sliding log keeps at most this many buckets; grants closer together than
/// `window / SLIDING_BUCKETS_MAX` share a bucket stamped with the latest grant's time, which
/// counts the earlier ones a little longer than needed (never shorter). Steady-state
/// utilisation is therefore at least 64/65 of the limit, and memory per key is bounded.
pub const SLIDING_BUCKETS_MAX: u64 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Bucket {
    pub(super) opened_at: u64,
    pub(super) stamp: u64,
    pub(super) units: u64,
}

#[inline]
pub(super) fn sliding_bucket_span(policy_window_us: u64, limit: u64) -> u64 {
    if limit <= SLIDING_BUCKETS_MAX {
        // Fewer units than buckets: every grant fits a bucket of its own; stay exact.
        0
    } else {
        policy_window_us / SLIDING_BUCKETS_MAX
    }
}

/// Drop the buckets that have left the window at `now`.
#[inline]
pub(super) fn sliding_expire(
    buckets: &mut VecDeque<Bucket>,
    units: &mut u64,
    window: u64,
    now: u64,
) {
    while let Some(expired) = buckets
        .front()
        .filter(|b| b.stamp.saturating_add(window) <= now)
    {
        *units -= expired.units;
        buckets.pop_front();
    }
}

/// A sliding body that counts `used_before` units carried over from another algorithm's, as
/// one bucket at `now`.
pub(super) fn sliding_carried(used_before: u64, now: u64) -> Body {
    let mut buckets = VecDeque::new();
    if used_before > 0 {
        buckets.push_back(Bucket {
            opened_at: now,
            stamp: now,
            units: used_before,
        });
    }
    Body::Sliding {
        buckets,
        units: used_before,
    }
}

#[inline]
pub(super) fn sliding_used(buckets: &VecDeque<Bucket>, units: u64) -> u64 {
    debug_assert_eq!(units, buckets.iter().map(|b| b.units).sum::<u64>());
    units
}

/// Time from `now` until the oldest buckets holding `excess` units have left the window.
pub(super) fn sliding_wait_for_room(
    buckets: &VecDeque<Bucket>,
    window: u64,
    now: u64,
    excess: u64,
) -> u64 {
    let mut freed = 0;
    for bucket in buckets {
        freed += bucket.units;
        if freed >= excess {
            return (bucket.stamp + window).saturating_sub(now);
        }
    }
    unreachable!("cost is at most the capacity, so expiring every bucket makes room")
}

/// Count `cost` units at `now` in the newest bucket, or in a new one once the newest spans
/// its share of the window. Returns the time the grant is counted at (its reservation's).
#[inline]
pub(super) fn sliding_grant(
    buckets: &mut VecDeque<Bucket>,
    units: &mut u64,
    window: u64,
    limit: u64,
    now: u64,
    cost: u64,
) -> u64 {
    *units += cost;
    let span = sliding_bucket_span(window, limit);
    // Never stamp earlier than the newest bucket, so stamps stay ordered even if
    // the deciding clock steps back.
    let at = buckets.back().map_or(now, |last| last.stamp.max(now));
    // `opened_at <= stamp <= at`: with a span of 0 a grant joins the newest bucket
    // only at that bucket's own instant.
    match buckets.back_mut() {
        Some(last) if at - last.opened_at <= span => {
            last.stamp = at;
            last.units += cost;
        }
        _ => buckets.push_back(Bucket {
            opened_at: at,
            stamp: at,
            units: cost,
        }),
    }
    at
}

/// Give back up to `give_back` units of a reservation made at `at`; returns the units given
/// back. They come off the bucket that holds the reservation, if it still counts it.
pub(super) fn sliding_refund(
    buckets: &mut VecDeque<Bucket>,
    units: &mut u64,
    at: u64,
    give_back: u64,
) -> u64 {
    // The bucket that holds the reservation: the last one opened at or before it.
    let refunded = match buckets.iter_mut().rev().find(|b| b.opened_at <= at) {
        Some(bucket) if bucket.stamp >= at => {
            let refund = give_back.min(bucket.units);
            bucket.units -= refund;
            *units -= refund;
            refund
        }
        _ => 0,
    };
    buckets.retain(|b| b.units > 0);
    refunded
}

/// When the newest bucket leaves the window (0 for none).
#[inline]
pub(super) fn sliding_counted_until(buckets: &VecDeque<Bucket>, window: u64) -> u64 {
    buckets
        .back()
        .map_or(0, |bucket| bucket.stamp.saturating_add(window))
}
