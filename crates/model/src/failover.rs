//! One Redis Cluster slot through failovers, restarts and resharding, decided with the loss
//! check of `tollgate_redis_protocol::loss` over a real `tollgate_core::Counter`.
//!
//! Nodes are Redis processes grouped in shards: a master and, in some shards, a replica. The
//! slot lives in one shard; its data there is the slot's generation and one counter (a
//! sliding rate limit), with the generation it was written in. Every decision is made by the
//! slot's master, as the script makes it: `loss::generation` on what the node holds, then
//! `loss::hold_until` for the counter, then the core's `check` and `grant`. A held counter is
//! held as `T.load` and `T.hold` do it: a counter found is kept and paused until the hold ends
//! (`Counter::pause`), a missing one starts as `Counter::recovering(now, until)`. The decision
//! writes back the generation it decided under and the counter, granted or not.
//!
//! What can happen, in any order: replication (a replica's copy becomes its master's data as
//! it is now, so the copy lags by any number of writes); a failover (the slot's replica is
//! promoted; the old master becomes a replica, or with a forced failover stays listed as a
//! master until the cluster marks it failing); a restart (the node gets a new run id and comes
//! back empty, or from its last snapshot); a snapshot; resharding (the slot's data is copied
//! exactly to another shard's master and deleted from its shard); the clock moving one tick.
//!
//! Owners are `node/run:replid` as the script names them: `loss::Owner { node: "a", run:
//! "a0:1" }`, node `a` in its first run (`a0`), with the replication id of its first term as a
//! master after the colon: every promotion draws a new one. (Only [`Check::Real`] reads the
//! term; under the other checks it stays 0, so that their states do not split on it.)
//!
//! # What the property reads
//!
//! **G6** (and G1 across nodes): in any interval `[t, t + period)` of the clock, the units
//! granted, by the model's record of every grant whichever node made it, are at most the
//! limit. Records never read a node's data.
//!
//! `loss::generation` keeps G6 in every setup here, each event alone and all at once. Three
//! flawed variants show the property is not vacuous: a loss check that only notices a missing
//! generation ([`Check::MissingOnly`]: a replica promoted without the last writes finds a
//! generation and keeps it); one that does not hold a counter written in an older generation
//! ([`Hold::StaleAsIs`]: the stale counter is used as it is); and the rule the store used
//! before ([`Check::MovedExemption`]: a generation of another node that is a live master is
//! kept, as a slot moved here, and owners name no term), which the checker gets past in four
//! ways, each a setup here (see `docs/models.md`): a failback to a master that has not caught up
//! ([`Setup::failback`]: it finds its own generation, so nothing looks lost), and three through
//! the exception ([`Setup::forced_failover`], [`Setup::reshard`],
//! [`Setup::restart_then_reshard`]).

use std::fmt;

use stateright::{Model, Property};
use tollgate_core::{Algorithm, Counter, Policy, PolicyError, Priority, Reserve};
use tollgate_redis_protocol::loss::{self, Generation, Owner, Verdict};

use crate::Bound;

/// One tick of the clock: 1 ms, the shortest period a policy accepts.
pub const TICK_US: u64 = 1_000;

/// The nodes' names: their cluster node ids.
const NODE_NAMES: [&str; 3] = ["a", "b", "c"];

pub const G6_LOSS: &str = "G6: units granted in any period <= limit, across nodes";
pub const SOMETIMES_LOSS_DETECTED: &str = "sometimes: a decision starts a new generation";
pub const SOMETIMES_GRANT_AFTER_LOSS: &str =
    "sometimes: a grant in a generation started after a loss";

/// The loss check a decision runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Check {
    /// `loss::generation`, with owners that name the master's term (a new replication id at
    /// every promotion): any other owner is a loss, so a reshard holds the slot's counters for
    /// one period, as a failover does.
    Real,
    /// Broken on purpose: state counts as lost only when no generation is found; a generation
    /// of any other owner is kept.
    MissingOnly,
    /// Flawed, the rule the store used before ([`moved_exemption`]): owners name only the node
    /// and its run, and a generation of another node that the cluster lists as a live master is
    /// kept, taken for a slot moved here by resharding.
    MovedExemption,
}

