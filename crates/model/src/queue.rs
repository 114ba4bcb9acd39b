//! One counter's queue across the fleet as a state machine: processes whose requests wait for
//! one counter, at several priorities, against a store that orders them with the rule of
//! `tollgate_redis_protocol::queue` and counts with a real `tollgate_core::Counter`.
//!
//! The store decides each ask in one atomic step, as the script does, on its own clock, over
//! the places as it keeps them (`queue::decode`, then `queue::encode` of what it changed):
//!
//! 1. `queue::expire` drops the places that stopped counting;
//! 2. `queue::rank_of` says where the request stands, `queue::ahead` what the live places
//!    ahead of it ask for;
//! 3. the counter's own `Counter::check` of the request's cost; a denial is answered
//!    (capacity);
//! 4. with units ahead, `queue::need` against `Policy::capacity_for` the request's priority:
//!    `None` is a denial (queued), `Some(n)` is `Counter::check` of `n`, a denial of which is a
//!    denial (queued);
//! 5. a grant is `Counter::grant` of the cost and `queue::leave`; a denied waiting request takes
//!    or renews its place with `queue::stand`.
//!
//! A waiting request asks, and while denied may ask again (its heartbeat, or a retry on its
//! hint), give up (`queue::leave`), or die with its process: its place stays in the store until
//! it expires, `ttl` after its last ask. It may also be slow: nothing makes it ask again before
//! its place expires (it then comes back as a newcomer). A request that does not wait asks
//! once. Each process makes a few requests one after the other, each with a new id; after a
//! crash the process restarts and its next request is a newcomer, behind its own dead place if
//! that is still live. The store's clock moves one tick at a time, up to a horizon.
//!
//! # What the properties read
//!
//! Never the counter nor the store's queue. They read the model's own records, kept as an
//! outside observer would: every grant (time, units); every process's request and, while it
//! waits, the place the protocol says it holds: when it first asked in its current stay (its
//! arrival) and when it last asked; the places of crashed requests. A place is live while its
//! last ask is less than `ttl` ago. The records order places by priority, then arrival, then
//! request id, on their own; a request that does not wait stands behind every place of its
//! priority or higher. The units open to a request are `Policy::capacity_for` its priority (a
//! configuration, not the counter's state) less the units the records count in the current
//! period.
//!
//! - **No lower grant**: when a request is granted, no live waiter of a higher priority holding
//!   a live place could have been granted its own cost just before, but not just after.
//! - **First come**: the same for a live waiter of the same priority whose place is ahead of
//!   the request (it arrived earlier).
//! - **Head not starved**: a request with no live place ahead of it is granted whenever the
//!   counter has room for its cost.
//! - **Dead places bounded**: a request denied as queued is held back only by live places: the
//!   units of the live places ahead of it, with its own cost, are more than the units open to
//!   it. A crashed waiter's place therefore holds nobody back from `ttl` after its last ask, at
//!   the latest `ttl` after the crash.
//! - **No overshoot**: the units granted in any period are at most the limit.
//! - **Queued only when needed**: a request denied as queued could not have been granted
//!   leaving every live place ahead of it room for its cost at that place's own priority. It
//!   holds without reserves; with a reserve, the rule counts the places ahead against the
//!   units open to the request's priority, and the checker shows it holds a lower request
//!   back when a higher place ahead could take its units from the reserve.
//!
//! - **Holds bounded** (with a hold bound, `Setup::hold_ticks`): a request denied as queued is
//!   held back only by places whose stay began less than the bound ago. A waiter that has
//!   stood that long is let go, as the engine lets go a head that found no room for its hold
//!   bound (`docs/security.md`, *A waiting request*): it leaves its place and asks again as a
//!   request that does not wait, behind every place of its priority or higher. Its stay
//!   begins no later than the engine's hold, so the model's bound is the tighter.
//!
//! Flawed rules show the properties are not vacuous ([`Rule`]): a denied waiter that never
//! stands, places that never expire, a request that counts its own place ahead of itself, a
//! renewal that takes a new arrival, and a waiter that is never let go.

use std::cmp::Reverse;
use std::fmt;

use stateright::{Model, Property};
use tollgate_core::{Algorithm, Counter, DenyReason, Policy, PolicyError, Priority, Reserve};
use tollgate_redis_protocol::queue::{self, NOT_WAITING};

use crate::Bound;

/// One tick of the store's clock: 1 ms, the shortest period a policy accepts.
pub const TICK_US: u64 = 1_000;

