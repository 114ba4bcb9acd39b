//! The shared call counter (docs/models.md): processes calling a third-party API against one
//! central counter of `max_calls`, in the designs that scenario walks through, each a small
//! state machine.
//!
//! One bulk process makes arbitrarily many calls (after each call it may go again or stop),
//! and three priority processes make one or two calls each. `max_calls` is a nondeterministic
//! initial choice in `5..=10`, as in the design's `max_calls \in 5..10`. A reset process, where
//! the design has one, sets `made_calls` back to zero at any moment, which is the design's model of
//! the vendor's window rolling over.
//!
//! The invariant is the design's `assert made_calls <= max_calls`; as in TLC, a state that broke
//! it is the end of its behaviour. Deadlock is a state where no process can move and not every
//! process has finished, which is what TLC reports as a deadlock.

use std::fmt;
use std::ops::RangeInclusive;

use stateright::{Model, Property};

/// The design's three `get_put` processes.
pub const PRIORITY_PROCESSES: usize = 3;

/// Property names, for tests and reports.
pub const NO_OVERSHOOT: &str = "made_calls <= max_calls";
pub const NO_DEADLOCK: &str = "no deadlock";
pub const PRIORITY_ALL_DONE: &str = "every priority process can finish";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Design {
    /// The first design: call without looking at the counter.
    Naive,
    /// Workers on different machines: read "enough left" from the central counter in
    /// one step, make the calls in a later one. Has the reset process.
    CheckThenAct,
    /// Wait until enough is left and call in the same atomic step; nothing resets.
    AwaitNoReset,
    /// The same with the reset process, the design's answer to the deadlock.
    AwaitWithReset,
    /// The final design: reserve (atomically wait for and count the calls as made),
    /// call, then give the reservation back. Has the reset process.
    Reservation,
}

impl Design {
    pub const ALL: [Design; 5] = [
        Design::Naive,
        Design::CheckThenAct,
        Design::AwaitNoReset,
        Design::AwaitWithReset,
        Design::Reservation,
    ];

    pub fn has_reset(self) -> bool {
        matches!(
            self,
            Design::CheckThenAct | Design::AwaitWithReset | Design::Reservation
        )
    }

    /// Whether a process takes a separate step (check or reserve) before calling.
    fn has_first_step(self) -> bool {
        matches!(self, Design::CheckThenAct | Design::Reservation)
    }
}

/// Where a process is in its loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// About to check, reserve, or call (by design).
    Start,
    /// Check-then-act: it read "enough left" and will call in its next step.
    Checked,
    /// Reservation: it holds a reservation and will call in its next step.
    Reserved,
    Done,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Start => "start",
            Step::Checked => "checked",
            Step::Reserved => "reserved",
            Step::Done => "done",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CallsState {
    pub max_calls: u8,
    pub made_calls: u8,
    /// Reservation design only: calls counted as made but not yet made.
    pub reserved_calls: u8,
    pub bulk: Step,
    pub priority: [Step; PRIORITY_PROCESSES],
}

impl CallsState {
    /// The design's assertion failed: as in TLC, this behaviour ends here.
    fn halted(&self) -> bool {
        self.made_calls > self.max_calls
    }

    fn all_done(&self) -> bool {
        self.bulk == Step::Done && self.priority.iter().all(|step| *step == Step::Done)
    }
}

