//! One counter's state and every decision on it: check, grant, commit (refund), renew,
//! release, pause. All functions take `now` (microseconds on the deciding clock) as an argument
//! and read no clock, so the same arithmetic runs in the memory store, under the model checker
//! and in the simulators.
//!
//! A request over several limits is decided by the store in two phases: `check` every counter
//! (no units move), then `grant` on every counter only if all allowed. `check` may normalise
//! the state (drop what has expired, adapt to a changed policy); normalising never changes a
//! decision, so a denied request leaves the counters as good as untouched.
//!
//! This file holds the counter and what every algorithm shares (its pause, its numbers, the
//! verdicts and errors) and dispatches on the body's kind; each algorithm's arithmetic is in a
//! file of its own: `sliding.rs`, `fixed.rs`, `gcra.rs`, `leases.rs` (concurrency), with the
//! open reservations rate grants keep for refunds in `reservations.rs` and the state as plain
//! numbers in `words.rs`. The Redis store's script has the same files
//! (`crates/redis/src/lua/`).

mod fixed;
mod gcra;
mod leases;
mod reservations;
mod sliding;
mod words;

use std::collections::VecDeque;

use crate::policy::{Algorithm, Kind, Policy, Priority};

use fixed::{fixed_carried, fixed_counted_until, fixed_refund, fixed_roll, fixed_wait_for_room};
pub use gcra::{GcraStep, gcra_admit};
use gcra::{gcra_carried, gcra_refund, gcra_used, gcra_wait_for_room};
pub use leases::LEASES_MAX;
use leases::{
    Lease, leases_counted_until, leases_expire, leases_find, leases_grant, leases_release,
    leases_used, leases_wait_for_room,
};
pub use reservations::RESERVATIONS_TRACKED_MAX;
use reservations::{Reservation, Reservations};
pub use sliding::SLIDING_BUCKETS_MAX;
use sliding::{
    Bucket, sliding_carried, sliding_counted_until, sliding_expire, sliding_grant, sliding_refund,
    sliding_used, sliding_wait_for_room,
};
pub use words::CounterWordsError;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Body {
    Empty,
    /// `units` is the sum of the buckets' units, kept as they change, so that deciding reads
    /// it instead of summing up to `SLIDING_BUCKETS_MAX` buckets each time.
    Sliding {
        buckets: VecDeque<Bucket>,
        units: u64,
    },
    /// `window` is the index of the aligned window `used` counts in, `window_us` its length.
    Fixed {
        window: u64,
        window_us: u64,
        used: u64,
    },
    /// `emission_us` is the interval `tat` was built with.
    Gcra {
        tat: u64,
        emission_us: u64,
        last_seq: u64,
    },
    Leases {
        leases: Vec<Lease>,
    },
}

/// The state of one counter: one limit, or one `(limit, key)` pair for a limit with `per`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Counter {
    paused_until: u64,
    /// Next reservation number or fencing token. Starts at the creation time in micros, so a
    /// counter evicted and created again still hands out larger numbers (see `idle_at`).
    next_seq: u64,
    reservations: Reservations,
    body: Body,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenyReason {
    /// Not enough units open to the request's priority.
    Capacity,
    /// The limit (or key) is paused.
    Paused,
    /// The store holds the counter back after losing its state (`Counter::recovering`): the
    /// core reports such a hold as `Paused`, and the store, which knows which holds it made,
    /// tells it apart.
    Recovering,
    /// Requests of the same or higher priority wait ahead of it: in this process (the engine's
    /// queue), or, on a store that queues waiters across processes, anywhere in the fleet and
    /// need the units it asks for. The core never answers it.
    Queued,
}

impl DenyReason {
    /// Every reason, in the order reports list them.
    pub const ALL: [DenyReason; 4] = [
        DenyReason::Capacity,
        DenyReason::Paused,
        DenyReason::Queued,
        DenyReason::Recovering,
    ];

    /// The reason's one name, as every interface spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Capacity => "capacity",
            DenyReason::Paused => "paused",
            DenyReason::Queued => "queued",
            DenyReason::Recovering => "recovering",
        }
    }

    /// What the reason means, for people: one clause, as the commands print it and the API's
    /// document describes it.
    pub fn meaning(self) -> &'static str {
        match self {
            DenyReason::Capacity => "the limit is used up",
            DenyReason::Paused => {
                "the limit is paused (for instance on a vendor's \"retry after\")"
            }
            DenyReason::Queued => "requests of the same or higher priority are waiting ahead",
            DenyReason::Recovering => {
                "the store is holding the limit after it lost what it counted (an unclean stop, \
                 or a Redis that came back empty) until what was granted before can no longer \
                 count"
            }
        }
    }
}

