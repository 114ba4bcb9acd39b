//! Connection accounting for one host: at most `connections_max` connections across all
//! selectors (read-only vs read-write, one per service), created lazily, lent to one job at a
//! time. When a selector needs a connection and the pool is full, the idle connection returned
//! longest ago (of another selector) is dropped to make room. Pure bookkeeping: no I/O, no
//! clock, no async; the dispatcher opens connections outside the lock.

use std::collections::VecDeque;

/// What `checkout` found for a selector.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Checkout<C> {
    /// An idle connection of that selector.
    Idle(C),
    /// Room was reserved for a new connection; open one. `recycled` is how many idle
    /// connections of other selectors were dropped to make the room (0 or 1).
    Create { recycled: u32 },
    /// Every connection is lent out; wait for one to come back.
    Full,
}

#[derive(Debug)]
pub(crate) struct Pool<C, S> {
    connections_max: usize,
    /// Connections that exist or are being opened, lent or idle.
    open: usize,
    /// Idle connections, the longest idle first.
    idle: VecDeque<(S, C)>,
}

impl<C, S: PartialEq> Pool<C, S> {
    pub(crate) fn new(connections_max: usize) -> Pool<C, S> {
        Pool {
            connections_max,
            open: 0,
            idle: VecDeque::new(),
        }
    }

    pub(crate) fn checkout(&mut self, selector: &S) -> Checkout<C> {
        // The most recently returned connection of the selector: the one likeliest still warm.
        if let Some(index) = self.idle.iter().rposition(|(idle, _)| idle == selector)
            && let Some((_, connection)) = self.idle.remove(index)
        {
            return Checkout::Idle(connection);
        }
        if self.open < self.connections_max {
            self.open += 1;
            return Checkout::Create { recycled: 0 };
        }
        if self.idle.pop_front().is_some() {
            // The count stays: one dropped, one to open in its place.
            return Checkout::Create { recycled: 1 };
        }
        Checkout::Full
    }

    /// A lent connection comes back, reusable.
    pub(crate) fn checkin(&mut self, selector: S, connection: C) {
        self.idle.push_back((selector, connection));
    }

    /// A reserved or lent connection is gone (opening failed, or it broke).
    pub(crate) fn discard(&mut self) {
        self.open = self.open.saturating_sub(1);
    }

    pub(crate) fn open(&self) -> usize {
        self.open
    }

    pub(crate) fn idle(&self) -> usize {
        self.idle.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_up_to_capacity_then_reuse() {
        let mut pool: Pool<u32, &str> = Pool::new(2);
        assert_eq!(pool.open(), 0, "nothing opened before it is needed");
        assert_eq!(pool.checkout(&"ro"), Checkout::Create { recycled: 0 });
        assert_eq!(pool.checkout(&"ro"), Checkout::Create { recycled: 0 });
        assert_eq!(pool.checkout(&"ro"), Checkout::Full);
        pool.checkin("ro", 1);
        assert_eq!(pool.checkout(&"ro"), Checkout::Idle(1));
        assert_eq!(pool.open(), 2);
    }

    #[test]
    fn another_selector_recycles_the_longest_idle() {
        let mut pool: Pool<u32, &str> = Pool::new(2);
        let _ = pool.checkout(&"ro");
        let _ = pool.checkout(&"rw");
        pool.checkin("ro", 1);
        pool.checkin("rw", 2);
        // Full, no idle "billing": the longest idle ("ro", 1) makes room.
        assert_eq!(pool.checkout(&"billing"), Checkout::Create { recycled: 1 });
        assert_eq!(pool.open(), 2, "never more than connections_max");
        assert_eq!(pool.idle(), 1);
        assert_eq!(pool.checkout(&"rw"), Checkout::Idle(2));
        assert_eq!(
            pool.checkout(&"ro"),
            Checkout::Full,
            "nothing idle to recycle"
        );
    }

    #[test]
    fn a_discarded_connection_frees_its_room() {
        let mut pool: Pool<u32, &str> = Pool::new(1);
        let _ = pool.checkout(&"ro");
        assert_eq!(pool.checkout(&"ro"), Checkout::Full);
        pool.discard();
        assert_eq!(pool.checkout(&"rw"), Checkout::Create { recycled: 0 });
    }
}
