//! The Redis Cluster store's cross-slot protocol as a state machine: clients whose requests
//! name counters in several slots, against slots whose state is real `tollgate_core::Counter`s.
//!
//! A request is decided as `tollgate_redis_protocol::plan` says, and the model drives it with
//! that very code: `plan::groups` orders the request's counters by slot, `Progress::step` names
//! each next step, and `plan::records` says which grants are recorded for a refund. Asking a slot
//! is one atomic step, as the script is: `check` every counter of the slot's group, then `grant`
//! them all only if all allow. A denial rolls back the groups granted before it: one
//! `Counter::commit(seq, 0)` per granted counter, in any order and interleaved with everything
//! else (the store sends them all at once), then the request is answered denied.
//!
//! Clients interleave freely, the clock moves one tick at a time, and a client may crash at any
//! step, losing its request: what it was granted stays counted until it expires, never rolled
//! back. A slot's answer and its arrival at the client are one step: time passing or a crash
//! between the two is the same as after the arrival, since the client's next step is its own.
//!
//! # What the properties read
//!
//! Never the counters: the model's own records, kept as an outside observer would: every grant
//! (counter, store time, request) and whether a rollback gave it back, and every request's
//! answer (granted, denied, or none: crashed).
//!
//! - **No overshoot**: on each counter, the units held (granted and not given back) in any
//!   interval `[t, t + period)` are at most the limit.
//! - **All or nothing**: a request answered granted holds a grant on every counter it names; a
//!   request answered denied holds none that still counts. A crashed request may hold a part:
//!   its caller was never answered, so it never uses it.
//! - **Denied only when full**: a slot denies a request only when one of its counters is full of
//!   units held by requests that were not answered denied (under way, granted or crashed). So a
//!   request that finds room on every counter is granted, and units of a denied request never
//!   starve anyone.
//! - **No livelock**: two requests under way never deny each other, each turned away by a part
//!   the other holds. Both would be answered denied although either alone would be granted, and
//!   the same could happen again on every retry.
//!
//! Two broken variants show the properties are not vacuous: a denial that keeps the grants made
//! before it ([`OnDenial::KeepGrants`]), and slots asked in the order the request names them
//! rather than ascending ([`Order::AsNamed`]).

use std::fmt;

use stateright::{Model, Property};
use tollgate_core::{Algorithm, Counter, Policy, PolicyError, Priority, Reserve};
use tollgate_redis_protocol::plan::{self, Group, Progress, Step};

use crate::Bound;

/// One tick of the store's clock: 1 ms, the shortest period a policy accepts.
pub const TICK_US: u64 = 1_000;

/// Units each request asks of each counter it names.
const COST: u64 = 1;

pub const NO_OVERSHOOT: &str = "no overshoot: units held on a counter in any period <= limit";
pub const ALL_OR_NOTHING: &str =
    "all or nothing: granted holds every counter, denied holds none once answered";
pub const DENIED_ONLY_WHEN_FULL: &str =
    "denied only when full: a denial's counter is full of units of requests not denied";
pub const NO_LIVELOCK: &str = "no livelock: two requests under way never deny each other";
pub const SOMETIMES_GRANTED: &str = "sometimes: a request granted across slots";
pub const SOMETIMES_ROLLED_BACK: &str = "sometimes: a partial grant rolled back";
pub const SOMETIMES_CRASH_HOLDS: &str = "sometimes: a crashed request's grant still counts";

/// Every `always` property, for tests that expect all of them to hold.
pub const ALL: [&str; 4] = [
    NO_OVERSHOOT,
    ALL_OR_NOTHING,
    DENIED_ONLY_WHEN_FULL,
    NO_LIVELOCK,
];

/// What a client does with the grants it holds when a slot denies its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnDenial {
    /// `Step::RollBack`: give back every group granted before the denial, then answer.
    RollBack,
    /// Broken on purpose: answer the denial at once, leaving the earlier grants counted (the
    /// caller may then retry).
    KeepGrants,
}

/// The order in which a request's slots are asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Order {
    /// `plan::groups`: ascending slots.
    Ascending,
    /// Broken on purpose: the slots in the order the request first names them.
    AsNamed,
}

/// The bounds and parameters of one model.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Each counter's slot.
    pub slots: Vec<u16>,
    /// Each client's request: the counters it names, in its own order.
    pub requests: Vec<Vec<usize>>,
    /// Sliding rate limit of every counter: units per period.
    pub rate_limit: u64,
    pub period_ticks: u64,
    /// The store's clock stops here.
    pub horizon_ticks: u64,
    /// Requests each client sends, one after the other (a crash ends one).
    pub attempts: u8,
    pub crashes: bool,
    pub on_denial: OnDenial,
    pub order: Order,
}

