//! Tollgate's own distributed protocol as a state machine: a few workers, one store, a vendor.
//!
//! The store holds two real `tollgate_core::Counter`s, one per limit: a sliding rate limit
//! (`rate_limit` units per period) and a concurrency limit (`concurrency_limit` leases with a
//! TTL). Every store action calls the core (`check`, `grant`, `commit`, `renew`, `pause`,
//! `status`, `Counter::recovering`) at the store's clock, so the arithmetic that is checked is the
//! arithmetic that runs; the model adds no limit arithmetic of its own to the store.
//!
//! The store's clock is a small discrete time: it starts at 0 and moves one tick (1 ms) at a
//! time, up to a horizon. A worker's request names both limits and is granted both or neither,
//! as the store does it: `check` both counters, then `grant` both.
//!
//! Worker steps: send an acquire (cost 1 or 2 rate units plus one lease), the store decides (a
//! denied worker learns at once, waits, and may send again), the worker receives its grant (time
//! may pass while it travels, and the lease may expire before it arrives), makes vendor calls (at
//! most its cost, and only within its grant's period), commits (`used` between the calls it made
//! and its cost: the rest is refunded, and the lease released), renews its lease, reports a vendor
//! 429 (a fleet-wide pause). A worker may crash at any step, losing its local state; its
//! reservation and lease stay in the store until they stop counting. The store may lose its state:
//! its counters are then replaced by `Counter::recovering(now, now + policy.memory_us())`, as G6
//! asks (docs/guarantees.md) (or, in the broken variant, by `Counter::new(now)`).
//!
//! # What the properties read
//!
//! The properties never read the counters. They read the model's own records, kept beside the
//! store as an outside observer would: every grant with its store time, cost, the calls the
//! vendor received under it and the `used` it was committed with; every lease with its expiry
//! as the protocol defines it (grant or successful renew time plus the TTL); every pause the
//! vendor asked for. A store that miscounts therefore shows up as a broken property.
//!
//! - **G1** (vendor calls): in any interval `[t, t + period)` of the store clock, the vendor
//!   receives at most `rate_limit` calls, each call counted at its grant's time. Also checked on
//!   units (cost until committed, `used` after), which bounds the calls.
//! - **G2** (holders): the workers that believe they hold a lease (they received the grant and
//!   have neither released it nor been refused a renew) and whose lease is really unexpired at
//!   the store clock number at most `concurrency_limit`. A holder whose lease expired may still
//!   believe it holds it (it was slow, or the grant was in flight while its TTL ran out); the
//!   store guarantees such a holder is fenced: its renew is refused (`LeaseExpired`) and its
//!   release frees nothing, so it learns at its next renew that it must stop, and it can never
//!   extend or free the slot now held by someone else. That guarantee is the `fencing`
//!   property; G2's "expired leases" is this exception.
//!   Also checked on all live leases, crashed holders and grants still in flight included.
//! - **G4**: no grant while a pause the vendor asked for is running.
//! - **G6**: after a store loss, no grant that, counted with the grants made before the loss,
//!   exceeds the limit: no interval of one period holding grants of both sides of a loss has
//!   more than `rate_limit` units, and leases of both sides alive at once number at most
//!   `concurrency_limit`.
//! - **Liveness** (no needless denial): whenever a request is at the store and the capacity is
//!   free by the model's records (units counted in the last period plus its cost within the
//!   limit, a lease slot free, no pause, no recovery running), the store's decision grants it.
//!   So a waiting worker is never kept waiting while capacity is free: a grant is enabled.
//!   Also: a lease alive by the records, in the store's current life, is always renewed.

use std::fmt;

use stateright::{Model, Property};
use tollgate_core::{Algorithm, Counter, Policy, PolicyError, Priority, Reserve};

use crate::Bound;

/// One tick of the store's clock: 1 ms, the shortest period or TTL a policy accepts.
pub const TICK_US: u64 = 1_000;

pub const G1_CALLS: &str = "G1: vendor calls in any period <= rate limit";
pub const G1_UNITS: &str = "G1: units counted in any period <= rate limit";
pub const G2_HOLDERS: &str = "G2: holders of unexpired leases <= concurrency limit";
pub const G2_LEASES: &str = "G2: unexpired leases <= concurrency limit";
pub const G4_PAUSE: &str = "G4: nothing granted during a pause";
pub const G6_LOSS: &str = "G6: grants across a store loss <= limit";
pub const FENCING: &str = "fencing: an expired lease neither renews nor frees a slot";
pub const LIVENESS: &str = "liveness: granted whenever capacity is free";
pub const SOMETIMES_LIMIT_REACHED: &str = "sometimes: the rate limit is used up";
pub const SOMETIMES_EXPIRED_HOLDER: &str =
    "sometimes: a worker holds a lease that expired at the store";