impl fmt::Display for CallsState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "max_calls={} made_calls={} reserved_calls={} | bulk: {}",
            self.max_calls, self.made_calls, self.reserved_calls, self.bulk
        )?;
        for (index, step) in self.priority.iter().enumerate() {
            write!(f, ", priority {}: {step}", index + 1)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallsAction {
    /// Bulk reads "one call left" (check-then-act) or reserves one call (reservation).
    BulkCheck,
    /// Bulk makes one call, then loops (`again`) or stops.
    BulkCall {
        again: bool,
    },
    /// Priority process reads "two calls left" or reserves two calls.
    PriorityCheck {
        process: usize,
    },
    PriorityCall {
        process: usize,
        calls: u8,
    },
    /// The window rolls over: `made_calls := 0`.
    Reset,
}

impl fmt::Display for CallsAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallsAction::BulkCheck => write!(f, "bulk: check / reserve 1"),
            CallsAction::BulkCall { again: true } => write!(f, "bulk: make 1 call, go again"),
            CallsAction::BulkCall { again: false } => write!(f, "bulk: make 1 call, stop"),
            CallsAction::PriorityCheck { process } => {
                write!(f, "priority {}: check / reserve 2", process + 1)
            }
            CallsAction::PriorityCall { process, calls } => {
                write!(f, "priority {}: make {calls} call(s)", process + 1)
            }
            CallsAction::Reset => write!(f, "reset: made_calls := 0"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct CallsModel {
    pub design: Design,
    /// The initial choices of `max_calls`.
    pub max_calls: RangeInclusive<u8>,
}

impl CallsModel {
    /// The design's model: `max_calls \in 5..10`.
    pub fn seed(design: Design) -> CallsModel {
        CallsModel {
            design,
            max_calls: 5..=10,
        }
    }

    /// Whether `calls` more calls may go now, by the design's test (the design's awaits).
    fn room_for(&self, state: &CallsState, calls: u8) -> bool {
        match self.design {
            Design::Naive => true,
            Design::Reservation => {
                state.made_calls + state.reserved_calls + calls <= state.max_calls
            }
            Design::CheckThenAct | Design::AwaitNoReset | Design::AwaitWithReset => {
                state.made_calls + calls <= state.max_calls
            }
        }
    }
}

impl Model for CallsModel {
    type State = CallsState;
    type Action = CallsAction;

    fn init_states(&self) -> Vec<CallsState> {
        self.max_calls
            .clone()
            .map(|max_calls| CallsState {
                max_calls,
                made_calls: 0,
                reserved_calls: 0,
                bulk: Step::Start,
                priority: [Step::Start; PRIORITY_PROCESSES],
            })
            .collect()
    }

    fn actions(&self, state: &CallsState, actions: &mut Vec<CallsAction>) {
        if state.halted() {
            return;
        }
        let design = self.design;
        // Bulk.
        match state.bulk {
            Step::Start if design.has_first_step() => {
                if self.room_for(state, 1) {
                    actions.push(CallsAction::BulkCheck);
                }
            }
            Step::Start => {
                // Naive calls blindly; the await designs wait and call in one step.
                if self.room_for(state, 1) {
                    actions.push(CallsAction::BulkCall { again: true });
                    actions.push(CallsAction::BulkCall { again: false });
                }
            }
            Step::Checked | Step::Reserved => {
                actions.push(CallsAction::BulkCall { again: true });
                actions.push(CallsAction::BulkCall { again: false });
            }
            Step::Done => {}
        }
        // Priority processes.
        for (process, step) in state.priority.iter().enumerate() {
            match step {
                Step::Start if design.has_first_step() => {
                    // Both designs ask for the worst case, two calls, before knowing.
                    if self.room_for(state, 2) {
                        actions.push(CallsAction::PriorityCheck { process });
                    }
                }
                Step::Start => {
                    for calls in [1, 2] {
                        if self.room_for(state, calls) {
                            actions.push(CallsAction::PriorityCall { process, calls });
                        }
                    }
                }
                Step::Checked | Step::Reserved => {
                    for calls in [1, 2] {
                        actions.push(CallsAction::PriorityCall { process, calls });
                    }
                }
                Step::Done => {}
            }
        }
        if design.has_reset() {
            actions.push(CallsAction::Reset);
        }
    }

    fn next_state(&self, state: &CallsState, action: CallsAction) -> Option<CallsState> {
        let mut next = state.clone();
        let reservation = self.design == Design::Reservation;
        match action {
            CallsAction::BulkCheck => {
                if reservation {
                    next.reserved_calls += 1;
                    next.bulk = Step::Reserved;
                } else {
                    next.bulk = Step::Checked;
                }
            }
            CallsAction::BulkCall { again } => {
                next.made_calls += 1;
                if state.bulk == Step::Reserved {
                    next.reserved_calls -= 1;
                }
                next.bulk = if again { Step::Start } else { Step::Done };
            }
            CallsAction::PriorityCheck { process } => {
                if reservation {
                    next.reserved_calls += 2;
                    next.priority[process] = Step::Reserved;
                } else {
                    next.priority[process] = Step::Checked;
                }
            }
            CallsAction::PriorityCall { process, calls } => {
                next.made_calls += calls;
                if state.priority[process] == Step::Reserved {
                    // The design gives back the whole reservation of two, whatever was made.
                    next.reserved_calls -= 2;
                }
                next.priority[process] = Step::Done;
            }
            CallsAction::Reset => {
                if state.made_calls == 0 {
                    return None;
                }
                next.made_calls = 0;
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_OVERSHOOT, |_, state: &CallsState| {
                state.made_calls <= state.max_calls
            }),
            Property::always(NO_DEADLOCK, |model: &CallsModel, state: &CallsState| {
                let mut actions = Vec::new();
                model.actions(state, &mut actions);
                state.halted() || state.all_done() || !actions.is_empty()
            }),
            Property::sometimes(PRIORITY_ALL_DONE, |_, state: &CallsState| {
                !state.halted() && state.priority.iter().all(|step| *step == Step::Done)
            }),
        ]
    }
}