/// The loss check the store used before `loss::generation`, kept to show why it was replaced.
/// Owners were `node/run` (no term), and a generation owned by another node was kept when
/// `owner_is_live_master` (the cluster lists that node as a master not marked failing): a slot
/// moved here by resharding lost nothing, so it was not held.
///
/// Flawed: that node being a live master says nothing about whether this node's copy came
/// straight from it (a forced failover, or a replica that copied a slot just moved to its
/// master), nor whether that node still runs the process that wrote it (a restart from a
/// snapshot just before a reshard); and an owner without a term does not tell a master's data
/// from what it copied back as a replica (a failback).
pub fn moved_exemption(
    found: Option<&Generation>,
    me: &Owner,
    now_us: u64,
    owner_is_live_master: impl Fn(&Owner) -> bool,
) -> Verdict {
    match found {
        Some(found)
            if found.owner == *me
                || (found.owner.node != me.node && owner_is_live_master(&found.owner)) =>
        {
            Verdict {
                generation: Generation {
                    born_us: found.born_us,
                    owner: me.clone(),
                },
                lost: false,
            }
        }
        _ => Verdict {
            generation: Generation {
                born_us: now_us,
                owner: me.clone(),
            },
            lost: true,
        },
    }
}

/// Whether a counter written in an older generation is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hold {
    /// `loss::hold_until`.
    Real,
    /// Broken on purpose: a counter found is used as it is, whatever generation it was written
    /// in; only a missing one is held (`loss::hold_until` of nothing found).
    StaleAsIs,
}

/// Where the slot lives, and what it can move to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Topology {
    /// One shard: master `a`, replica `b`.
    Pair,
    /// Two shards: the slot starts on master `c` (shard 0, no replica) and may be resharded to
    /// shard 1, master `a` with replica `b`.
    Reshard,
}

/// The bounds and parameters of one model.
#[derive(Clone, Debug)]
pub struct Setup {
    pub topology: Topology,
    /// Sliding rate limit: units per period.
    pub rate_limit: u64,
    pub period_ticks: u64,
    /// The clock starts one period after the namespace began (its generation is born at 0, so
    /// a counter not found then is not held) and runs for this many ticks.
    pub horizon_ticks: u64,
    /// Costs a request may ask for: `1..=cost_max`.
    pub cost_max: u64,
    pub failovers: u8,
    /// Whether a failover may be forced (each failover is then either kind): the old master,
    /// unreachable, stays listed as a master until the cluster marks it failing (a later step).
    pub forced: bool,
    pub restarts: u8,
    /// Whether nodes take snapshots and a restart may load the last one.
    pub snapshots: bool,
    pub reshards: u8,
    pub check: Check,
    pub hold: Hold,
}

impl Setup {
    /// A master and its replica; one failover, one restart (empty, or from a snapshot), costs
    /// 1 and 2 of a limit of 2 per 2 ms. Small: 2 ms of clock. Large: 3 ms.
    pub fn failover(bound: Bound) -> Setup {
        Setup {
            topology: Topology::Pair,
            rate_limit: 2,
            period_ticks: 2,
            horizon_ticks: if bound.is_large() { 3 } else { 2 },
            cost_max: 2,
            failovers: 1,
            forced: false,
            restarts: 1,
            snapshots: true,
            reshards: 0,
            check: Check::Real,
            hold: Hold::Real,
        }
    }

    /// Two failovers, so the second may go back to the first master, which may not have caught
    /// up with its successor's writes. Small: 3 ms of clock. Large: 4 ms.
    pub fn failback(bound: Bound) -> Setup {
        Setup {
            failovers: 2,
            restarts: 0,
            snapshots: false,
            horizon_ticks: if bound.is_large() { 4 } else { 3 },
            ..Setup::failover(bound)
        }
    }

    /// One failover, which may be forced: the old master, unreachable, is then still listed as
    /// a master when the promoted replica decides.
    pub fn forced_failover(bound: Bound) -> Setup {
        Setup {
            forced: true,
            restarts: 0,
            snapshots: false,
            ..Setup::failover(bound)
        }
    }

    /// The slot may move once from `c` to `a`, and `a` may fail over once to its replica `b`.
    pub fn reshard(bound: Bound) -> Setup {
        Setup {
            topology: Topology::Reshard,
            restarts: 0,
            snapshots: false,
            reshards: 1,
            ..Setup::failover(bound)
        }
    }