pub const SOMETIMES_AFTER_LOSS: &str = "sometimes: a grant after a store loss";

/// Every `always` property, for tests that expect all of them to hold.
pub const SAFETY_AND_LIVENESS: [&str; 8] = [
    G1_CALLS, G1_UNITS, G2_HOLDERS, G2_LEASES, G4_PAUSE, G6_LOSS, FENCING, LIVENESS,
];

/// What the store does in place of state it lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossHandling {
    /// `Counter::recovering(now, now + policy.memory_us())`: what a store must do (G6).
    Recovering,
    /// Broken on purpose: `Counter::new(now)`, as if nothing had been granted before.
    Forgets,
}

/// The bounds and parameters of one model.
#[derive(Clone, Debug)]
pub struct Setup {
    pub workers: usize,
    /// Sliding rate limit: units per period.
    pub rate_limit: u64,
    pub period_ticks: u64,
    pub concurrency_limit: u64,
    pub lease_ttl_ticks: u64,
    /// How long a vendor 429 pauses the rate limit; 0: the vendor never answers 429.
    pub pause_ticks: u64,
    /// The store clock stops here.
    pub horizon_ticks: u64,
    /// Costs a worker may ask for: `1..=cost_max` (and at most the rate limit).
    pub cost_max: u64,
    /// A worker sends an acquire only while fewer grants than this were made, all workers
    /// together (requests already in flight may still be granted). Bounds the state space:
    /// every grant takes a fresh sequence number from the counter, so unbounded grants make
    /// unbounded states even at a fixed time.
    pub grants_max: u8,
    pub store_losses: u8,
    /// Whether workers crash (at any step).
    pub crashes: bool,
    pub loss_handling: LossHandling,
}

impl Setup {
    /// Every fault at once: crashes, leases expiring, a vendor pause, a store loss.
    /// Small: 2 workers, a sliding limit of 2 per 2 ms, 1 lease of 2 ms TTL, 1 ms pauses,
    /// 4 ms of store clock, 2 grants, 1 store loss. Large: 3 grants.
    pub fn faults(bound: Bound) -> Setup {
        Setup {
            workers: 2,
            rate_limit: 2,
            period_ticks: 2,
            concurrency_limit: 1,
            lease_ttl_ticks: 2,
            pause_ticks: 1,
            horizon_ticks: 4,
            cost_max: 2,
            grants_max: if bound.is_large() { 3 } else { 2 },
            store_losses: 1,
            crashes: true,
            loss_handling: LossHandling::Recovering,
        }
    }

    /// More grants than the rate limit, so the window slides and refunds are spent again;
    /// crashes, no pause, no store loss. Small: 2 workers, 3 grants, 3 ms. Large: 4 grants, 4 ms.
    pub fn sliding(bound: Bound) -> Setup {
        Setup {
            grants_max: if bound.is_large() { 4 } else { 3 },
            horizon_ticks: if bound.is_large() { 4 } else { 3 },
            pause_ticks: 0,
            store_losses: 0,
            ..Setup::faults(bound)
        }
    }

    /// Three workers sharing two leases, with crashes and expiries; no pause, no store loss.
    /// Small: cost 1 only, 1 ms leases, 3 grants, 2 ms. Large: costs 1 and 2, 2 ms leases, 3 ms.
    pub fn shared_leases(bound: Bound) -> Setup {
        let large = bound.is_large();
        Setup {
            workers: 3,
            concurrency_limit: 2,
            lease_ttl_ticks: if large { 2 } else { 1 },
            cost_max: if large { 2 } else { 1 },
            grants_max: 3,
            horizon_ticks: if large { 3 } else { 2 },
            pause_ticks: 0,
            store_losses: 0,
            ..Setup::faults(bound)
        }
    }

    fn period_us(&self) -> u64 {
        self.period_ticks * TICK_US
    }

    fn lease_ttl_us(&self) -> u64 {
        self.lease_ttl_ticks * TICK_US
    }
}