pub const NO_LOWER_GRANT: &str = "no lower grant while a live higher waiter could use the units";
pub const FIRST_COME: &str =
    "first come: no grant while a live earlier waiter of its priority could use the units";
pub const HEAD_NOT_STARVED: &str =
    "head not starved: with no live place ahead and room for its cost, a request is granted";
pub const DEAD_PLACES_BOUNDED: &str =
    "dead places bounded: a queued denial is owed to places asked for less than ttl ago";
pub const NO_OVERSHOOT: &str = "no overshoot: units granted in any period <= limit";
pub const QUEUED_ONLY_WHEN_NEEDED: &str =
    "queued only when needed: granting would leave a live place ahead no room at its priority";
pub const HOLDS_BOUNDED: &str = "holds bounded: a queued denial is owed to places that began their stay less than the bound ago";
pub const SOMETIMES_HELD_BACK: &str =
    "sometimes: a waiter is denied as queued while the counter has room for it";
pub const SOMETIMES_HELD_BY_DEAD: &str =
    "sometimes: a request is denied as queued behind a crashed request's place";
pub const SOMETIMES_GRANTED_AFTER_WAITING: &str =
    "sometimes: a low waiter is granted after waiting";

/// Every `always` property, for tests that expect all of them to hold.
pub const ALL: [&str; 7] = [
    NO_LOWER_GRANT,
    FIRST_COME,
    HEAD_NOT_STARVED,
    DEAD_PLACES_BOUNDED,
    NO_OVERSHOOT,
    QUEUED_ONLY_WHEN_NEEDED,
    HOLDS_BOUNDED,
];

/// The queue rule the store applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// `tollgate_redis_protocol::queue`, as the store applies it.
    Queue,
    /// Flawed: a denied waiter never stands (`queue::stand` is never called), so the queue stays
    /// empty and the store grants whoever asks first when there is room, as before the queue.
    NoRegistration,
    /// Flawed: places are registered but never expire (`queue::stand` with an endless TTL).
    NoExpiry,
    /// Flawed: a request's own live place counts among the units ahead of it.
    OwnPlaceAhead,
    /// Flawed: a waiter that asks again takes a new arrival, at the back of its priority,
    /// instead of keeping its live place's.
    RenewalRearrives,
    /// Flawed: a waiter stands for as long as it waits, past the hold bound.
    NeverLetGo,
}

/// One process's requests on the counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Process {
    pub priority: Priority,
    pub cost: u64,
    /// Its requests wait (ask until granted, given up or crashed); else each asks once, as
    /// `NOT_WAITING`.
    pub waits: bool,
    /// Requests it makes, one after the other.
    pub requests: u8,
}

impl Process {
    /// A process whose one request waits.
    pub const fn waiting(priority: Priority, cost: u64) -> Process {
        Process {
            priority,
            cost,
            waits: true,
            requests: 1,
        }
    }

    /// A process whose one request asks once.
    pub const fn once(priority: Priority, cost: u64) -> Process {
        Process {
            priority,
            cost,
            waits: false,
            requests: 1,
        }
    }

    /// The same process, making `requests` requests.
    pub const fn times(self, requests: u8) -> Process {
        Process { requests, ..self }
    }
}

/// The bounds and parameters of one model.
#[derive(Clone, Debug)]
pub struct Setup {
    pub processes: Vec<Process>,
    /// The counter's rate limit: units per period, `Sliding` or `Fixed` (the records count
    /// either exactly).
    pub limit: u64,
    pub period_ticks: u64,
    pub algorithm: Algorithm,
    pub reserve: Reserve,
    /// A place lives this long after its request's last ask.
    pub ttl_ticks: u64,
    /// The store's clock stops here.
    pub horizon_ticks: u64,
    /// Whether a waiting request may die with its process (which restarts for its next
    /// request), and be given up.
    pub crashes: bool,
    pub give_ups: bool,
    /// Whether a waiting request may let its place expire (slow, or on a retry hint longer
    /// than the TTL). Without, the clock moves only while every live waiter's place outlives
    /// the tick: a live waiter asks again in time, and only a crash leaves a place behind.
    pub slow_waiters: bool,
    /// A waiter whose stay began this long ago is let go (and the properties judge by it);
    /// `None`: waiters stand for as long as they wait.
    pub hold_ticks: Option<u64>,
    pub rule: Rule,
}