/// A refusal: a value, not an error.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denial {
    /// Exact time until the request would be granted if nothing else changed.
    pub retry_after_us: u64,
    /// Units open to the request's priority now.
    pub remaining: u64,
    pub reason: DenyReason,
    /// For a `Capacity` denial: the units left unused to every priority (0 otherwise). Above
    /// `remaining` when the limit's `reserve` keeps what is left for higher priorities: the
    /// limit is not used up, it is kept.
    pub left: u64,
}

#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Reservation number (rate) or fencing token (concurrency).
    pub seq: u64,
    /// Units still open to the request's priority after this grant.
    pub remaining: u64,
    /// Time until every unit counted now stops counting.
    pub reset_after_us: u64,
    /// For a lease: when it expires unless renewed.
    pub lease_expires_at: Option<u64>,
}

#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Granted(Grant),
    Denied(Denial),
}

impl Verdict {
    pub fn is_granted(&self) -> bool {
        matches!(self, Verdict::Granted(_))
    }
}

/// A request that no amount of waiting could satisfy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostError {
    pub cost: u64,
    /// Units open to the request's priority when the counter is empty.
    pub capacity: u64,
}

impl std::fmt::Display for CostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.cost == 0 {
            write!(f, "cost must be at least 1")
        } else {
            write!(
                f,
                "cost {} exceeds the {} units this limit can ever grant at this priority",
                self.cost, self.capacity
            )
        }
    }
}

impl std::error::Error for CostError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PermitError {
    /// This counter never issued that number.
    Unknown,
    /// Committed already, or its units no longer count (its period ended).
    Gone,
    /// `renew` on a lease that expired or was released.
    LeaseExpired,
    /// `commit(used)` with `used` above the permit's cost.
    UsedAboveCost { used: u64, cost: u64 },
    /// `renew` on a rate permit, or a lease operation on a rate limit.
    WrongKind,
}

impl std::fmt::Display for PermitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PermitError::Unknown => write!(f, "unknown permit"),
            PermitError::Gone => write!(f, "permit already committed or expired"),
            PermitError::LeaseExpired => write!(f, "lease expired or released"),
            PermitError::UsedAboveCost { used, cost } => {
                write!(f, "used {used} is above the permit's cost {cost}")
            }
            PermitError::WrongKind => write!(f, "operation does not apply to this kind of limit"),
        }
    }
}

impl std::error::Error for PermitError {}

/// What a successful commit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Committed {
    /// Rate units given back.
    pub refunded: u64,
    /// Lease slots given back (0 when the lease had already ended: release is idempotent).
    pub released: u64,
}

/// Units open to `priority`, if a request of `cost` can ever be granted at it.
fn open_for(policy: &Policy, cost: u64, priority: Priority) -> Result<u64, CostError> {
    let open = policy.capacity_for(priority);
    if cost == 0 || cost > open {
        return Err(CostError {
            cost,
            capacity: open,
        });
    }
    Ok(open)
}

impl Counter {
    /// A fresh counter at `now`: nothing counted, nothing paused.
    pub fn new(now: u64) -> Counter {
        Counter {
            paused_until: 0,
            next_seq: now,
            reservations: Reservations::default(),
            body: Body::Empty,
        }
    }

    /// A fresh counter that grants nothing before `until`: what a store uses in place of state it
    /// lost, so that nothing granted before the loss can be granted again (G6).
    pub fn recovering(now: u64, until: u64) -> Counter {
        let mut counter = Counter::new(now.max(until));
        counter.paused_until = until;
        counter
    }

    pub fn paused_until(&self) -> u64 {
        self.paused_until
    }

    /// Pause until `until`. Pauses only extend.
    pub fn pause(&mut self, until: u64) {
        self.paused_until = self.paused_until.max(until);
    }

    /// Lift a pause: from now on nothing but `hold_until` (a store's hold after a loss of state,
    /// which is not a pause anyone may lift; 0 for none) keeps the counter from granting.
    /// Returns whether a pause past `now` was lifted.
    pub fn resume(&mut self, now: u64, hold_until: u64) -> bool {
        let lifted = self.paused_until > now.max(hold_until);
        self.paused_until = self.paused_until.min(hold_until);
        lifted
    }