impl Setup {
    /// Three counters in two slots: counter 0 in slot 7, counters 1 and 2 in slot 3. A limit of
    /// 1 per 2 ms, crashes, 2 ms of clock (so grants expire, some before their rollback).
    /// Client 0 names counters 0 and 1 (slots 7 then 3: it asks 3 first), client 1 counters 1,
    /// 2 and 0 (slot 3's group holds two counters, decided together), client 2 counter 0
    /// alone. Small: two requests each. Large: three each.
    pub fn contended(bound: Bound) -> Setup {
        Setup {
            slots: vec![7, 3, 3],
            requests: vec![vec![0, 1], vec![1, 2, 0], vec![0]],
            rate_limit: 1,
            period_ticks: 2,
            horizon_ticks: 2,
            attempts: if bound.is_large() { 3 } else { 2 },
            crashes: true,
            on_denial: OnDenial::RollBack,
            order: Order::Ascending,
        }
    }

    /// The same with a limit of 2 per 2 ms, so a counter holds the grants of two requests at
    /// once and a denial needs a third. Small: one request each. Large: two each.
    pub fn limit_two(bound: Bound) -> Setup {
        Setup {
            rate_limit: 2,
            attempts: if bound.is_large() { 2 } else { 1 },
            ..Setup::contended(bound)
        }
    }

    fn period_us(&self) -> u64 {
        self.period_ticks * TICK_US
    }
}

/// A grant a client holds: the counter, its reservation number, and the group it was asked in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    pub counter: u8,
    pub seq: u64,
    pub group: u8,
}

/// A client's current request. A crash or an answer ends it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    /// Asking its groups in turn; `next` is the group it asks next.
    Asking {
        progress: Progress,
        next: u8,
        held: Vec<Held>,
    },
    /// Denied: giving back `pending`, in any order; answered denied once none is left.
    /// `blocked_by`: the requests under way (client, request number) whose grants the denying
    /// slot was full of.
    RollingBack {
        pending: Vec<Held>,
        blocked_by: Vec<(u8, u8)>,
    },
}

/// How a client's request ended, as its caller saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    Granted,
    Denied,
    /// The client crashed before answering.
    Crashed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub phase: Phase,
    /// The answers to its requests so far; the request under way is number `answers.len()`.
    pub answers: Vec<Answer>,
}

/// The model's record of one grant on one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantNote {
    pub counter: u8,
    pub at: u64,
    pub client: u8,
    /// The client's request number.
    pub request: u8,
    /// A rollback gave it back.
    pub given_back: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CrossSlotState {
    /// The store's clock (one clock for every slot), in microseconds.
    pub now: u64,
    /// One counter per entry of `Setup::slots`.
    pub counters: Vec<Counter>,
    pub clients: Vec<Client>,
    // The model's own records (see the module doc); the store never reads them.
    pub notes: Vec<GrantNote>,
    /// A slot denied although none of the counters that denied was full by the records.
    pub needless_denial: bool,
    /// A request was denied by a part held by another request under way that it had itself
    /// denied.
    pub mutual_denial: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrossSlotAction {
    /// The client asks its next group's slot (its first, if idle), and the slot decides.
    Ask {
        client: usize,
    },
    /// The client gives back one grant (`commit(seq, 0)`) of a denied request.
    RollBack {
        client: usize,
        counter: u8,
    },
    Crash {
        client: usize,
    },
    /// The store's clock moves one tick.
    Tick,
}

impl fmt::Display for CrossSlotAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrossSlotAction::Ask { client } => write!(f, "client {client}: ask its next slot"),
            CrossSlotAction::RollBack { client, counter } => {
                write!(
                    f,
                    "client {client}: roll back its grant on counter {counter}"
                )
            }
            CrossSlotAction::Crash { client } => write!(f, "client {client}: crash"),
            CrossSlotAction::Tick => write!(f, "store clock: +1 ms"),
        }
    }
}