impl Setup {
    /// A high process whose requests of cost 2 wait, two low ones whose requests of cost 1 wait,
    /// and a low one whose requests of cost 1 ask once, on a sliding limit of 2 per 2 ms; places
    /// live 2 ms; waiters crash, give up and are slow. The high process makes two requests (after
    /// a crash, it restarts and asks again); small: the others one each, 4 ms of clock; large:
    /// the first low waiter and the low process two each, 5 ms.
    pub fn fleet(bound: Bound) -> Setup {
        let large = bound.is_large();
        let again = if large { 2 } else { 1 };
        Setup {
            processes: vec![
                Process::waiting(Priority::High, 2).times(2),
                Process::waiting(Priority::Low, 1).times(again),
                Process::waiting(Priority::Low, 1),
                Process::once(Priority::Low, 1).times(again),
            ],
            limit: 2,
            period_ticks: 2,
            algorithm: Algorithm::Sliding,
            reserve: Reserve::default(),
            ttl_ticks: 2,
            horizon_ticks: if large { 5 } else { 4 },
            crashes: true,
            give_ups: true,
            slow_waiters: true,
            hold_ticks: None,
            rule: Rule::Queue,
        }
    }

    /// A waiter that may never be served while a higher process keeps taking a unit: a normal
    /// waiter of cost 2, a high process whose three requests of cost 1 ask once, and a normal
    /// one whose two requests of cost 1 ask once, on a sliding limit of 2 per 2 ms, places
    /// living 2 ms, a hold bound of 2 ms and 5 ms of clock (6 at the large bound); no crashes,
    /// give-ups or slow waiters, so every place is a live waiter's.
    pub fn hold(bound: Bound) -> Setup {
        Setup {
            processes: vec![
                Process::waiting(Priority::Normal, 2),
                Process::once(Priority::High, 1).times(3),
                Process::once(Priority::Normal, 1).times(2),
            ],
            horizon_ticks: if bound.is_large() { 6 } else { 5 },
            crashes: false,
            give_ups: false,
            slow_waiters: false,
            hold_ticks: Some(2),
            ..Setup::fleet(bound)
        }
    }

    /// The same on a fixed window of 2 ms.
    pub fn fixed(bound: Bound) -> Setup {
        Setup {
            algorithm: Algorithm::Fixed,
            ..Setup::fleet(bound)
        }
    }

    /// A limit of 2 per 2 ms keeping 1 unit for high requests, so a low request may use only 1:
    /// a high waiter and a high process whose requests ask once, of cost 1 each, and two low
    /// waiters of cost 1; as in `fleet`, the high waiter makes two requests, and at the large
    /// bound the first low waiter and the process that asks once two each.
    pub fn reserve(bound: Bound) -> Setup {
        let again = if bound.is_large() { 2 } else { 1 };
        Setup {
            processes: vec![
                Process::waiting(Priority::High, 1).times(2),
                Process::once(Priority::High, 1).times(again),
                Process::waiting(Priority::Low, 1).times(again),
                Process::waiting(Priority::Low, 1),
            ],
            reserve: Reserve { high: 1, normal: 0 },
            ..Setup::fleet(bound)
        }
    }

    fn period_us(&self) -> u64 {
        self.period_ticks * TICK_US
    }

    fn ttl_us(&self) -> u64 {
        self.ttl_ticks * TICK_US
    }

    /// The store's id of `process`'s request number `request`: distinct for every request,
    /// never `NOT_WAITING`.
    pub fn id(&self, process: usize, request: u8) -> u64 {
        let processes = self.processes.len() as u64;
        1 + process as u64 + processes * u64::from(request)
    }
}

/// The place the protocol says a waiting request holds: when its current stay began, and its
/// last ask. It is live until `asked + ttl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Standing {
    pub arrival: u64,
    pub asked: u64,
}

/// A process's current (or last) request, as the records see it. A place that stopped being
/// live is dropped (`None`) after every step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    /// Denied, still waiting; `denied` is the reason of its last denial. `let_go`: it stood
    /// for the hold bound, and now asks as a request that does not wait, with no place.
    Waiting {
        place: Option<Standing>,
        denied: DenyReason,
        let_go: bool,
    },
    /// Granted; `waited`: denied at least once before.
    Granted {
        waited: bool,
    },
    /// A request that does not wait, denied.
    Denied {
        denied: DenyReason,
    },
    GaveUp,
    /// Died with its process while waiting; its place, if live, is in `QueueState::dead`.
    Crashed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessRecord {
    pub phase: Phase,
    /// Requests started; the current (or last) one is number `started - 1`.
    pub started: u8,
}