    /// Forget what this counter counts, as an administrator's reset of a key does: its usage,
    /// its open reservations (a permit granted before finds nothing to refund) and its own
    /// pause. The sequence goes on, so permit numbers and fences still only grow.
    pub fn forget(&mut self) {
        self.body = Body::Empty;
        self.reservations = Reservations(None);
        self.paused_until = 0;
    }

    /// The instant from which this counter is indistinguishable from `Counter::new`: nothing
    /// counts, nothing is paused, no permit can still be committed, and the clock has passed
    /// every number it handed out. A store may forget the counter from then on.
    pub fn idle_at(&self, policy: &Policy) -> u64 {
        let mut idle = self.paused_until.max(self.next_seq);
        if let (Some(last), Kind::Rate(rate)) = (self.reservations.back(), policy.kind()) {
            idle = idle.max(last.at.saturating_add(rate.window_us()));
        }
        idle.max(self.counted_until(policy))
    }

    /// The instant from which the body counts nothing: the newest sliding bucket has left the
    /// window, the fixed window has ended, the GCRA backlog has drained, every lease has ended.
    /// Unlike `idle_at`, this leaves out what only matters to forgetting the counter (permits
    /// that can still be committed, numbers handed out), so it is the honest reset time.
    fn counted_until(&self, policy: &Policy) -> u64 {
        let window = match policy.kind() {
            Kind::Rate(rate) => rate.window_us(),
            Kind::Concurrency(_) => 0,
        };
        match &self.body {
            Body::Empty => 0,
            Body::Sliding { buckets, .. } => sliding_counted_until(buckets, window),
            Body::Fixed {
                window: index,
                window_us,
                used,
            } => fixed_counted_until(*index, *window_us, *used),
            Body::Gcra { tat, .. } => *tat,
            Body::Leases { leases } => leases_counted_until(leases),
        }
    }

    /// Bring the body in line with `policy` and drop what no longer counts at `now`.
    /// A body of another kind (the policy changed) carries over what it still counts.
    fn normalise(&mut self, policy: &Policy, now: u64) {
        match policy.kind() {
            Kind::Rate(rate) => {
                let window = rate.window_us();
                self.reservations.expire(window, now);
                match (rate.algorithm(), &mut self.body) {
                    (Algorithm::Sliding, Body::Sliding { buckets, units }) => {
                        sliding_expire(buckets, units, window, now)
                    }
                    (
                        Algorithm::Fixed,
                        Body::Fixed {
                            window: index,
                            window_us,
                            used,
                        },
                    ) if *window_us == window => fixed_roll(index, used, window, now),
                    (Algorithm::Gcra { .. }, Body::Gcra { emission_us, .. })
                        if *emission_us == rate.emission_us() => {}
                    (algorithm, _) => {
                        let used_before = self.rate_units_counted(now);
                        self.body = match algorithm {
                            Algorithm::Sliding => sliding_carried(used_before, now),
                            Algorithm::Fixed => fixed_carried(used_before, window, now),
                            Algorithm::Gcra { .. } => {
                                gcra_carried(used_before, rate.emission_us(), now)
                            }
                        };
                    }
                }
            }
            Kind::Concurrency(_) => {
                self.reservations.clear();
                match &mut self.body {
                    Body::Leases { leases } => leases_expire(leases, now),
                    _ => {
                        self.body = Body::Leases { leases: Vec::new() };
                    }
                }
            }
        }
    }

    /// Rate units the current body counts at `now`, whatever its algorithm (used to carry
    /// state across a policy change). Leases count as nothing here.
    fn rate_units_counted(&self, now: u64) -> u64 {
        match &self.body {
            Body::Empty | Body::Leases { .. } => 0,
            // Callers prune first when the policy matches; across a change, count every bucket.
            Body::Sliding { units, .. } => *units,
            Body::Fixed { used, .. } => *used,
            Body::Gcra {
                tat, emission_us, ..
            } => gcra_used(*tat, *emission_us, now),
        }
    }

    /// Units in use (rate units counted, or lease slots held) after `normalise`.
    fn used(&self, policy: &Policy, now: u64) -> u64 {
        match (&self.body, policy.kind()) {
            (Body::Sliding { buckets, units }, _) => sliding_used(buckets, *units),
            (Body::Fixed { used, .. }, _) => *used,
            (Body::Gcra { tat, .. }, Kind::Rate(rate)) => gcra_used(*tat, rate.emission_us(), now),
            (Body::Leases { leases }, _) => leases_used(leases),
            _ => 0,
        }
    }