    /// `c` may restart once (empty, or from a snapshot), and the slot may move once to `a`.
    pub fn restart_then_reshard(bound: Bound) -> Setup {
        Setup {
            topology: Topology::Reshard,
            failovers: 0,
            restarts: 1,
            snapshots: true,
            reshards: 1,
            ..Setup::failover(bound)
        }
    }

    /// Every event at once: the slot starts on `c`
    /// and may be resharded to `a` (replica `b`); two failovers, either kind; one restart.
    /// Small: cost 1 only, restarts come back empty. Large: costs 1 and 2, and snapshots (a
    /// restart may load one).
    pub fn everything(bound: Bound) -> Setup {
        Setup {
            topology: Topology::Reshard,
            cost_max: if bound.is_large() { 2 } else { 1 },
            failovers: 2,
            forced: true,
            restarts: 1,
            snapshots: bound.is_large(),
            reshards: 1,
            ..Setup::failover(bound)
        }
    }

    fn period_us(&self) -> u64 {
        self.period_ticks * TICK_US
    }

    /// The clock at the start: one period after the namespace's generation was born.
    fn start_us(&self) -> u64 {
        self.period_us()
    }
}

/// What the cluster says a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Master,
    Replica,
    /// Replaced by a forced failover while unreachable: listed as a master, not yet marked
    /// failing, serving nothing.
    Unreachable,
}

/// A generation as stored: its birth and its owner (node index, run, and term under
/// [`Check::Real`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gen {
    pub born: u64,
    pub node: u8,
    pub run: u8,
    pub term: u8,
}

/// A counter as stored, with the birth of the generation it was written in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stored {
    pub counter: Counter,
    pub written_in: u64,
}

/// A node's keys of the slot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Data {
    pub generation: Option<Gen>,
    pub counter: Option<Stored>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub shard: u8,
    pub role: Role,
    /// Starts so far: its run id.
    pub run: u8,
    /// Promotions so far, its term as a master: under [`Check::Real`] only (0 otherwise, so
    /// that other checks' states do not split on it).
    pub term: u8,
    pub data: Data,
    /// Its last snapshot, if it takes them.
    pub saved: Option<Data>,
}

/// The model's record of one grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantNote {
    pub at: u64,
    pub cost: u64,
    /// The node that granted it.
    pub node: u8,
    /// The birth of the generation it was granted in.
    pub born: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FailoverState {
    /// The clock (one for every node), in microseconds.
    pub now: u64,
    pub nodes: Vec<Node>,
    /// The shard the slot lives in.
    pub shard: u8,
    pub failovers: u8,
    pub restarts: u8,
    pub reshards: u8,
    // The model's own record (see the module doc); no node reads it.
    pub notes: Vec<GrantNote>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailoverAction {
    /// A request for `cost` units, decided by the slot's master.
    Acquire {
        cost: u64,
    },
    /// The replica's copy becomes its master's data.
    Replicate {
        node: u8,
    },
    /// The replica is promoted; `forced`: its old master stays listed as a master.
    Failover {
        node: u8,
        forced: bool,
    },
    /// The cluster marks an unreachable old master failing; it comes back as a replica.
    MarkFailing {
        node: u8,
    },
    /// The node restarts: a new run id, and no data, or its last snapshot.
    Restart {
        node: u8,
        from_snapshot: bool,
    },
    Snapshot {
        node: u8,
    },
    /// The slot moves to another shard's master, every key copied.
    Reshard {
        to: u8,
    },
    Tick,
}

impl fmt::Display for FailoverAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |node: &u8| NODE_NAMES[usize::from(*node)];
        match self {
            FailoverAction::Acquire { cost } => write!(f, "acquire {cost} through the master"),
            FailoverAction::Replicate { node } => {
                write!(f, "{}: replicate its master's data", name(node))
            }
            FailoverAction::Failover { node, forced } => write!(
                f,
                "{}: promoted to master{}",
                name(node),
                if *forced { " (forced)" } else { "" }
            ),
            FailoverAction::MarkFailing { node } => {
                write!(f, "{}: marked failing, back as a replica", name(node))
            }
            FailoverAction::Restart {
                node,
                from_snapshot,
            } => write!(
                f,
                "{}: restarts {}",
                name(node),
                if *from_snapshot {
                    "from its snapshot"
                } else {
                    "empty"
                }
            ),
            FailoverAction::Snapshot { node } => write!(f, "{}: takes a snapshot", name(node)),
            FailoverAction::Reshard { to } => write!(f, "the slot moves to shard {to}"),
            FailoverAction::Tick => write!(f, "clock: +1 ms"),
        }
    }
}