/// The live place of a request that died waiting, by the records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeadPlace {
    pub process: u8,
    pub request: u8,
    pub arrival: u64,
    pub asked: u64,
}

/// The model's record of one grant, kept while it counts in the current period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantNote {
    pub at: u64,
    pub units: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueueState {
    /// The store's clock, in microseconds.
    pub now: u64,
    // The store's state: the counter, and its queue's places as the store keeps them
    // (`queue::encode`).
    pub counter: Counter,
    pub queue: Vec<u8>,
    // The model's own records (see the module doc); the store never reads them.
    pub processes: Vec<ProcessRecord>,
    /// Sorted.
    pub dead: Vec<DeadPlace>,
    pub grants: Vec<GrantNote>,
    /// A grant took units a live higher waiter could use.
    pub lower_granted: bool,
    /// A grant took units a live waiter of its priority, ahead of it, could use.
    pub overtaken: bool,
    /// A request with no live place ahead was denied although the counter had room.
    pub starved: bool,
    /// A queued denial was owed to more than the live places ahead.
    pub stale_denial: bool,
    /// A queued denial was owed to the live places ahead only as counted against the units
    /// open to the request's priority: each of them had room at its own.
    pub needless_queue: bool,
    /// A queued denial was owed to places that began their stay the hold bound ago or more.
    pub overheld: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueAction {
    /// The process asks (a new request, or its waiting one asks again) and the store decides.
    Ask { process: usize },
    /// The process gives its waiting request up (a deadline, a cancellation): it leaves.
    GiveUp { process: usize },
    /// The process crashes while its request waits: the place stays in the store.
    Crash { process: usize },
    /// The store's clock moves one tick.
    Tick,
}

fn ms(us: u64) -> String {
    if us.is_multiple_of(TICK_US) {
        format!("{}ms", us / TICK_US)
    } else {
        format!("{us}us")
    }
}

impl fmt::Display for QueueAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueAction::Ask { process } => write!(f, "process {process}: ask"),
            QueueAction::GiveUp { process } => write!(f, "process {process}: give up"),
            QueueAction::Crash { process } => write!(f, "process {process}: crash"),
            QueueAction::Tick => write!(f, "store clock: +1 ms"),
        }
    }
}

impl fmt::Display for QueueState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store clock {}", ms(self.now))?;
        for (index, record) in self.processes.iter().enumerate() {
            write!(f, "\nprocess {index}: ")?;
            if record.started > 1 {
                write!(f, "request {}: ", record.started - 1)?;
            }
            match record.phase {
                Phase::Idle => write!(f, "idle")?,
                Phase::Waiting {
                    place,
                    denied,
                    let_go,
                } => {
                    let held = if let_go { "let go, " } else { "" };
                    write!(f, "waiting ({held}denied: {}), ", denied.as_str())?;
                    match place {
                        Some(standing) => write!(
                            f,
                            "place since {}, last asked {}",
                            ms(standing.arrival),
                            ms(standing.asked)
                        )?,
                        None => write!(f, "no live place")?,
                    }
                }
                Phase::Granted { waited } => {
                    write!(f, "granted{}", if waited { " after waiting" } else { "" })?;
                }
                Phase::Denied { denied } => {
                    write!(f, "denied (asked once: {})", denied.as_str())?;
                }
                Phase::GaveUp => write!(f, "gave up")?,
                Phase::Crashed => write!(f, "crashed")?,
            }
        }
        write!(f, "\nrecords: dead places [")?;
        for (index, dead) in self.dead.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(
                f,
                "{separator}process {} request {} since {}, last asked {}",
                dead.process,
                dead.request,
                ms(dead.arrival),
                ms(dead.asked)
            )?;
        }
        write!(f, "], grants counting now [")?;
        for (index, note) in self.grants.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(f, "{separator}{} at {}", note.units, ms(note.at))?;
        }
        write!(f, "]\nstore queue: [")?;
        let processes = self.processes.len() as u64;
        for (index, place) in queue::decode(&self.queue).iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            let number = place.rank.id - 1;
            write!(
                f,
                "{separator}process {} request {} (priority {}, arrival {}, cost {}, until {})",
                number % processes,
                number / processes,
                place.rank.priority,
                ms(place.rank.arrival_us),
                place.cost,
                if place.expires_us == u64::MAX {
                    "ever".to_owned()
                } else {
                    ms(place.expires_us)
                }
            )?;
        }
        write!(f, "]\nstore counter: {:?}", self.counter)
    }
}

/// A priority as the queue orders it: higher first.
pub fn level(priority: Priority) -> u64 {
    match priority {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
    }
}

