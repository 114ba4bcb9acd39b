//! The fixed window: a count of the units granted in the aligned window of `window_us` that
//! `now` falls in (index `now / window_us`), rolled over in one place (`fixed_roll`). This file
//! owns that arithmetic; `mod.rs` calls it for a `Body::Fixed`.

use super::Body;

/// Start the window `now` is in, if it is a later one than `index`.
#[inline]
pub(super) fn fixed_roll(index: &mut u64, used: &mut u64, window: u64, now: u64) {
    let current = now / window;
    if *index < current {
        *index = current;
        *used = 0;
    }
}

/// A fixed body that counts `used_before` units carried over from another algorithm's, in
/// `now`'s window.
pub(super) fn fixed_carried(used_before: u64, window: u64, now: u64) -> Body {
    Body::Fixed {
        window: now / window,
        window_us: window,
        used: used_before,
    }
}

/// Time from `now` until the window `index` ends.
#[inline]
pub(super) fn fixed_wait_for_room(index: u64, window: u64, now: u64) -> u64 {
    (index + 1).saturating_mul(window).saturating_sub(now)
}

/// Give back up to `give_back` units of a reservation made at `at`, if it was made in the
/// window that counts now; returns the units given back.
pub(super) fn fixed_refund(
    index: u64,
    used: &mut u64,
    window: u64,
    at: u64,
    give_back: u64,
) -> u64 {
    if at / window == index {
        let refund = give_back.min(*used);
        *used -= refund;
        refund
    } else {
        0
    }
}

/// When window `index` ends, if it counts anything (0 otherwise).
#[inline]
pub(super) fn fixed_counted_until(index: u64, window_us: u64, used: u64) -> u64 {
    if used == 0 {
        0
    } else {
        index.saturating_add(1).saturating_mul(window_us)
    }
}
