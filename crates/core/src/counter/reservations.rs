//! A rate counter's open reservations: the grants `commit` can still refund, oldest first, at
//! most `RESERVATIONS_TRACKED_MAX` of them, and what expires them.

use std::collections::VecDeque;

/// Open reservations remembered per counter for `commit` refunds. Past this the oldest are
/// forgotten: their units stay used (safe) and committing them reports them gone. Callers that
/// commit promptly hold few open at once; the cap keeps a counter's state small (a shared store
/// reads and writes it whole on every decision) when permits are dropped uncommitted.
pub const RESERVATIONS_TRACKED_MAX: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Reservation {
    pub(super) seq: u64,
    pub(super) units: u64,
    pub(super) at: u64,
}

/// Open reservations, oldest first, on the heap only while there is one: most counters have
/// none (callers that never commit, GCRA decided on its backlog alone), and a store keeps many
/// counters, so an empty list costs one word instead of a `VecDeque`'s four. Empty is always
/// `None`, so equal lists are equal values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
// The box is the point: `Option<Box<_>>` is one word where `VecDeque` is four.
#[allow(clippy::box_collection)]
pub(super) struct Reservations(pub(super) Option<Box<VecDeque<Reservation>>>);

impl Reservations {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |list| list.len())
    }

    pub(super) fn front(&self) -> Option<&Reservation> {
        self.0.as_ref().and_then(|list| list.front())
    }

    pub(super) fn back(&self) -> Option<&Reservation> {
        self.0.as_ref().and_then(|list| list.back())
    }

    pub(super) fn push_back(&mut self, reservation: Reservation) {
        self.0.get_or_insert_default().push_back(reservation);
    }

    pub(super) fn pop_front(&mut self) {
        self.remove(0);
    }

    /// The reservation numbered `seq` and where it is.
    pub(super) fn find(&self, seq: u64) -> Option<(usize, Reservation)> {
        let list = self.0.as_ref()?;
        let index = list.binary_search_by_key(&seq, |r| r.seq).ok()?;
        Some((index, list[index]))
    }

    pub(super) fn remove(&mut self, index: usize) {
        if let Some(list) = &mut self.0 {
            list.remove(index);
            if list.is_empty() {
                self.0 = None;
            }
        }
    }

    pub(super) fn clear(&mut self) {
        self.0 = None;
    }

    /// Drop the reservations whose units no longer count at `now` (a window after their time).
    #[inline]
    pub(super) fn expire(&mut self, window: u64, now: u64) {
        while self
            .front()
            .is_some_and(|r| r.at.saturating_add(window) <= now)
        {
            self.pop_front();
        }
    }

    /// Record a refundable grant; past the cap the oldest is forgotten.
    #[inline]
    pub(super) fn record(&mut self, reservation: Reservation) {
        if self.len() >= RESERVATIONS_TRACKED_MAX {
            self.pop_front();
        }
        self.push_back(reservation);
    }
}