/// A live place by the records.
#[derive(Clone, Copy, Debug)]
struct Held {
    process: usize,
    id: u64,
    level: u64,
    arrival: u64,
    cost: u64,
    /// Its request is alive and waiting (not a dead one's).
    alive: bool,
}

/// A request asking, by the records: where it stands.
#[derive(Clone, Copy, Debug)]
struct Asker {
    /// `None`: it does not wait.
    id: Option<u64>,
    level: u64,
    arrival: u64,
}

impl Held {
    /// Whether this place is ahead of `asker`: a higher priority, or the same and an earlier
    /// (arrival, id); a request that does not wait stands behind every place of its priority
    /// or higher.
    fn ahead_of(&self, asker: &Asker) -> bool {
        if Some(self.id) == asker.id {
            return false;
        }
        if self.level != asker.level {
            return self.level > asker.level;
        }
        match asker.id {
            None => true,
            Some(id) => (self.arrival, self.id) < (asker.arrival, id),
        }
    }
}

#[derive(Clone, Debug)]
pub struct QueueModel {
    pub setup: Setup,
    policy: Policy,
}

impl QueueModel {
    pub fn new(setup: Setup) -> Result<QueueModel, PolicyError> {
        if matches!(setup.algorithm, Algorithm::Gcra { .. }) {
            return Err(PolicyError {
                field: "algorithm",
                reason: "the records count sliding and fixed limits only".to_owned(),
            });
        }
        let policy = Policy::rate(
            setup.limit,
            setup.period_us(),
            0,
            setup.algorithm,
            setup.reserve,
        )?;
        Ok(QueueModel { setup, policy })
    }

    /// Whether a grant at `at` still counts at `now`, by the records.
    fn counts(&self, at: u64, now: u64) -> bool {
        let period = self.setup.period_us();
        match self.setup.algorithm {
            Algorithm::Fixed => at / period == now / period,
            _ => at + period > now,
        }
    }

    fn used(state: &QueueState) -> u64 {
        state.grants.iter().map(|note| note.units).sum()
    }

    /// Units open to `priority` at the store's now, by the records.
    fn room(&self, state: &QueueState, priority: Priority) -> u64 {
        self.policy
            .capacity_for(priority)
            .saturating_sub(Self::used(state))
    }

    /// The live places by the records: waiting requests' and dead ones'.
    fn held(&self, state: &QueueState) -> Vec<Held> {
        let mut held = Vec::new();
        for (process, record) in state.processes.iter().enumerate() {
            if let Phase::Waiting {
                place: Some(standing),
                ..
            } = record.phase
            {
                let spec = self.setup.processes[process];
                held.push(Held {
                    process,
                    id: self.setup.id(process, record.started - 1),
                    level: level(spec.priority),
                    arrival: standing.arrival,
                    cost: spec.cost,
                    alive: true,
                });
            }
        }
        for dead in &state.dead {
            let process = usize::from(dead.process);
            let spec = self.setup.processes[process];
            held.push(Held {
                process,
                id: self.setup.id(process, dead.request),
                level: level(spec.priority),
                arrival: dead.arrival,
                cost: spec.cost,
                alive: false,
            });
        }
        held
    }

    /// Where `process`'s request stands at the store's now, by the records: a waiting one keeps
    /// its live place's arrival, a newcomer arrives now.
    fn asker(&self, state: &QueueState, process: usize) -> Asker {
        let spec = self.setup.processes[process];
        let record = state.processes[process];
        let (request, arrival) = match record.phase {
            Phase::Waiting { place, .. } => (
                record.started - 1,
                place.map_or(state.now, |standing| standing.arrival),
            ),
            _ => (record.started, state.now),
        };
        Asker {
            id: (spec.waits && !self.lets_go(state, process))
                .then(|| self.setup.id(process, request)),
            level: level(spec.priority),
            arrival,
        }
    }

    /// Whether `process`'s ask in `state` is a waiter's that is let go (or was): its stay
    /// began the hold bound ago or more. It gives its place up and asks as one that does not
    /// wait.
    fn lets_go(&self, state: &QueueState, process: usize) -> bool {
        let Some(hold) = self.setup.hold_ticks else {
            return false;
        };
        if self.setup.rule == Rule::NeverLetGo {
            return false;
        }
        match state.processes[process].phase {
            Phase::Waiting { let_go: true, .. } => true,
            Phase::Waiting {
                place: Some(standing),
                ..
            } => standing.arrival + hold * TICK_US <= state.now,
            _ => false,
        }
    }