impl fmt::Display for Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.generation {
            Some(generation) => {
                write!(
                    f,
                    "generation born {}ms owned by {}/{}",
                    generation.born / TICK_US,
                    NODE_NAMES[usize::from(generation.node)],
                    generation.run
                )?;
                if generation.term > 0 {
                    write!(f, " term {}", generation.term)?;
                }
            }
            None => write!(f, "no generation")?,
        }
        match &self.counter {
            Some(stored) => write!(
                f,
                ", counter written in {}ms: {:?}",
                stored.written_in / TICK_US,
                stored.counter
            ),
            None => write!(f, ", no counter"),
        }
    }
}

impl fmt::Display for FailoverState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "clock {}ms, slot in shard {}",
            self.now / TICK_US,
            self.shard
        )?;
        for (index, node) in self.nodes.iter().enumerate() {
            write!(
                f,
                "\n{} (shard {}, {:?}, run {}): {}",
                NODE_NAMES[index], node.shard, node.role, node.run, node.data
            )?;
        }
        write!(f, "\nrecords: grants [")?;
        for (index, note) in self.notes.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(
                f,
                "{separator}{} at {}ms by {}",
                note.cost,
                note.at / TICK_US,
                NODE_NAMES[usize::from(note.node)]
            )?;
        }
        write!(f, "]")
    }
}

#[derive(Clone, Debug)]
pub struct FailoverModel {
    pub setup: Setup,
    policy: Policy,
}

impl FailoverModel {
    pub fn new(setup: Setup) -> Result<FailoverModel, PolicyError> {
        let policy = Policy::rate(
            setup.rate_limit,
            setup.period_us(),
            0,
            Algorithm::Sliding,
            Reserve::default(),
        )?;
        Ok(FailoverModel { setup, policy })
    }

    /// The node that serves the slot: its shard's master.
    fn master(state: &FailoverState) -> Option<usize> {
        state
            .nodes
            .iter()
            .position(|node| node.shard == state.shard && node.role == Role::Master)
    }

    /// The owner as the script names it: the node id, and `run:replid` (the term stands for
    /// the replication id); under [`Check::MovedExemption`], the run id alone.
    fn owner(&self, node: usize, run: u8, term: u8) -> Owner {
        let name = NODE_NAMES[node];
        let run = match self.setup.check {
            Check::MovedExemption => format!("{name}{run}"),
            Check::Real | Check::MissingOnly => format!("{name}{run}:{term}"),
        };
        Owner {
            node: name.to_owned(),
            run,
        }
    }

    /// What the cluster says, as the former rule read it: the owner's node is listed as a
    /// master and not marked failing.
    fn is_live_master(state: &FailoverState, owner: &Owner) -> bool {
        NODE_NAMES
            .iter()
            .position(|name| *name == owner.node)
            .and_then(|index| state.nodes.get(index))
            .is_some_and(|node| matches!(node.role, Role::Master | Role::Unreachable))
    }

    /// The generation `node` decides under, by the setup's check.
    fn verdict(&self, state: &FailoverState, node: usize) -> Verdict {
        let deciding = &state.nodes[node];
        let me = self.owner(node, deciding.run, deciding.term);
        let found = deciding.data.generation.map(|generation| Generation {
            born_us: generation.born,
            owner: self.owner(
                usize::from(generation.node),
                generation.run,
                generation.term,
            ),
        });
        match self.setup.check {
            Check::Real => loss::generation(found.as_ref(), &me, state.now),
            Check::MovedExemption => moved_exemption(found.as_ref(), &me, state.now, |owner| {
                Self::is_live_master(state, owner)
            }),
            Check::MissingOnly => {
                let (born_us, lost) = match found {
                    Some(found) => (found.born_us, false),
                    None => (state.now, true),
                };
                Verdict {
                    generation: Generation { born_us, owner: me },
                    lost,
                }
            }
        }
    }