    /// Time from `now` until `cost` more units fit under `open` (units open to the priority),
    /// assuming nothing else is granted or given back. Zero when they fit now.
    fn wait_for_room(&self, policy: &Policy, now: u64, cost: u64, open: u64) -> u64 {
        let used = self.used(policy, now);
        if used + cost <= open {
            return 0;
        }
        let excess = used + cost - open;
        match (&self.body, policy.kind()) {
            (Body::Sliding { buckets, .. }, Kind::Rate(rate)) => {
                sliding_wait_for_room(buckets, rate.window_us(), now, excess)
            }
            (Body::Fixed { window: index, .. }, Kind::Rate(rate)) => {
                fixed_wait_for_room(*index, rate.window_us(), now)
            }
            (Body::Gcra { tat, .. }, Kind::Rate(rate)) => {
                gcra_wait_for_room(*tat, rate.emission_us(), now, cost, open)
            }
            (Body::Leases { leases }, _) => leases_wait_for_room(leases, now, excess),
            _ => 0,
        }
    }

    /// Would `cost` units at `priority` be granted at `now`? Moves no units.
    pub fn check(
        &mut self,
        policy: &Policy,
        now: u64,
        cost: u64,
        priority: Priority,
    ) -> Result<Option<Denial>, CostError> {
        let open = open_for(policy, cost, priority)?;
        self.normalise(policy, now);
        let room_after_us = self.wait_for_room(policy, now, cost, open);
        let pause_after_us = self.paused_until.saturating_sub(now);
        if room_after_us == 0 && pause_after_us == 0 {
            return Ok(None);
        }
        let used = self.used(policy, now);
        let reason = if pause_after_us > 0 {
            DenyReason::Paused
        } else {
            DenyReason::Capacity
        };
        Ok(Some(Denial {
            retry_after_us: room_after_us.max(pause_after_us),
            remaining: open.saturating_sub(used),
            reason,
            left: if reason == DenyReason::Capacity {
                policy.capacity().saturating_sub(used)
            } else {
                0
            },
        }))
    }

