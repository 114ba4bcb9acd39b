//! One counter's state and every decision on it: check, grant, commit (refund), renew,
//! release, pause. All functions take `now` (microseconds on the deciding clock) as an argument
//! and read no clock, so the same arithmetic runs in the memory store, under the model checker
//! and in the simulators.
//!
//! A request over several limits is decided by the store in two phases: `check` every counter
//! (no units move), then `grant` on every counter only if all allowed. `check` may normalise
//! the state (drop what has expired, adapt to a changed policy); normalising never changes a
//! decision, so a denied request leaves the counters as good as untouched.

use std::collections::VecDeque;

use crate::policy::{Algorithm, Kind, Policy, Priority, UNITS_MAX};

/// A sliding log keeps at most this many buckets; grants closer together than
/// `window / SLIDING_BUCKETS_MAX` share a bucket stamped with the latest grant's time, which
/// counts the earlier ones a little longer than needed (never shorter). Steady-state
/// utilisation is therefore at least 64/65 of the limit, and memory per key is bounded.
pub const SLIDING_BUCKETS_MAX: u64 = 64;

/// Open reservations remembered per counter for `commit` refunds. Past this the oldest are
/// forgotten: their units stay used (safe) and committing them reports them gone. Callers that
/// commit promptly hold few open at once; the cap keeps a counter's state small (a shared store
/// reads and writes it whole on every decision) when permits are dropped uncommitted.
pub const RESERVATIONS_TRACKED_MAX: usize = 256;