/// A worker's local state. A crash resets it to `Idle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    /// An acquire for `cost` rate units and one lease is on its way to the store.
    Sent {
        cost: u64,
    },
    /// The store granted; the grant is on its way back.
    Answered {
        cost: u64,
        seq: u64,
        fence: u64,
        /// The grant's number in this behaviour (the model's name for its records).
        nth: u8,
        /// The store clock at the grant.
        at: u64,
    },
    Holding(Hold),
}

/// A worker holding a rate reservation and a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hold {
    pub nth: u8,
    pub cost: u64,
    pub seq: u64,
    pub fence: u64,
    pub granted_at: u64,
    /// Vendor calls made under this grant.
    pub made: u64,
}

/// The model's record of one rate grant. It names no worker: which worker holds a grant is
/// in the worker's state, and leaving it out lets behaviours that differ only in who did what
/// meet in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantNote {
    pub nth: u8,
    pub at: u64,
    pub cost: u64,
    /// Calls the vendor received under this grant.
    pub calls: u64,
    /// `used` of the commit, once committed.
    pub used: Option<u64>,
    /// Store losses before this grant.
    pub epoch: u8,
    /// Granted while a pause the vendor asked for was running (by the model's record).
    pub during_pause: bool,
}

impl GrantNote {
    /// Units this grant counts for: its cost until committed, then what was used.
    fn units(&self) -> u64 {
        self.used.unwrap_or(self.cost)
    }
}

/// The model's record of one lease: its expiry as the protocol defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseNote {
    pub nth: u8,
    pub expires_at: u64,
    pub epoch: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProtocolState {
    /// The store's clock, in microseconds.
    pub now: u64,
    pub rate: Counter,
    pub leases: Counter,
    pub workers: Vec<Phase>,
    /// Grants made so far, all workers together (bounded by `Setup::grants_max`).
    pub grants_made: u8,
    /// Store losses so far.
    pub losses: u8,
    // The model's own records (see the module doc); the store never reads them.
    /// End of the latest pause the vendor asked for.
    pub paused_until: u64,
    /// End of the recovery a store must observe after its latest loss, per limit.
    pub rate_recovering_until: u64,
    pub leases_recovering_until: u64,
    pub grant_notes: Vec<GrantNote>,
    pub lease_notes: Vec<LeaseNote>,
    /// The store renewed, or freed a slot of, a lease its records say had expired.
    pub fence_breached: bool,
    /// The store refused to renew a lease its records say is alive in the store's current life.
    pub live_lease_refused: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProtocolAction {
    Acquire {
        worker: usize,
        cost: u64,
    },
    /// The store receives the worker's acquire and decides it, both limits at once.
    Decide {
        worker: usize,
    },
    Receive {
        worker: usize,
    },
    /// One vendor call under the worker's grant.
    Call {
        worker: usize,
    },
    /// Commit the reservation with `used` (the rest is refunded) and release the lease.
    Commit {
        worker: usize,
        used: u64,
    },
    Renew {
        worker: usize,
    },
    /// The vendor answered 429: the worker pauses the rate limit for the fleet.
    Pause {
        worker: usize,
    },
    Crash {
        worker: usize,
    },
    /// The store's clock moves one tick; leases may expire.
    Tick,
    StoreLoss,
}

impl fmt::Display for ProtocolAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolAction::Acquire { worker, cost } => {
                write!(f, "worker {worker}: send acquire (cost {cost}, 1 lease)")
            }
            ProtocolAction::Decide { worker } => {
                write!(f, "store: decide worker {worker}'s acquire")
            }
            ProtocolAction::Receive { worker } => write!(f, "worker {worker}: receive the answer"),
            ProtocolAction::Call { worker } => write!(f, "worker {worker}: call the vendor"),
            ProtocolAction::Commit { worker, used } => {
                write!(f, "worker {worker}: commit used={used} and release")
            }
            ProtocolAction::Renew { worker } => write!(f, "worker {worker}: renew its lease"),
            ProtocolAction::Pause { worker } => {
                write!(f, "worker {worker}: vendor said 429, pause the rate limit")
            }
            ProtocolAction::Crash { worker } => write!(f, "worker {worker}: crash"),
            ProtocolAction::Tick => write!(f, "store clock: +1 ms"),
            ProtocolAction::StoreLoss => write!(f, "store: loses its state"),
        }
    }
}