    /// Grant `cost` units. Call only right after `check` allowed the same request at the same
    /// `now`; granting past the limit is a broken invariant and panics rather than overdraw.
    /// `refundable`: record the rate units as an open reservation that `commit` can refund.
    /// A caller that never commits says `false`: the units count exactly the same, and the
    /// counter keeps no record of them (`commit` of the number is `Gone`).
    pub fn grant(
        &mut self,
        policy: &Policy,
        now: u64,
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> Grant {
        let open = policy.capacity_for(priority);
        let used_before = self.used(policy, now);
        assert!(
            self.paused_until <= now && used_before + cost <= open,
            "grant without room: check must allow it first"
        );
        let seq = self.next_seq.max(now);
        self.next_seq = seq + 1;
        let mut lease_expires_at = None;
        let mut reserved_at = now;
        match (&mut self.body, policy.kind()) {
            (Body::Sliding { buckets, units }, Kind::Rate(rate)) => {
                reserved_at =
                    sliding_grant(buckets, units, rate.window_us(), rate.limit(), now, cost);
            }
            (Body::Fixed { used, .. }, Kind::Rate(_)) => *used += cost,
            (Body::Gcra { tat, last_seq, .. }, Kind::Rate(_)) => {
                let step = gcra_admit(*tat, policy, now, cost, priority);
                *tat = step
                    .expect("check allowed the grant, and GCRA admits it alike")
                    .tat;
                *last_seq = seq;
            }
            (Body::Leases { leases }, Kind::Concurrency(concurrency)) => {
                let expires_at = now + concurrency.lease_ttl_us();
                leases_grant(leases, seq, cost, expires_at);
                lease_expires_at = Some(expires_at);
            }
            _ => unreachable!("normalise gives the body the policy's kind"),
        }
        if refundable && !policy.is_concurrency() {
            self.reservations.record(Reservation {
                seq,
                units: cost,
                at: reserved_at,
            });
        }
        // Every body counts a grant of `cost` as exactly `cost` more (a GCRA backlog grows by
        // whole emission intervals), so what remains needs no second count.
        debug_assert_eq!(self.used(policy, now), used_before + cost);
        Grant {
            seq,
            remaining: open - used_before - cost,
            reset_after_us: self
                .counted_until(policy)
                .saturating_sub(now)
                .min(policy.memory_us()),
            lease_expires_at,
        }
    }

    /// `check` then `grant`: the decision for a request on this counter alone.
    pub fn decide(
        &mut self,
        policy: &Policy,
        now: u64,
        cost: u64,
        priority: Priority,
        refundable: bool,
    ) -> Result<Verdict, CostError> {
        Ok(match self.check(policy, now, cost, priority)? {
            Some(denial) => Verdict::Denied(denial),
            None => Verdict::Granted(self.grant(policy, now, cost, priority, refundable)),
        })
    }

    /// The end of the GCRA backlog, if a grant without a refund on this counter at `now` or
    /// later needs nothing else: the body is GCRA at the policy's emission interval (so
    /// `normalise` would change nothing), no reservation is open (none can be refunded), and
    /// nothing is paused. Such a counter can be decided by `gcra_admit` on its backlog alone,
    /// and a store may keep that one number where callers decide on it without a lock.
    pub fn gcra_alone(&self, policy: &Policy, now: u64) -> Option<u64> {
        let Kind::Rate(rate) = policy.kind() else {
            return None;
        };
        let Body::Gcra {
            tat, emission_us, ..
        } = &self.body
        else {
            return None;
        };
        let alone = matches!(rate.algorithm(), Algorithm::Gcra { .. })
            && *emission_us == rate.emission_us()
            && self.reservations.is_empty()
            && self.paused_until <= now;
        alone.then_some(*tat)
    }

    /// Count up to `units` more as granted at `now`, as far as the counter has room at the
    /// highest priority, whatever pause is on; returns the units counted. For a store that
    /// restores a counter from a record and knows only that at most `units` were granted on it
    /// after the record, at unknown times no later than `now` (a process that crashed): counted
    /// at `now`, they count at least as much and as long as those grants could. A sliding grant
    /// counts until its time plus the window, so a later one counts longer; a GCRA grant adds
    /// to `max(tat, time)`, so a later one ends the backlog later; a fixed window counts only
    /// the grants in `now`'s window, which hold no more. The room is enough: the lost grants
    /// fitted beside the record's units when they were made, and those units only expire
    /// since. Leases are not counted (a renewal moves a lease without a grant): 0.
    pub fn charge(&mut self, policy: &Policy, now: u64, units: u64) -> u64 {
        if policy.is_concurrency() || units == 0 {
            return 0;
        }
        self.normalise(policy, now);
        let room = policy.capacity().saturating_sub(self.used(policy, now));
        let units = units.min(room);
        if units == 0 {
            return 0;
        }
        // `grant` refuses to grant through a pause; the pause stays as it was.
        let paused_until = std::mem::take(&mut self.paused_until);
        let _ = self.grant(policy, now, units, Priority::High, false);
        self.paused_until = paused_until;
        units
    }

    /// Count `units` spent at `now` beyond anything granted, even past the limit: what a vendor
    /// counted over a reservation (a language model's answer longer than its estimate), which
    /// every later grant on this counter then waits out, in whichever process asks: a debt paid
    /// first. At most one capacity is counted past the limit, so a caller cannot close a limit
    /// for longer than its own window; returns the units counted. Pauses stay as they are;
    /// leases count nothing: 0.
    pub fn debit(&mut self, policy: &Policy, now: u64, units: u64) -> u64 {
        let Kind::Rate(rate) = policy.kind() else {
            return 0;
        };
        self.normalise(policy, now);
        let used_before = self.used(policy, now);
        let ceiling = policy.capacity().saturating_mul(2);
        let units = units.min(ceiling.saturating_sub(used_before));
        if units == 0 {
            return 0;
        }
        match &mut self.body {
            Body::Sliding {
                buckets,
                units: total,
            } => {
                sliding_grant(buckets, total, rate.window_us(), rate.limit(), now, units);
            }
            Body::Fixed { used, .. } => *used += units,
            Body::Gcra { tat, .. } => *tat = (*tat).max(now) + units * rate.emission_us(),
            Body::Empty | Body::Leases { .. } => return 0,
        }
        debug_assert_eq!(self.used(policy, now), used_before + units);
        units
    }

    /// Put back the backlog's end that `gcra_admit` moved, on a counter `gcra_alone` allowed
    /// (any other body is left as it is: it has no such number).
    pub fn set_gcra_tat(&mut self, backlog_end: u64) {
        debug_assert!(matches!(self.body, Body::Gcra { .. }), "not a GCRA counter");
        if let Body::Gcra { tat, .. } = &mut self.body {
            *tat = backlog_end;
        }
    }

    /// Commit a rate reservation (refund `cost - used`) or release a lease (`used` ignored).
    /// Once per permit: a second commit of a reservation is `Gone`; a second release of a
    /// lease is a no-op that reports `released: 0`, so it can never free a slot twice.
    pub fn commit(
        &mut self,
        policy: &Policy,
        now: u64,
        seq: u64,
        used: u64,
    ) -> Result<Committed, PermitError> {
        if seq >= self.next_seq {
            return Err(PermitError::Unknown);
        }
        self.normalise(policy, now);
        match (&mut self.body, policy.kind()) {
            (Body::Leases { leases }, _) => {
                let released = leases_release(leases, seq);
                Ok(Committed {
                    refunded: 0,
                    released,
                })
            }
            (body, Kind::Rate(rate)) => {
                let (index, reservation) = self.reservations.find(seq).ok_or(PermitError::Gone)?;
                if used > reservation.units {
                    return Err(PermitError::UsedAboveCost {
                        used,
                        cost: reservation.units,
                    });
                }
                self.reservations.remove(index);
                let give_back = reservation.units - used;
                let refunded = match body {
                    Body::Sliding { buckets, units } => {
                        sliding_refund(buckets, units, reservation.at, give_back)
                    }
                    Body::Fixed {
                        window: index,
                        used: window_used,
                        ..
                    } => fixed_refund(
                        *index,
                        window_used,
                        rate.window_us(),
                        reservation.at,
                        give_back,
                    ),
                    Body::Gcra { tat, last_seq, .. } => {
                        gcra_refund(tat, *last_seq, seq, give_back, rate.emission_us())
                    }
                    Body::Empty | Body::Leases { .. } => 0,
                };
                Ok(Committed {
                    refunded,
                    released: 0,
                })
            }
            _ => Err(PermitError::WrongKind),
        }
    }

    /// Extend a lease to `now + lease_ttl`. Returns the new expiry.
    pub fn renew(&mut self, policy: &Policy, now: u64, fence: u64) -> Result<u64, PermitError> {
        let Kind::Concurrency(concurrency) = policy.kind() else {
            return Err(PermitError::WrongKind);
        };
        if fence >= self.next_seq {
            return Err(PermitError::Unknown);
        }
        self.normalise(policy, now);
        let Body::Leases { leases } = &mut self.body else {
            unreachable!("normalise gives a concurrency policy a lease body")
        };
        let lease = leases_find(leases, fence).ok_or(PermitError::LeaseExpired)?;
        lease.expires_at = now + concurrency.lease_ttl_us();
        Ok(lease.expires_at)
    }

    /// Units open to `priority` at `now` and the time until every counted unit stops counting.
    pub fn status(&mut self, policy: &Policy, now: u64, priority: Priority) -> (u64, u64) {
        let (used, reset_after) = self.usage(policy, now);
        (
            policy.capacity_for(priority).saturating_sub(used),
            reset_after,
        )
    }

    /// Units (or lease slots) counted at `now`, and the time until every one stops counting.
    pub fn usage(&mut self, policy: &Policy, now: u64) -> (u64, u64) {
        self.normalise(policy, now);
        (
            self.used(policy, now),
            self.counted_until(policy)
                .saturating_sub(now)
                .min(policy.memory_us()),
        )
    }
}

#[cfg(test)]
mod reason_tests {
    use super::DenyReason;

    #[test]
    fn every_reason_is_listed_once_with_a_name_and_a_meaning_of_its_own() {
        for (place, reason) in DenyReason::ALL.into_iter().enumerate() {
            // A new reason fails to compile here until it is given its place in ALL.
            let expected = match reason {
                DenyReason::Capacity => 0,
                DenyReason::Paused => 1,
                DenyReason::Queued => 2,
                DenyReason::Recovering => 3,
            };
            assert_eq!(place, expected, "{reason:?}");
            let others = DenyReason::ALL.into_iter().filter(|other| *other != reason);
            for other in others {
                assert_ne!(reason.as_str(), other.as_str());
                assert_ne!(reason.meaning(), other.meaning());
            }
        }
    }
}