    /// One decision by the slot's master, as the script makes it: the generation, the counter
    /// (held if need be), the core's check and grant, then both written back.
    fn acquire(&self, next: &mut FailoverState, cost: u64) {
        let now = next.now;
        let Some(master) = Self::master(next) else {
            return;
        };
        let verdict = self.verdict(next, master);
        let born = verdict.generation.born_us;
        let stored = next.nodes[master].data.counter.take();
        let until = match self.setup.hold {
            Hold::Real => loss::hold_until(
                stored.as_ref().map(|stored| stored.written_in),
                born,
                self.policy.memory_us(),
            ),
            Hold::StaleAsIs => match stored {
                Some(_) => None,
                None => loss::hold_until(None, born, self.policy.memory_us()),
            },
        };
        let mut counter = match (stored, until) {
            (Some(stored), None) => stored.counter,
            // T.load keeps the counter it found; T.hold extends its pause to the hold's end.
            (Some(stored), Some(until)) => {
                let mut counter = stored.counter;
                counter.pause(until);
                counter
            }
            (None, Some(until)) if until > now => Counter::recovering(now, until),
            (None, _) => Counter::new(now),
        };
        let denial = counter
            .check(&self.policy, now, cost, Priority::Normal)
            .expect("the model's costs are within the limit");
        if denial.is_none() {
            let _ = counter.grant(&self.policy, now, cost, Priority::Normal, false);
            next.notes.push(GrantNote {
                at: now,
                cost,
                node: small(master),
                born,
            });
        }
        let node = &mut next.nodes[master];
        node.data.generation = Some(Gen {
            born,
            node: small(master),
            run: node.run,
            term: node.term,
        });
        node.data.counter = Some(Stored {
            counter,
            written_in: born,
        });
    }

    /// The most units granted in any interval `[t, t + period)`.
    fn worst_period(&self, state: &FailoverState) -> u64 {
        let period = self.setup.period_us();
        // The worst interval starts at some grant's time.
        state
            .notes
            .iter()
            .map(|start| {
                state
                    .notes
                    .iter()
                    .filter(|note| note.at >= start.at && note.at < start.at + period)
                    .map(|note| note.cost)
                    .sum()
            })
            .max()
            .unwrap_or(0)
    }

    fn data_of_master(state: &FailoverState, shard: u8) -> Option<Data> {
        state
            .nodes
            .iter()
            .find(|node| node.shard == shard && node.role == Role::Master)
            .map(|node| node.data.clone())
    }
}

/// A node index as stored in the state.
fn small(index: usize) -> u8 {
    u8::try_from(index).expect("the model has three nodes at most")
}

impl Model for FailoverModel {
    type State = FailoverState;
    type Action = FailoverAction;

    fn init_states(&self) -> Vec<FailoverState> {
        // The namespace began at 0: a generation born then, owned by the slot's first master,
        // already on its replica.
        let begun = |node: u8| Data {
            generation: Some(Gen {
                born: 0,
                node,
                run: 0,
                term: 0,
            }),
            counter: None,
        };
        let node = |shard: u8, role: Role, data: Data| Node {
            shard,
            role,
            run: 0,
            term: 0,
            saved: self.setup.snapshots.then(|| data.clone()),
            data,
        };
        let (nodes, shard) = match self.setup.topology {
            Topology::Pair => (
                vec![
                    node(0, Role::Master, begun(0)),
                    node(0, Role::Replica, begun(0)),
                ],
                0,
            ),
            Topology::Reshard => (
                vec![
                    node(1, Role::Master, Data::default()),
                    node(1, Role::Replica, Data::default()),
                    node(0, Role::Master, begun(2)),
                ],
                0,
            ),
        };
        vec![FailoverState {
            now: self.setup.start_us(),
            nodes,
            shard,
            failovers: 0,
            restarts: 0,
            reshards: 0,
            notes: Vec::new(),
        }]
    }