fn ms(us: u64) -> String {
    if us.is_multiple_of(TICK_US) {
        format!("{}ms", us / TICK_US)
    } else {
        format!("{us}us")
    }
}

impl fmt::Display for ProtocolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store clock {}, losses {}, vendor pause until {}",
            ms(self.now),
            self.losses,
            ms(self.paused_until)
        )?;
        for (index, phase) in self.workers.iter().enumerate() {
            write!(f, "\nworker {index}: ")?;
            match *phase {
                Phase::Idle => write!(f, "idle")?,
                Phase::Sent { cost } => write!(f, "acquire (cost {cost}) in flight")?,
                Phase::Answered {
                    cost,
                    seq,
                    fence,
                    nth,
                    at,
                } => write!(
                    f,
                    "grant #{nth} (cost {cost}, seq {seq}, fence {fence}, at {}) in flight",
                    ms(at)
                )?,
                Phase::Holding(hold) => write!(
                    f,
                    "holding grant #{} (cost {}, made {} calls, seq {}, fence {}, granted at {})",
                    hold.nth,
                    hold.cost,
                    hold.made,
                    hold.seq,
                    hold.fence,
                    ms(hold.granted_at)
                )?,
            }
        }
        write!(f, "\nrecords: grants [")?;
        for (index, note) in self.grant_notes.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(
                f,
                "{separator}#{} at {} cost {} calls {} {}",
                note.nth,
                ms(note.at),
                note.cost,
                note.calls,
                match note.used {
                    Some(used) => format!("used {used}"),
                    None => "open".to_owned(),
                }
            )?;
            if note.epoch > 0 {
                write!(f, " after loss {}", note.epoch)?;
            }
        }
        write!(f, "], leases [")?;
        for (index, note) in self.lease_notes.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(f, "{separator}#{} until {}", note.nth, ms(note.expires_at))?;
        }
        write!(f, "]\nstore rate:   {:?}", self.rate)?;
        write!(f, "\nstore leases: {:?}", self.leases)
    }
}

#[derive(Clone, Debug)]
pub struct ProtocolModel {
    pub setup: Setup,
    rate: Policy,
    leases: Policy,
}

impl ProtocolModel {
    pub fn new(setup: Setup) -> Result<ProtocolModel, PolicyError> {
        let rate = Policy::rate(
            setup.rate_limit,
            setup.period_us(),
            0,
            Algorithm::Sliding,
            Reserve::default(),
        )?;
        let leases = Policy::concurrency(
            setup.concurrency_limit,
            setup.lease_ttl_us(),
            Reserve::default(),
        )?;
        Ok(ProtocolModel {
            setup,
            rate,
            leases,
        })
    }

    fn lost_counter(&self, policy: &Policy, now: u64) -> Counter {
        match self.setup.loss_handling {
            LossHandling::Recovering => Counter::recovering(now, now + policy.memory_us()),
            LossHandling::Forgets => Counter::new(now),
        }
    }

    fn lease_alive(state: &ProtocolState, nth: u8) -> bool {
        state
            .lease_notes
            .iter()
            .any(|note| note.nth == nth && note.expires_at > state.now)
    }

    /// Units counted, by the records, in the period that ends at the store's now.
    fn units_in_last_period(&self, state: &ProtocolState) -> u64 {
        let period = self.setup.period_us();
        state
            .grant_notes
            .iter()
            .filter(|note| note.at + period > state.now)
            .map(GrantNote::units)
            .sum()
    }

    fn live_leases(state: &ProtocolState) -> usize {
        state
            .lease_notes
            .iter()
            .filter(|note| note.expires_at > state.now)
            .count()
    }

    /// Whether a request for `cost` units and one lease should be granted now, by the records.
    fn capacity_free(&self, state: &ProtocolState, cost: u64) -> bool {
        state.now >= state.paused_until
            && state.now >= state.rate_recovering_until
            && state.now >= state.leases_recovering_until
            && self.units_in_last_period(state) + cost <= self.setup.rate_limit
            && Self::live_leases(state) < self.leases_limit()
    }

    fn leases_limit(&self) -> usize {
        usize::try_from(self.setup.concurrency_limit).unwrap_or(usize::MAX)
    }