    /// The store decides an ask of `process`'s request `request`, as the script does; `let_go`:
    /// a waiter let go, which first gives up its place and asks as one that does not wait.
    fn decide(
        &self,
        next: &mut QueueState,
        process: usize,
        request: u8,
        let_go: bool,
    ) -> Result<(), DenyReason> {
        let spec = self.setup.processes[process];
        let now = next.now;
        let id = if spec.waits && !let_go {
            self.setup.id(process, request)
        } else {
            NOT_WAITING
        };
        let mut places = queue::decode(&next.queue);
        if let_go {
            queue::leave(&mut places, self.setup.id(process, request));
        }
        // 1, 2: the live places, where the request stands and what is ahead of it.
        queue::expire(&mut places, now);
        let mut rank = queue::rank_of(&places, now, level(spec.priority), id);
        if self.setup.rule == Rule::RenewalRearrives && id != NOT_WAITING {
            rank.arrival_us = now;
        }
        let mut ahead = queue::ahead(&places, now, &rank);
        if self.setup.rule == Rule::OwnPlaceAhead {
            ahead += places
                .iter()
                .filter(|place| place.rank.id == rank.id && place.expires_us > now)
                .map(|place| place.cost)
                .sum::<u64>();
        }
        // 3: the counter's own check; 4: room for the places ahead too.
        let check = |counter: &mut Counter, units: u64| {
            counter
                .check(&self.policy, now, units, spec.priority)
                .expect("the model's costs are within the limit")
                .is_none()
        };
        let verdict = if !check(&mut next.counter, spec.cost) {
            Err(DenyReason::Capacity)
        } else if ahead > 0 {
            let open = self.policy.capacity_for(spec.priority);
            match queue::need(spec.cost, ahead, open) {
                Some(units) if check(&mut next.counter, units) => Ok(()),
                _ => Err(DenyReason::Queued),
            }
        } else {
            Ok(())
        };
        // 5: grant and leave, or stand.
        match verdict {
            Ok(()) => {
                let _ = next
                    .counter
                    .grant(&self.policy, now, spec.cost, spec.priority, false);
                queue::leave(&mut places, id);
            }
            Err(_) if id != NOT_WAITING => match self.setup.rule {
                Rule::NoRegistration => {}
                Rule::NoExpiry => {
                    queue::stand(&mut places, rank, spec.cost, now, u64::MAX);
                }
                _ => {
                    queue::stand(&mut places, rank, spec.cost, now, self.setup.ttl_us());
                }
            },
            Err(_) => {}
        }
        next.queue = queue::encode(&places);
        verdict
    }

    /// Whether a grant of `units` takes units from a live place of a live waiter `by` accepts:
    /// its cost fitted in the room at its priority just before, and not just after.
    fn takes_from(
        &self,
        state: &QueueState,
        held: &[Held],
        units: u64,
        by: impl Fn(&Held) -> bool,
    ) -> bool {
        held.iter()
            .filter(|place| place.alive && by(place))
            .any(|place| {
                let priority = self.setup.processes[place.process].priority;
                let before = self.room(state, priority);
                before >= place.cost && before.saturating_sub(units) < place.cost
            })
    }

    /// Whether granting `asker` its `cost` leaves every live place ahead of it room for its
    /// own cost at its own priority, served in order, by the records.
    fn leaves_room_ahead(
        &self,
        state: &QueueState,
        held: &[Held],
        asker: &Asker,
        cost: u64,
    ) -> bool {
        let mut ahead: Vec<&Held> = held.iter().filter(|place| place.ahead_of(asker)).collect();
        ahead.sort_by_key(|place| (Reverse(place.level), place.arrival, place.id));
        let mut taken = Self::used(state) + cost;
        ahead.into_iter().all(|place| {
            taken += place.cost;
            taken
                <= self
                    .policy
                    .capacity_for(self.setup.processes[place.process].priority)
        })
    }