    fn actions(&self, state: &FailoverState, actions: &mut Vec<FailoverAction>) {
        let setup = &self.setup;
        if Self::master(state).is_some() {
            for cost in 1..=setup.cost_max.min(setup.rate_limit) {
                actions.push(FailoverAction::Acquire { cost });
            }
        }
        for (index, node) in state.nodes.iter().enumerate() {
            let node_index = small(index);
            let serves = node.shard == state.shard;
            match node.role {
                Role::Replica if serves => {
                    if Self::master(state).is_some() {
                        actions.push(FailoverAction::Replicate { node: node_index });
                    }
                    if state.failovers < setup.failovers {
                        actions.push(FailoverAction::Failover {
                            node: node_index,
                            forced: false,
                        });
                        if setup.forced {
                            actions.push(FailoverAction::Failover {
                                node: node_index,
                                forced: true,
                            });
                        }
                    }
                }
                Role::Unreachable => actions.push(FailoverAction::MarkFailing { node: node_index }),
                _ => {}
            }
            if serves && node.role != Role::Unreachable {
                if state.restarts < setup.restarts {
                    actions.push(FailoverAction::Restart {
                        node: node_index,
                        from_snapshot: false,
                    });
                    if node.saved.is_some() {
                        actions.push(FailoverAction::Restart {
                            node: node_index,
                            from_snapshot: true,
                        });
                    }
                }
                if setup.snapshots && node.saved.as_ref() != Some(&node.data) {
                    actions.push(FailoverAction::Snapshot { node: node_index });
                }
            }
        }
        if state.reshards < setup.reshards {
            let mut shards: Vec<u8> = state.nodes.iter().map(|node| node.shard).collect();
            shards.sort_unstable();
            shards.dedup();
            for to in shards {
                if to != state.shard && Self::data_of_master(state, to).is_some() {
                    actions.push(FailoverAction::Reshard { to });
                }
            }
        }
        if state.now < setup.start_us() + setup.horizon_ticks * TICK_US {
            actions.push(FailoverAction::Tick);
        }
    }

    fn next_state(&self, state: &FailoverState, action: FailoverAction) -> Option<FailoverState> {
        let mut next = state.clone();
        match action {
            FailoverAction::Acquire { cost } => self.acquire(&mut next, cost),
            FailoverAction::Replicate { node } => {
                let data = Self::data_of_master(state, state.shard)?;
                next.nodes[usize::from(node)].data = data;
            }
            FailoverAction::Failover { node, forced } => {
                let old = Self::master(state);
                if let Some(old) = old {
                    next.nodes[old].role = if forced {
                        Role::Unreachable
                    } else {
                        Role::Replica
                    };
                }
                let promoted = &mut next.nodes[usize::from(node)];
                promoted.role = Role::Master;
                if self.setup.check == Check::Real {
                    promoted.term += 1;
                }
                next.failovers += 1;
            }
            FailoverAction::MarkFailing { node } => {
                next.nodes[usize::from(node)].role = Role::Replica;
            }
            FailoverAction::Restart {
                node,
                from_snapshot,
            } => {
                let restarted = &mut next.nodes[usize::from(node)];
                restarted.run += 1;
                restarted.data = if from_snapshot {
                    restarted.saved.clone().unwrap_or_default()
                } else {
                    Data::default()
                };
                next.restarts += 1;
            }
            FailoverAction::Snapshot { node } => {
                let taken = &mut next.nodes[usize::from(node)];
                taken.saved = Some(taken.data.clone());
            }
            FailoverAction::Reshard { to } => {
                let data = Self::data_of_master(state, state.shard)?;
                for node in &mut next.nodes {
                    if node.shard == state.shard {
                        // The keys are deleted where the slot was (its replicas included).
                        node.data = Data::default();
                        node.saved = node.saved.as_ref().map(|_| Data::default());
                    } else if node.shard == to && node.role == Role::Master {
                        node.data = data.clone();
                    }
                }
                next.shard = to;
                next.reshards += 1;
            }
            FailoverAction::Tick => {
                next.now += TICK_US;
                // A grant shares no interval of one period with any grant from a period later.
                let period = self.setup.period_us();
                let now = next.now;
                next.notes.retain(|note| note.at + period > now);
            }
        }
        // As in `protocol`: drop what no longer counts in every stored counter, which changes
        // no decision and merges states that differ only in that.
        let now = next.now;
        for node in &mut next.nodes {
            for data in std::iter::once(&mut node.data).chain(node.saved.as_mut()) {
                if let Some(stored) = &mut data.counter {
                    let _ = stored.counter.status(&self.policy, now, Priority::Normal);
                }
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(G6_LOSS, |model: &Self, state: &FailoverState| {
                model.worst_period(state) <= model.setup.rate_limit
            }),
            Property::sometimes(SOMETIMES_LOSS_DETECTED, |_, state: &FailoverState| {
                state.nodes.iter().any(|node| {
                    node.data
                        .generation
                        .is_some_and(|generation| generation.born > 0)
                })
            }),
            Property::sometimes(SOMETIMES_GRANT_AFTER_LOSS, |_, state: &FailoverState| {
                state.notes.iter().any(|note| note.born > 0)
            }),
        ]
    }
}