    /// The store's decision on both counters, without changing them.
    fn store_would_grant(&self, state: &ProtocolState, cost: u64) -> bool {
        let mut rate = state.rate.clone();
        let mut leases = state.leases.clone();
        let rate_denial = rate
            .check(&self.rate, state.now, cost, Priority::Normal)
            .expect("the model's costs are within the rate limit");
        let lease_denial = leases
            .check(&self.leases, state.now, 1, Priority::Normal)
            .expect("one lease is within the concurrency limit");
        rate_denial.is_none() && lease_denial.is_none()
    }

    /// The most units counted in any interval `[t, t + period)`, `units` deciding what a grant
    /// counts for; with `spans_loss_only`, only intervals holding grants from both sides of a
    /// store loss.
    fn worst_period(
        &self,
        state: &ProtocolState,
        units: fn(&GrantNote) -> u64,
        spans_loss_only: bool,
    ) -> u64 {
        let period = self.setup.period_us();
        // The worst interval starts at some grant's time.
        state
            .grant_notes
            .iter()
            .filter_map(|start| {
                let inside = state
                    .grant_notes
                    .iter()
                    .filter(|note| note.at >= start.at && note.at < start.at + period);
                let spans_loss = inside.clone().any(|note| note.epoch != start.epoch);
                if spans_loss_only && !spans_loss {
                    return None;
                }
                Some(inside.map(units).sum())
            })
            .max()
            .unwrap_or(0)
    }

    fn holder_mut(state: &mut ProtocolState, worker: usize) -> Option<&mut Hold> {
        match &mut state.workers[worker] {
            Phase::Holding(hold) => Some(hold),
            _ => None,
        }
    }

    fn note_used(state: &mut ProtocolState, nth: u8, used: u64) {
        if let Some(note) = state.grant_notes.iter_mut().find(|note| note.nth == nth) {
            note.used = Some(used);
        }
    }

    fn forget_past(&self, state: &mut ProtocolState) {
        // A grant matters for G1 while a later grant can share its interval, and a call can
        // still be made under it up to one period after it: keep two periods. A lease matters
        // while it is unexpired; a missing lease note means an expired lease.
        let keep_us = 2 * self.setup.period_us();
        let now = state.now;
        state.grant_notes.retain(|note| note.at + keep_us > now);
        state.lease_notes.retain(|note| note.expires_at > now);
    }
}

impl Model for ProtocolModel {
    type State = ProtocolState;
    type Action = ProtocolAction;

    fn init_states(&self) -> Vec<ProtocolState> {
        vec![ProtocolState {
            now: 0,
            rate: Counter::new(0),
            leases: Counter::new(0),
            workers: vec![Phase::Idle; self.setup.workers],
            grants_made: 0,
            losses: 0,
            paused_until: 0,
            rate_recovering_until: 0,
            leases_recovering_until: 0,
            grant_notes: Vec::new(),
            lease_notes: Vec::new(),
            fence_breached: false,
            live_lease_refused: false,
        }]
    }

    fn actions(&self, state: &ProtocolState, actions: &mut Vec<ProtocolAction>) {
        let setup = &self.setup;
        for (worker, phase) in state.workers.iter().enumerate() {
            match *phase {
                Phase::Idle => {
                    if state.grants_made < setup.grants_max {
                        for cost in 1..=setup.rate_limit.min(setup.cost_max) {
                            actions.push(ProtocolAction::Acquire { worker, cost });
                        }
                    }
                }
                Phase::Sent { .. } => actions.push(ProtocolAction::Decide { worker }),
                Phase::Answered { .. } => actions.push(ProtocolAction::Receive { worker }),
                Phase::Holding(hold) => {
                    // A grant covers calls made within its own period; a later call is the
                    // business of `margin_ms`, not of this model.
                    if hold.made < hold.cost && state.now < hold.granted_at + setup.period_us() {
                        actions.push(ProtocolAction::Call { worker });
                    }
                    for used in hold.made..=hold.cost {
                        actions.push(ProtocolAction::Commit { worker, used });
                    }
                    actions.push(ProtocolAction::Renew { worker });
                    if hold.made > 0
                        && setup.pause_ticks > 0
                        && state.now + setup.pause_ticks * TICK_US > state.paused_until
                    {
                        actions.push(ProtocolAction::Pause { worker });
                    }
                }
            }
            if setup.crashes && *phase != Phase::Idle {
                actions.push(ProtocolAction::Crash { worker });
            }
        }
        if state.now < setup.horizon_ticks * TICK_US {
            actions.push(ProtocolAction::Tick);
        }
        if state.losses < setup.store_losses {
            actions.push(ProtocolAction::StoreLoss);
        }
    }