    /// Judge the store's verdict on `process`'s ask against the records of `state` (before
    /// it), and record the ask.
    fn record(
        &self,
        state: &QueueState,
        next: &mut QueueState,
        process: usize,
        verdict: Result<(), DenyReason>,
    ) {
        let spec = self.setup.processes[process];
        let now = state.now;
        let room = self.room(state, spec.priority);
        let let_go = self.lets_go(state, process);
        // A waiter let go gave its own place up before the store decided.
        let held: Vec<Held> = self
            .held(state)
            .into_iter()
            .filter(|place| !(let_go && place.alive && place.process == process))
            .collect();
        let asker = self.asker(state, process);
        let live_ahead: u64 = held
            .iter()
            .filter(|place| place.ahead_of(&asker))
            .map(|place| place.cost)
            .sum();
        let waited = matches!(state.processes[process].phase, Phase::Waiting { .. });
        // The places ahead that began their stay less than the hold bound ago.
        let ahead_within_hold: u64 = held
            .iter()
            .filter(|place| place.ahead_of(&asker))
            .filter(|place| {
                self.setup
                    .hold_ticks
                    .is_none_or(|hold| place.arrival + hold * TICK_US >= now)
            })
            .map(|place| place.cost)
            .sum();
        next.processes[process].phase = match verdict {
            Ok(()) => {
                let higher = |place: &Held| place.level > asker.level;
                let earlier = |place: &Held| place.level == asker.level && place.ahead_of(&asker);
                next.lower_granted |= self.takes_from(state, &held, spec.cost, higher);
                next.overtaken |= self.takes_from(state, &held, spec.cost, earlier);
                next.grants.push(GrantNote {
                    at: now,
                    units: spec.cost,
                });
                Phase::Granted { waited }
            }
            Err(denied) => {
                let stale = denied == DenyReason::Queued && spec.cost + live_ahead <= room;
                next.starved |= live_ahead == 0 && spec.cost <= room;
                next.stale_denial |= stale;
                next.overheld |=
                    denied == DenyReason::Queued && !stale && spec.cost + ahead_within_hold <= room;
                next.needless_queue |= denied == DenyReason::Queued
                    && !stale
                    && spec.cost <= room
                    && self.leaves_room_ahead(state, &held, &asker, spec.cost);
                if spec.waits {
                    Phase::Waiting {
                        place: (!let_go).then_some(Standing {
                            arrival: asker.arrival,
                            asked: now,
                        }),
                        denied,
                        let_go,
                    }
                } else {
                    Phase::Denied { denied }
                }
            }
        };
    }