/// Outstanding leases per counter; a concurrency limit above this cannot be written.
pub const LEASES_MAX: u64 = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Bucket {
    opened_at: u64,
    stamp: u64,
    units: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Reservation {
    seq: u64,
    units: u64,
    at: u64,
}

/// Open reservations, oldest first, on the heap only while there is one: most counters have
/// none (callers that never commit, GCRA decided on its backlog alone), and a store keeps many
/// counters, so an empty list costs one word instead of a `VecDeque`'s four. Empty is always
/// `None`, so equal lists are equal values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
// The box is the point: `Option<Box<_>>` is one word where `VecDeque` is four.
#[allow(clippy::box_collection)]
struct Reservations(Option<Box<VecDeque<Reservation>>>);

impl Reservations {
    fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |list| list.len())
    }

    fn front(&self) -> Option<&Reservation> {
        self.0.as_ref().and_then(|list| list.front())
    }

    fn back(&self) -> Option<&Reservation> {
        self.0.as_ref().and_then(|list| list.back())
    }

    fn push_back(&mut self, reservation: Reservation) {
        self.0.get_or_insert_default().push_back(reservation);
    }

    fn pop_front(&mut self) {
        self.remove(0);
    }

    /// The reservation numbered `seq` and where it is.
    fn find(&self, seq: u64) -> Option<(usize, Reservation)> {
        let list = self.0.as_ref()?;
        let index = list.binary_search_by_key(&seq, |r| r.seq).ok()?;
        Some((index, list[index]))
    }

    fn remove(&mut self, index: usize) {
        if let Some(list) = &mut self.0 {
            list.remove(index);
            if list.is_empty() {
                self.0 = None;
            }
        }
    }

    fn clear(&mut self) {
        self.0 = None;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lease {
    fence: u64,
    slots: u64,
    expires_at: u64,
}

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

fn sliding_bucket_span(policy_window_us: u64, limit: u64) -> u64 {
    if limit <= SLIDING_BUCKETS_MAX {
        // Fewer units than buckets: every grant fits a bucket of its own; stay exact.
        0
    } else {
        policy_window_us / SLIDING_BUCKETS_MAX
    }
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
            Body::Sliding { buckets, .. } => buckets
                .back()
                .map_or(0, |bucket| bucket.stamp.saturating_add(window)),
            Body::Fixed {
                window: index,
                window_us,
                used,
            } => {
                if *used == 0 {
                    0
                } else {
                    index.saturating_add(1).saturating_mul(*window_us)
                }
            }
            Body::Gcra { tat, .. } => *tat,
            Body::Leases { leases } => leases
                .iter()
                .map(|lease| lease.expires_at)
                .max()
                .unwrap_or(0),
        }
    }

    /// Bring the body in line with `policy` and drop what no longer counts at `now`.
    /// A body of another kind (the policy changed) carries over what it still counts.
    fn normalise(&mut self, policy: &Policy, now: u64) {
        match policy.kind() {
            Kind::Rate(rate) => {
                let window = rate.window_us();
                while self
                    .reservations
                    .front()
                    .is_some_and(|r| r.at.saturating_add(window) <= now)
                {
                    self.reservations.pop_front();
                }
                match (rate.algorithm(), &mut self.body) {
                    (Algorithm::Sliding, Body::Sliding { buckets, units }) => {
                        while let Some(expired) = buckets
                            .front()
                            .filter(|b| b.stamp.saturating_add(window) <= now)
                        {
                            *units -= expired.units;
                            buckets.pop_front();
                        }
                    }
                    (
                        Algorithm::Fixed,
                        Body::Fixed {
                            window: index,
                            window_us,
                            used,
                        },
                    ) if *window_us == window => {
                        let current = now / window;
                        if *index < current {
                            *index = current;
                            *used = 0;
                        }
                    }
                    (Algorithm::Gcra { .. }, Body::Gcra { emission_us, .. })
                        if *emission_us == rate.emission_us() => {}
                    (algorithm, _) => {
                        let used_before = self.rate_units_counted(now);
                        self.body = match algorithm {
                            Algorithm::Sliding => {
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
                            Algorithm::Fixed => Body::Fixed {
                                window: now / window,
                                window_us: window,
                                used: used_before,
                            },
                            Algorithm::Gcra { .. } => Body::Gcra {
                                tat: now
                                    .saturating_add(used_before.saturating_mul(rate.emission_us())),
                                emission_us: rate.emission_us(),
                                last_seq: 0,
                            },
                        };
                    }
                }
            }
            Kind::Concurrency(_) => {
                self.reservations.clear();
                match &mut self.body {
                    Body::Leases { leases } => leases.retain(|lease| lease.expires_at > now),
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
            } => tat.saturating_sub(now).div_ceil(*emission_us),
        }
    }

    /// Units in use (rate units counted, or lease slots held) after `normalise`.
    fn used(&self, policy: &Policy, now: u64) -> u64 {
        match (&self.body, policy.kind()) {
            (Body::Sliding { buckets, units }, _) => {
                debug_assert_eq!(*units, buckets.iter().map(|b| b.units).sum::<u64>());
                *units
            }
            (Body::Fixed { used, .. }, _) => *used,
            (Body::Gcra { tat, .. }, Kind::Rate(rate)) => {
                // Units the bucket holds: the backlog in emission intervals, rounded up. A grant
                // of `cost` fits when this plus `cost` is within the burst, which is GCRA's own
                // test `max(tat, now) + cost * T <= now + burst * T`.
                tat.saturating_sub(now).div_ceil(rate.emission_us())
            }
            (Body::Leases { leases }, _) => leases.iter().map(|lease| lease.slots).sum(),
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
                let mut freed = 0;
                for bucket in buckets {
                    freed += bucket.units;
                    if freed >= excess {
                        return (bucket.stamp + rate.window_us()).saturating_sub(now);
                    }
                }
                unreachable!("cost is at most the capacity, so expiring every bucket makes room")
            }
            (Body::Fixed { window: index, .. }, Kind::Rate(rate)) => (index + 1)
                .saturating_mul(rate.window_us())
                .saturating_sub(now),
            (Body::Gcra { tat, .. }, Kind::Rate(rate)) => {
                // Fits once the backlog `tat - t` is at most `(open - cost) * T`.
                tat.saturating_sub((open - cost) * rate.emission_us())
                    .saturating_sub(now)
            }
            (Body::Leases { leases }, _) => {
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
                *units += cost;
                let span = sliding_bucket_span(rate.window_us(), rate.limit());
                // Never stamp earlier than the newest bucket, so stamps stay ordered even if
                // the deciding clock steps back.
                let at = buckets.back().map_or(now, |last| last.stamp.max(now));
                reserved_at = at;
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
                leases.push(Lease {
                    fence: seq,
                    slots: cost,
                    expires_at,
                });
                lease_expires_at = Some(expires_at);
            }
            _ => unreachable!("normalise gives the body the policy's kind"),
        }
        if refundable && !policy.is_concurrency() {
            if self.reservations.len() >= RESERVATIONS_TRACKED_MAX {
                self.reservations.pop_front();
            }
            self.reservations.push_back(Reservation {
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
                let released = match leases.iter().position(|lease| lease.fence == seq) {
                    Some(index) => leases.swap_remove(index).slots,
                    None => 0,
                };
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
                        // The bucket that holds the reservation: the last one opened at or before it.
                        match buckets
                            .iter_mut()
                            .rev()
                            .find(|b| b.opened_at <= reservation.at)
                        {
                            Some(bucket) if bucket.stamp >= reservation.at => {
                                let refund = give_back.min(bucket.units);
                                bucket.units -= refund;
                                *units -= refund;
                                refund
                            }
                            _ => 0,
                        }
                    }
                    Body::Fixed {
                        window: index,
                        used: window_used,
                        ..
                    } => {
                        if reservation.at / rate.window_us() == *index {
                            let refund = give_back.min(*window_used);
                            *window_used -= refund;
                            refund
                        } else {
                            0
                        }
                    }
                    Body::Gcra { tat, last_seq, .. } => {
                        // Only the newest grant can be taken back exactly: an older one's time may
                        // since have been absorbed by an idle gap (see ARCHITECTURE.md).
                        if *last_seq == seq {
                            *tat = tat.saturating_sub(give_back * rate.emission_us());
                            give_back
                        } else {
                            0
                        }
                    }
                    Body::Empty | Body::Leases { .. } => 0,
                };
                if let Body::Sliding { buckets, .. } = body {
                    buckets.retain(|b| b.units > 0);
                }
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
        let lease = leases
            .iter_mut()
            .find(|lease| lease.fence == fence)
            .ok_or(PermitError::LeaseExpired)?;
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

/// Why a counter's words (`Counter::to_words`) cannot be read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterWordsError(&'static str);

impl std::fmt::Display for CounterWordsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "counter state: {}", self.0)
    }
}