    fn next_state(&self, state: &ProtocolState, action: ProtocolAction) -> Option<ProtocolState> {
        let mut next = state.clone();
        let now = state.now;
        match action {
            ProtocolAction::Acquire { worker, cost } => {
                next.workers[worker] = Phase::Sent { cost };
            }
            ProtocolAction::Decide { worker } => {
                let Phase::Sent { cost } = state.workers[worker] else {
                    return None;
                };
                // As the store does it: check every limit, grant all only if all allow.
                let rate_denial = next
                    .rate
                    .check(&self.rate, now, cost, Priority::Normal)
                    .expect("the model's costs are within the rate limit");
                let lease_denial = next
                    .leases
                    .check(&self.leases, now, 1, Priority::Normal)
                    .expect("one lease is within the concurrency limit");
                if rate_denial.is_some() || lease_denial.is_some() {
                    // The worker learns of the denial, waits, and may send again; a denial in
                    // flight changes nothing anyone can observe, so it is not a state of its own.
                    next.workers[worker] = Phase::Idle;
                } else {
                    let rate_grant = next
                        .rate
                        .grant(&self.rate, now, cost, Priority::Normal, true);
                    let lease_grant =
                        next.leases
                            .grant(&self.leases, now, 1, Priority::Normal, true);
                    let expires_at = now + self.setup.lease_ttl_us();
                    assert_eq!(
                        lease_grant.lease_expires_at,
                        Some(expires_at),
                        "a lease lasts one TTL from its grant"
                    );
                    let nth = state.grants_made;
                    next.grants_made += 1;
                    next.grant_notes.push(GrantNote {
                        nth,
                        at: now,
                        cost,
                        calls: 0,
                        used: None,
                        epoch: state.losses,
                        during_pause: now < state.paused_until,
                    });
                    next.lease_notes.push(LeaseNote {
                        nth,
                        expires_at,
                        epoch: state.losses,
                    });
                    next.workers[worker] = Phase::Answered {
                        cost,
                        seq: rate_grant.seq,
                        fence: lease_grant.seq,
                        nth,
                        at: now,
                    };
                }
            }
            ProtocolAction::Receive { worker } => {
                let Phase::Answered {
                    cost,
                    seq,
                    fence,
                    nth,
                    at,
                } = state.workers[worker]
                else {
                    return None;
                };
                next.workers[worker] = Phase::Holding(Hold {
                    nth,
                    cost,
                    seq,
                    fence,
                    granted_at: at,
                    made: 0,
                });
            }
            ProtocolAction::Call { worker } => {
                let hold = Self::holder_mut(&mut next, worker)?;
                hold.made += 1;
                let nth = hold.nth;
                if let Some(note) = next.grant_notes.iter_mut().find(|note| note.nth == nth) {
                    note.calls += 1;
                }
            }
            ProtocolAction::Commit { worker, used } => {
                let hold = *Self::holder_mut(&mut next, worker)?;
                // Gone (its period ended, or the store lost it) is a normal answer; the worker
                // has nothing more to do either way.
                let _ = next.rate.commit(&self.rate, now, hold.seq, used);
                Self::note_used(&mut next, hold.nth, used);
                let released = next
                    .leases
                    .commit(&self.leases, now, hold.fence, 0)
                    .map_or(0, |committed| committed.released);
                if released > 0 && !Self::lease_alive(state, hold.nth) {
                    next.fence_breached = true;
                }
                next.lease_notes.retain(|note| note.nth != hold.nth);
                next.workers[worker] = Phase::Idle;
            }
            ProtocolAction::Renew { worker } => {
                let hold = *Self::holder_mut(&mut next, worker)?;
                let alive = Self::lease_alive(state, hold.nth);
                match next.leases.renew(&self.leases, now, hold.fence) {
                    Ok(expires_at) => {
                        if !alive {
                            next.fence_breached = true;
                        }
                        let renewed_until = now + self.setup.lease_ttl_us();
                        assert_eq!(expires_at, renewed_until, "a renew lasts one TTL from now");
                        for note in &mut next.lease_notes {
                            if note.nth == hold.nth {
                                note.expires_at = renewed_until;
                            }
                        }
                    }
                    Err(_) => {
                        let epoch = state
                            .lease_notes
                            .iter()
                            .find(|note| note.nth == hold.nth)
                            .map(|note| note.epoch);
                        if alive && epoch == Some(state.losses) {
                            next.live_lease_refused = true;
                        }
                        // Fenced: the worker stops using the vendor, commits what it used and
                        // goes back to idle. Its lease, if the store lost it while the records
                        // say it is alive, stays in the records until it expires.
                        let _ = next.rate.commit(&self.rate, now, hold.seq, hold.made);
                        Self::note_used(&mut next, hold.nth, hold.made);
                        next.workers[worker] = Phase::Idle;
                    }
                }
            }
            ProtocolAction::Pause { worker } => {
                Self::holder_mut(&mut next, worker)?;
                let until = now + self.setup.pause_ticks * TICK_US;
                next.rate.pause(until);
                next.paused_until = next.paused_until.max(until);
            }
            ProtocolAction::Crash { worker } => {
                next.workers[worker] = Phase::Idle;
            }
            ProtocolAction::Tick => {
                next.now = now + TICK_US;
                self.forget_past(&mut next);
            }
            ProtocolAction::StoreLoss => {
                next.rate = self.lost_counter(&self.rate, now);
                next.leases = self.lost_counter(&self.leases, now);
                next.losses += 1;
                next.rate_recovering_until = now + self.rate.memory_us();
                next.leases_recovering_until = now + self.leases.memory_us();
            }
        }
        // Every core operation first drops what no longer counts at its `now`, and dropping at
        // one time then at a later one is the same as dropping at the later one. Doing it after
        // every step changes no decision, and keeps two states that differ only in what has
        // not been dropped yet from counting as two.
        let _ = next.rate.status(&self.rate, next.now, Priority::Normal);
        let _ = next.leases.status(&self.leases, next.now, Priority::Normal);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(G1_CALLS, |model: &Self, state: &ProtocolState| {
                model.worst_period(state, |note| note.calls, false) <= model.setup.rate_limit
            }),
            Property::always(G1_UNITS, |model: &Self, state: &ProtocolState| {
                model.worst_period(state, GrantNote::units, false) <= model.setup.rate_limit
            }),
            Property::always(G2_HOLDERS, |model: &Self, state: &ProtocolState| {
                let holders = state
                    .workers
                    .iter()
                    .filter(|phase| match phase {
                        Phase::Holding(hold) => Self::lease_alive(state, hold.nth),
                        _ => false,
                    })
                    .count();
                holders <= model.leases_limit()
            }),
            Property::always(G2_LEASES, |model: &Self, state: &ProtocolState| {
                Self::live_leases(state) <= model.leases_limit()
            }),
            Property::always(G4_PAUSE, |_, state: &ProtocolState| {
                state.grant_notes.iter().all(|note| !note.during_pause)
            }),
            Property::always(G6_LOSS, |model: &Self, state: &ProtocolState| {
                let rate_ok =
                    model.worst_period(state, GrantNote::units, true) <= model.setup.rate_limit;
                let live = state
                    .lease_notes
                    .iter()
                    .filter(|note| note.expires_at > state.now);
                let spans_loss = live.clone().any(|note| note.epoch != state.losses)
                    && live.clone().any(|note| note.epoch == state.losses);
                rate_ok && (!spans_loss || live.count() <= model.leases_limit())
            }),
            Property::always(FENCING, |_, state: &ProtocolState| !state.fence_breached),
            Property::always(LIVENESS, |model: &Self, state: &ProtocolState| {
                !state.live_lease_refused
                    && state.workers.iter().all(|phase| match *phase {
                        Phase::Sent { cost } => {
                            !model.capacity_free(state, cost)
                                || model.store_would_grant(state, cost)
                        }
                        _ => true,
                    })
            }),
            Property::sometimes(SOMETIMES_LIMIT_REACHED, |model: &Self, state| {
                model.units_in_last_period(state) == model.setup.rate_limit
            }),
            Property::sometimes(SOMETIMES_EXPIRED_HOLDER, |_, state: &ProtocolState| {
                state.workers.iter().any(|phase| match phase {
                    Phase::Holding(hold) => !Self::lease_alive(state, hold.nth),
                    _ => false,
                })
            }),
            Property::sometimes(SOMETIMES_AFTER_LOSS, |_, state: &ProtocolState| {
                state.grant_notes.iter().any(|note| note.epoch > 0)
            }),
        ]
    }
}