    /// The most units granted in any period, by the records.
    fn worst_period(&self, state: &QueueState) -> u64 {
        let period = self.setup.period_us();
        state
            .grants
            .iter()
            .map(|start| {
                state
                    .grants
                    .iter()
                    .filter(|note| match self.setup.algorithm {
                        Algorithm::Fixed => note.at / period == start.at / period,
                        _ => note.at >= start.at && note.at < start.at + period,
                    })
                    .map(|note| note.units)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Drop what no longer counts at the store's now: expired places from the store's queue and
    /// from the records, grants past their period from the records, and the counter's own
    /// expired units. Every decision starts with the same (`queue::expire`, the core's
    /// normalising), and a place or grant that stopped counting never counts again, so this
    /// changes no decision; it keeps states that differ only in what was not dropped yet from
    /// counting as two.
    fn tidy(&self, state: &mut QueueState) {
        let now = state.now;
        let ttl = self.setup.ttl_us();
        let mut places = queue::decode(&state.queue);
        if queue::expire(&mut places, now) {
            state.queue = queue::encode(&places);
        }
        let _ = state.counter.status(&self.policy, now, Priority::High);
        state.grants.retain(|note| self.counts(note.at, now));
        state.dead.retain(|dead| dead.asked + ttl > now);
        state.dead.sort_unstable();
        for record in &mut state.processes {
            if let Phase::Waiting { place, .. } = &mut record.phase
                && place.is_some_and(|standing| standing.asked + ttl <= now)
            {
                *place = None;
            }
        }
    }

    /// Whether `process`'s request asked at the store's now and was denied as queued.
    fn queued_now(state: &QueueState, process: usize) -> bool {
        matches!(
            state.processes[process].phase,
            Phase::Waiting {
                place: Some(standing),
                denied: DenyReason::Queued,
                ..
            } if standing.asked == state.now
        )
    }
}

impl Model for QueueModel {
    type State = QueueState;
    type Action = QueueAction;

    fn init_states(&self) -> Vec<QueueState> {
        vec![QueueState {
            now: 0,
            counter: Counter::new(0),
            queue: Vec::new(),
            processes: vec![
                ProcessRecord {
                    phase: Phase::Idle,
                    started: 0,
                };
                self.setup.processes.len()
            ],
            dead: Vec::new(),
            grants: Vec::new(),
            lower_granted: false,
            overtaken: false,
            starved: false,
            stale_denial: false,
            needless_queue: false,
            overheld: false,
        }]
    }

    fn actions(&self, state: &QueueState, actions: &mut Vec<QueueAction>) {
        for (process, record) in state.processes.iter().enumerate() {
            if let Phase::Waiting { .. } = record.phase {
                actions.push(QueueAction::Ask { process });
                if self.setup.give_ups {
                    actions.push(QueueAction::GiveUp { process });
                }
                if self.setup.crashes {
                    actions.push(QueueAction::Crash { process });
                }
            } else if record.started < self.setup.processes[process].requests {
                actions.push(QueueAction::Ask { process });
            }
        }
        let next_tick = state.now + TICK_US;
        let in_time = |record: &ProcessRecord| match record.phase {
            Phase::Waiting {
                place: Some(standing),
                ..
            } => {
                // A waiter at its hold bound asks (and is let go) before the clock moves on.
                let held_out = self.setup.rule != Rule::NeverLetGo
                    && self
                        .setup
                        .hold_ticks
                        .is_some_and(|hold| standing.arrival + hold * TICK_US <= state.now);
                standing.asked + self.setup.ttl_us() > next_tick && !held_out
            }
            _ => true,
        };
        if state.now < self.setup.horizon_ticks * TICK_US
            && (self.setup.slow_waiters || state.processes.iter().all(in_time))
        {
            actions.push(QueueAction::Tick);
        }
    }

    fn next_state(&self, state: &QueueState, action: QueueAction) -> Option<QueueState> {
        let mut next = state.clone();
        match action {
            QueueAction::Ask { process } => {
                let record = state.processes[process];
                let request = match record.phase {
                    Phase::Waiting { .. } => record.started - 1,
                    _ => {
                        next.processes[process].started += 1;
                        record.started
                    }
                };
                let let_go = self.lets_go(state, process);
                let verdict = self.decide(&mut next, process, request, let_go);
                self.record(state, &mut next, process, verdict);
            }
            QueueAction::GiveUp { process } => {
                let request = state.processes[process].started - 1;
                let mut places = queue::decode(&next.queue);
                queue::leave(&mut places, self.setup.id(process, request));
                next.queue = queue::encode(&places);
                next.processes[process].phase = Phase::GaveUp;
            }
            QueueAction::Crash { process } => {
                let record = state.processes[process];
                if let Phase::Waiting {
                    place: Some(standing),
                    ..
                } = record.phase
                {
                    next.dead.push(DeadPlace {
                        process: u8::try_from(process).expect("the model is small"),
                        request: record.started - 1,
                        arrival: standing.arrival,
                        asked: standing.asked,
                    });
                }
                next.processes[process].phase = Phase::Crashed;
            }
            QueueAction::Tick => next.now += TICK_US,
        }
        self.tidy(&mut next);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_LOWER_GRANT, |_, state: &QueueState| !state.lower_granted),
            Property::always(FIRST_COME, |_, state: &QueueState| !state.overtaken),
            Property::always(HEAD_NOT_STARVED, |_, state: &QueueState| !state.starved),
            Property::always(DEAD_PLACES_BOUNDED, |_, state: &QueueState| {
                !state.stale_denial
            }),
            Property::always(NO_OVERSHOOT, |model: &Self, state: &QueueState| {
                model.worst_period(state) <= model.setup.limit
            }),
            Property::always(QUEUED_ONLY_WHEN_NEEDED, |_, state: &QueueState| {
                !state.needless_queue
            }),
            Property::always(HOLDS_BOUNDED, |_, state: &QueueState| !state.overheld),
            Property::sometimes(SOMETIMES_HELD_BACK, |model: &Self, state: &QueueState| {
                (0..state.processes.len()).any(|process| {
                    let spec = model.setup.processes[process];
                    Self::queued_now(state, process)
                        && spec.cost <= model.room(state, spec.priority)
                })
            }),
            Property::sometimes(
                SOMETIMES_HELD_BY_DEAD,
                |model: &Self, state: &QueueState| {
                    (0..state.processes.len()).any(|process| {
                        let asker = model.asker(state, process);
                        Self::queued_now(state, process)
                            && model
                                .held(state)
                                .iter()
                                .any(|place| !place.alive && place.ahead_of(&asker))
                    })
                },
            ),
            Property::sometimes(
                SOMETIMES_GRANTED_AFTER_WAITING,
                |model: &Self, state: &QueueState| {
                    state.processes.iter().enumerate().any(|(process, record)| {
                        record.phase == Phase::Granted { waited: true }
                            && model.setup.processes[process].priority == Priority::Low
                    })
                },
            ),
        ]
    }
}