impl fmt::Display for CrossSlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store clock {}ms", self.now / TICK_US)?;
        for (index, client) in self.clients.iter().enumerate() {
            write!(f, "\nclient {index}: answers {:?}, ", client.answers)?;
            match &client.phase {
                Phase::Idle => write!(f, "idle")?,
                Phase::Asking { next, held, .. } => {
                    write!(f, "asking group {next}, holding {}", HeldList(held))?;
                }
                Phase::RollingBack {
                    pending,
                    blocked_by,
                } => write!(
                    f,
                    "rolling back {} (denied by requests {blocked_by:?})",
                    HeldList(pending)
                )?,
            }
        }
        write!(f, "\nrecords: grants [")?;
        for (index, note) in self.notes.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(
                f,
                "{separator}counter {} at {}ms for client {} request {}{}",
                note.counter,
                note.at / TICK_US,
                note.client,
                note.request,
                if note.given_back { " given back" } else { "" }
            )?;
        }
        write!(f, "]")
    }
}

struct HeldList<'a>(&'a [Held]);

impl fmt::Display for HeldList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (index, held) in self.0.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(f, "{separator}counter {} seq {}", held.counter, held.seq)?;
        }
        write!(f, "]")
    }
}

#[derive(Clone, Debug)]
pub struct CrossSlotModel {
    pub setup: Setup,
    policy: Policy,
    /// Each client's request as groups of counters (indices into `Setup::slots`), in the order
    /// they are asked.
    plans: Vec<Vec<Group>>,
}

impl CrossSlotModel {
    pub fn new(setup: Setup) -> Result<CrossSlotModel, PolicyError> {
        let policy = Policy::rate(
            setup.rate_limit,
            setup.period_ticks * TICK_US,
            0,
            Algorithm::Sliding,
            Reserve::default(),
        )?;
        let plans = setup
            .requests
            .iter()
            .map(|request| {
                let slots: Vec<u16> = request
                    .iter()
                    .map(|&counter| setup.slots[counter])
                    .collect();
                let groups = match setup.order {
                    Order::Ascending => plan::groups(&slots),
                    Order::AsNamed => groups_as_named(&slots),
                };
                // The model's groups name counters, not positions in the request.
                groups
                    .into_iter()
                    .map(|group| Group {
                        slot: group.slot,
                        takes: group.takes.iter().map(|&take| request[take]).collect(),
                    })
                    .collect()
            })
            .collect();
        Ok(CrossSlotModel {
            setup,
            policy,
            plans,
        })
    }

    /// Units on `counter` by the records: grants not given back that still count at the
    /// store's now, of requests `counts` accepts.
    fn held_units(
        &self,
        state: &CrossSlotState,
        counter: u8,
        counts: impl Fn(&GrantNote) -> bool,
    ) -> u64 {
        let period = self.setup.period_us();
        state
            .notes
            .iter()
            .filter(|note| {
                note.counter == counter
                    && !note.given_back
                    && note.at + period > state.now
                    && counts(note)
            })
            .count() as u64
            * COST
    }

    /// The answer to request `request` of `client`, if it was answered (or crashed).
    fn answer(state: &CrossSlotState, client: u8, request: u8) -> Option<Answer> {
        state.clients[usize::from(client)]
            .answers
            .get(usize::from(request))
            .copied()
    }