impl std::error::Error for CounterWordsError {}

const BODY_EMPTY: u64 = 0;
const BODY_SLIDING: u64 = 1;
const BODY_FIXED: u64 = 2;
const BODY_GCRA: u64 = 3;
const BODY_LEASES: u64 = 4;

/// Reads words in order, refusing a short input.
struct Words<'a>(std::slice::Iter<'a, u64>);

impl Words<'_> {
    fn next(&mut self) -> Result<u64, CounterWordsError> {
        self.0.next().copied().ok_or(CounterWordsError("too short"))
    }

    /// A length, refused above `max` before anything is allocated for it.
    fn len(&mut self, max: u64, what: &'static str) -> Result<usize, CounterWordsError> {
        let len = self.next()?;
        if len > max {
            return Err(CounterWordsError(what));
        }
        usize::try_from(len).map_err(|_| CounterWordsError(what))
    }
}

impl Counter {
    /// The whole state as plain numbers, times as they are (on the deciding clock), so a store
    /// can keep it across a restart of its process (`from_words` reads it back).
    pub fn to_words(&self) -> Vec<u64> {
        let mut words = vec![
            self.paused_until,
            self.next_seq,
            self.reservations.len() as u64,
        ];
        if let Some(list) = &self.reservations.0 {
            for r in list.iter() {
                words.extend([r.seq, r.units, r.at]);
            }
        }
        match &self.body {
            Body::Empty => words.push(BODY_EMPTY),
            Body::Sliding { buckets, .. } => {
                words.extend([BODY_SLIDING, buckets.len() as u64]);
                for b in buckets {
                    words.extend([b.opened_at, b.stamp, b.units]);
                }
            }
            Body::Fixed {
                window,
                window_us,
                used,
            } => words.extend([BODY_FIXED, *window, *window_us, *used]),
            Body::Gcra {
                tat,
                emission_us,
                last_seq,
            } => words.extend([BODY_GCRA, *tat, *emission_us, *last_seq]),
            Body::Leases { leases } => {
                words.extend([BODY_LEASES, leases.len() as u64]);
                for l in leases {
                    words.extend([l.fence, l.slots, l.expires_at]);
                }
            }
        }
        words
    }

