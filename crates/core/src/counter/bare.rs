//! A fixed window of the period alone (the margin is not added): `used` units in the aligned
//! window `index` of `period_us`.

use super::Body;

#[inline]
pub(super) fn bare_roll(index: &mut u64, used: &mut u64, period: u64, now: u64) {
    let current = now / period;
    if *index < current {
        *index = current;
        *used = 0;
    }
}

pub(super) fn bare_carried(used_before: u64, period: u64, now: u64) -> Body {
    Body::Bare {
        window: now / period,
        period_us: period,
        used: used_before,
    }
}

#[inline]
pub(super) fn bare_wait_for_room(index: u64, period: u64, now: u64) -> u64 {
    (index + 1).saturating_mul(period).saturating_sub(now)
}

pub(super) fn bare_refund(index: u64, used: &mut u64, period: u64, at: u64, give_back: u64) -> u64 {
    if at / period == index {
        let refund = give_back.min(*used);
        *used -= refund;
        refund
    } else {
        0
    }
}

#[inline]
pub(super) fn bare_counted_until(index: u64, period: u64, used: u64) -> u64 {
    if used == 0 {
        0
    } else {
        index.saturating_add(1).saturating_mul(period)
    }
}