    /// The most units held on `counter` in any interval `[t, t + period)`.
    fn worst_period(&self, state: &CrossSlotState, counter: u8) -> u64 {
        let period = self.setup.period_us();
        let held = |note: &&GrantNote| note.counter == counter && !note.given_back;
        // The worst interval starts at some grant's time.
        state
            .notes
            .iter()
            .filter(held)
            .map(|start| {
                state
                    .notes
                    .iter()
                    .filter(held)
                    .filter(|note| note.at >= start.at && note.at < start.at + period)
                    .count() as u64
                    * COST
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether every request's answer agrees with what it holds by the records.
    fn all_or_nothing(&self, state: &CrossSlotState) -> bool {
        let period = self.setup.period_us();
        state.clients.iter().enumerate().all(|(client, record)| {
            record.answers.iter().enumerate().all(|(request, answer)| {
                let mine = |note: &&GrantNote| {
                    usize::from(note.client) == client && usize::from(note.request) == request
                };
                match answer {
                    Answer::Granted => {
                        self.setup.requests[client].iter().all(|&counter| {
                            state.notes.iter().filter(mine).any(|note| {
                                usize::from(note.counter) == counter && !note.given_back
                            })
                        })
                    }
                    Answer::Denied => state
                        .notes
                        .iter()
                        .filter(mine)
                        .all(|note| note.given_back || note.at + period <= state.now),
                    Answer::Crashed => true,
                }
            })
        })
    }

    /// Ask `client`'s group `next`: the slot's decision, then the client's next step.
    fn ask(&self, next: &mut CrossSlotState, client: usize, mut progress: Progress, group: u8) {
        let now = next.now;
        let groups = &self.plans[client];
        let count = groups.len();
        let index = usize::from(group);
        let counters = &groups[index].takes;
        let request = request_number(&next.clients[client]);
        let mut held = match &next.clients[client].phase {
            Phase::Asking { held, .. } => held.clone(),
            _ => Vec::new(),
        };
        // As the script does it: check every counter of the slot, grant all only if all allow.
        let denying: Vec<u8> = counters
            .iter()
            .filter(|&&counter| {
                next.counters[counter]
                    .check(&self.policy, now, COST, Priority::Normal)
                    .expect("the model's cost is within the limit")
                    .is_some()
            })
            .map(|&counter| small(counter))
            .collect();
        let denied = !denying.is_empty();
        let mut blocked_by = Vec::new();
        if denied {
            self.judge_denial(next, client, request, &denying, &mut blocked_by);
        } else {
            let refundable = plan::records(index, count, false);
            for &counter in counters {
                let grant = next.counters[counter].grant(
                    &self.policy,
                    now,
                    COST,
                    Priority::Normal,
                    refundable,
                );
                held.push(Held {
                    counter: small(counter),
                    seq: grant.seq,
                    group,
                });
                next.notes.push(GrantNote {
                    counter: small(counter),
                    at: now,
                    client: small(client),
                    request,
                    given_back: false,
                });
            }
        }
        let phase = match progress.step(count, Some(denied)) {
            Step::Ask(group) => Phase::Asking {
                progress,
                next: small(group),
                held,
            },
            Step::Granted => {
                next.clients[client].answers.push(Answer::Granted);
                Phase::Idle
            }
            Step::RollBack(groups) => {
                let pending: Vec<Held> = held
                    .into_iter()
                    .filter(|held| groups.contains(&usize::from(held.group)))
                    .collect();
                if pending.is_empty() || self.setup.on_denial == OnDenial::KeepGrants {
                    next.clients[client].answers.push(Answer::Denied);
                    Phase::Idle
                } else {
                    Phase::RollingBack {
                        pending,
                        blocked_by,
                    }
                }
            }
        };
        next.clients[client].phase = phase;
    }

    /// Record whether a denial by the counters `denying` was owed to full counters, and whether
    /// it was owed to a request under way that this request's own grants had denied.
    fn judge_denial(
        &self,
        next: &mut CrossSlotState,
        client: usize,
        request: u8,
        denying: &[u8],
        blocked_by: &mut Vec<(u8, u8)>,
    ) {
        let state = &*next;
        let full = denying.iter().any(|&counter| {
            let not_denied = |note: &GrantNote| {
                Self::answer(state, note.client, note.request) != Some(Answer::Denied)
            };
            self.held_units(state, counter, not_denied) + COST > self.setup.rate_limit
        });
        for (other, record) in state.clients.iter().enumerate() {
            if other == client || record.phase == Phase::Idle {
                continue;
            }
            let other_request = request_number(record);
            let holds_a_part = denying.iter().any(|&counter| {
                self.held_units(state, counter, |note| {
                    usize::from(note.client) == other && note.request == other_request
                }) > 0
            });
            if holds_a_part {
                blocked_by.push((small(other), other_request));
            }
        }
        let mutual = blocked_by.iter().any(|&(other, _)| {
            matches!(
                &state.clients[usize::from(other)].phase,
                Phase::RollingBack { blocked_by, .. } if blocked_by.contains(&(small(client), request))
            )
        });
        next.needless_denial |= !full;
        next.mutual_denial |= mutual;
    }
}

/// The slots' groups in the order the request first names them: the broken [`Order::AsNamed`].
fn groups_as_named(slots: &[u16]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (index, &slot) in slots.iter().enumerate() {
        match groups.iter_mut().find(|group| group.slot == slot) {
            Some(group) => group.takes.push(index),
            None => groups.push(Group {
                slot,
                takes: vec![index],
            }),
        }
    }
    groups
}

fn request_number(client: &Client) -> u8 {
    small(client.answers.len())
}

/// An index of the model's few clients, counters or groups, as stored in its state.
fn small(index: usize) -> u8 {
    u8::try_from(index).expect("the model is small")
}

impl Model for CrossSlotModel {
    type State = CrossSlotState;
    type Action = CrossSlotAction;

    fn init_states(&self) -> Vec<CrossSlotState> {
        vec![CrossSlotState {
            now: 0,
            counters: vec![Counter::new(0); self.setup.slots.len()],
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    answers: Vec::new(),
                };
                self.setup.requests.len()
            ],
            notes: Vec::new(),
            needless_denial: false,
            mutual_denial: false,
        }]
    }

    fn actions(&self, state: &CrossSlotState, actions: &mut Vec<CrossSlotAction>) {
        for (client, record) in state.clients.iter().enumerate() {
            match &record.phase {
                Phase::Idle => {
                    if record.answers.len() < usize::from(self.setup.attempts) {
                        actions.push(CrossSlotAction::Ask { client });
                    }
                }
                Phase::Asking { .. } => actions.push(CrossSlotAction::Ask { client }),
                Phase::RollingBack { pending, .. } => {
                    for held in pending {
                        actions.push(CrossSlotAction::RollBack {
                            client,
                            counter: held.counter,
                        });
                    }
                }
            }
            if self.setup.crashes && record.phase != Phase::Idle {
                actions.push(CrossSlotAction::Crash { client });
            }
        }
        if state.now < self.setup.horizon_ticks * TICK_US {
            actions.push(CrossSlotAction::Tick);
        }
    }

    fn next_state(
        &self,
        state: &CrossSlotState,
        action: CrossSlotAction,
    ) -> Option<CrossSlotState> {
        let mut next = state.clone();
        let now = state.now;
        match action {
            CrossSlotAction::Ask { client } => {
                let (progress, group) = match &state.clients[client].phase {
                    Phase::Idle => {
                        let mut progress = Progress::default();
                        let count = self.plans[client].len();
                        let Step::Ask(group) = progress.step(count, None) else {
                            unreachable!("a request's first step is to ask its first group")
                        };
                        (progress, small(group))
                    }
                    Phase::Asking { progress, next, .. } => (progress.clone(), *next),
                    Phase::RollingBack { .. } => return None,
                };
                self.ask(&mut next, client, progress, group);
            }
            CrossSlotAction::RollBack { client, counter } => {
                let Phase::RollingBack { pending, .. } = &mut next.clients[client].phase else {
                    return None;
                };
                let position = pending.iter().position(|held| held.counter == counter)?;
                let held = pending.swap_remove(position);
                let done = pending.is_empty();
                // Gone (its period ended) is a normal answer: it no longer counts either way.
                let given_back = next.counters[usize::from(counter)]
                    .commit(&self.policy, now, held.seq, 0)
                    .is_ok_and(|committed| committed.refunded == COST);
                if given_back {
                    let request = request_number(&next.clients[client]);
                    for note in &mut next.notes {
                        if usize::from(note.client) == client
                            && note.request == request
                            && note.counter == counter
                        {
                            note.given_back = true;
                        }
                    }
                }
                if done {
                    next.clients[client].answers.push(Answer::Denied);
                    next.clients[client].phase = Phase::Idle;
                }
            }
            CrossSlotAction::Crash { client } => {
                next.clients[client].answers.push(Answer::Crashed);
                next.clients[client].phase = Phase::Idle;
            }
            CrossSlotAction::Tick => next.now = now + TICK_US,
        }
        // Every core operation first drops what no longer counts at its `now`; doing it after
        // every step changes no decision and merges states that differ only in what has not
        // been dropped yet (as in `protocol`).
        for counter in &mut next.counters {
            let _ = counter.status(&self.policy, next.now, Priority::Normal);
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_OVERSHOOT, |model: &Self, state: &CrossSlotState| {
                (0..state.counters.len()).all(|counter| {
                    model.worst_period(state, small(counter)) <= model.setup.rate_limit
                })
            }),
            Property::always(ALL_OR_NOTHING, |model: &Self, state: &CrossSlotState| {
                model.all_or_nothing(state)
            }),
            Property::always(DENIED_ONLY_WHEN_FULL, |_, state: &CrossSlotState| {
                !state.needless_denial
            }),
            Property::always(NO_LIVELOCK, |_, state: &CrossSlotState| {
                !state.mutual_denial
            }),
            Property::sometimes(SOMETIMES_GRANTED, |model: &Self, state: &CrossSlotState| {
                state.clients.iter().enumerate().any(|(client, record)| {
                    model.plans[client].len() > 1 && record.answers.contains(&Answer::Granted)
                })
            }),
            Property::sometimes(SOMETIMES_ROLLED_BACK, |_, state: &CrossSlotState| {
                state.notes.iter().any(|note| note.given_back)
            }),
            Property::sometimes(
                SOMETIMES_CRASH_HOLDS,
                |model: &Self, state: &CrossSlotState| {
                    let period = model.setup.period_us();
                    state.notes.iter().any(|note| {
                        !note.given_back
                            && note.at + period > state.now
                            && Self::answer(state, note.client, note.request)
                                == Some(Answer::Crashed)
                    })
                },
            ),
        ]
    }
}