    /// A counter from `to_words`. Words that no counter could have written (from another
    /// version, or edited by hand) are refused rather than trusted: a decision on an
    /// inconsistent state could overdraw.
    pub fn from_words(words: &[u64]) -> Result<Counter, CounterWordsError> {
        let mut input = Words(words.iter());
        let paused_until = input.next()?;
        let next_seq = input.next()?;
        let count = input.len(RESERVATIONS_TRACKED_MAX as u64, "too many reservations")?;
        let mut reservations = Reservations::default();
        for _ in 0..count {
            let reservation = Reservation {
                seq: input.next()?,
                units: input.next()?,
                at: input.next()?,
            };
            let ordered = reservations
                .back()
                .is_none_or(|last| last.seq < reservation.seq);
            if !ordered || reservation.seq >= next_seq || reservation.units > UNITS_MAX {
                return Err(CounterWordsError("reservations out of order"));
            }
            reservations.push_back(reservation);
        }
        let body = match input.next()? {
            BODY_EMPTY => Body::Empty,
            BODY_SLIDING => {
                // The log holds at most one bucket past its cap while it merges.
                let count = input.len(SLIDING_BUCKETS_MAX + 1, "too many sliding buckets")?;
                let mut buckets = VecDeque::with_capacity(count);
                let mut units: u64 = 0;
                for _ in 0..count {
                    let bucket = Bucket {
                        opened_at: input.next()?,
                        stamp: input.next()?,
                        units: input.next()?,
                    };
                    let ordered = bucket.opened_at <= bucket.stamp
                        && buckets
                            .back()
                            .is_none_or(|last: &Bucket| last.stamp <= bucket.stamp);
                    if !ordered {
                        return Err(CounterWordsError("sliding buckets out of order"));
                    }
                    units = units
                        .checked_add(bucket.units)
                        .ok_or(CounterWordsError("sliding units out of range"))?;
                    buckets.push_back(bucket);
                }
                Body::Sliding { buckets, units }
            }
            BODY_FIXED => {
                let (window, window_us, used) = (input.next()?, input.next()?, input.next()?);
                if window_us == 0 || used > UNITS_MAX {
                    return Err(CounterWordsError("fixed window out of range"));
                }
                Body::Fixed {
                    window,
                    window_us,
                    used,
                }
            }
            BODY_GCRA => {
                let (tat, emission_us, last_seq) = (input.next()?, input.next()?, input.next()?);
                if emission_us == 0 {
                    return Err(CounterWordsError("GCRA interval out of range"));
                }
                Body::Gcra {
                    tat,
                    emission_us,
                    last_seq,
                }
            }
            BODY_LEASES => {
                let count = input.len(LEASES_MAX, "too many leases")?;
                let mut leases = Vec::with_capacity(count);
                for _ in 0..count {
                    let lease = Lease {
                        fence: input.next()?,
                        slots: input.next()?,
                        expires_at: input.next()?,
                    };
                    if lease.fence >= next_seq || lease.slots > LEASES_MAX {
                        return Err(CounterWordsError("lease out of range"));
                    }
                    leases.push(lease);
                }
                Body::Leases { leases }
            }
            _ => return Err(CounterWordsError("unknown kind")),
        };
        if input.0.next().is_some() {
            return Err(CounterWordsError("too long"));
        }
        Ok(Counter {
            paused_until,
            next_seq,
            reservations,
            body,
        })
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
