//! The prepaid token pool (docs/models.md): `max_tokens` concurrent vendor tokens, shared by
//! instances that each loop forever fetching a token or returning one.
//!
//! Two designs:
//! - `LockWithTimeout`, the scenario's existing service: an instance takes a shared lock (Redlock),
//!   reads how many tokens are out, fetches one if there is room, and releases the lock. The
//!   lock has a timeout, so it can expire while its holder is between the check and the fetch;
//!   the holder does not know, and another instance takes the lock and checks the same count.
//! - `Lease`, the scenario's updated service: the store counts outstanding fetches, and the check
//!   and the increment are one atomic step in the store (a Lua script), so a fetch is counted
//!   from the moment it is allowed. The same expiring lock is kept, to show that correctness no
//!   longer depends on it.
//!
//! The invariant is the design's `MaxTokensNotExceeded`: tokens out at the vendor (fetched less
//! returned) never exceed `max_tokens`. A state that broke it ends its behaviour.

use std::fmt;

use stateright::{Model, Property};

pub const MAX_TOKENS_NOT_EXCEEDED: &str = "MaxTokensNotExceeded";
pub const POOL_FULLY_USED: &str = "the whole pool can be in use";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Design {
    LockWithTimeout,
    Lease,
}

/// An instance's place in its loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pc {
    Idle,
    /// Took the lock (and may hold it still, or not, if it expired).
    Locked,
    /// Lock design: read the count; `room` is what it saw.
    Checked {
        room: bool,
    },
    /// Lease design: the store counted this fetch as outstanding.
    Leased,
    /// Done with the pool for this round; about to release the lock.
    Releasing,
}

impl fmt::Display for Pc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pc::Idle => f.write_str("idle"),
            Pc::Locked => f.write_str("locked"),
            Pc::Checked { room: true } => f.write_str("checked(room)"),
            Pc::Checked { room: false } => f.write_str("checked(full)"),
            Pc::Leased => f.write_str("leased"),
            Pc::Releasing => f.write_str("releasing"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokensState {
    /// Tokens out at the vendor: fetched less returned (the design's two counters, subtracted,
    /// because the invariant only reads their difference and the difference stays bounded).
    pub tokens_out: u8,
    /// Lease design: fetches the store counts as outstanding.
    pub outstanding_fetches: u8,
    /// Who the lock service thinks holds the lock.
    pub lock: Option<usize>,
    pub instances: Vec<Pc>,
}

impl fmt::Display for TokensState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tokens_out={} outstanding_fetches={} lock={}",
            self.tokens_out,
            self.outstanding_fetches,
            match self.lock {
                Some(holder) => format!("instance {holder}"),
                None => "free".to_owned(),
            }
        )?;
        for (index, pc) in self.instances.iter().enumerate() {
            write!(f, " | instance {index}: {pc}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokensAction {
    TakeLock(usize),
    /// Lock design: read `tokens_out` and decide whether there is room.
    Check(usize),
    /// Lease design: in the store, atomically, count the fetch if there is room.
    Lease(usize),
    Fetch(usize),
    ReleaseLock(usize),
    /// The lock's timeout runs out; its holder is not told.
    LockExpires,
    ReturnToken(usize),
}

impl fmt::Display for TokensAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokensAction::TakeLock(i) => write!(f, "instance {i}: take the lock"),
            TokensAction::Check(i) => write!(f, "instance {i}: read tokens_out"),
            TokensAction::Lease(i) => write!(f, "instance {i}: store checks and counts a fetch"),
            TokensAction::Fetch(i) => write!(f, "instance {i}: fetch (if it saw room)"),
            TokensAction::ReleaseLock(i) => write!(f, "instance {i}: release the lock"),
            TokensAction::LockExpires => write!(f, "the lock times out"),
            TokensAction::ReturnToken(i) => write!(f, "instance {i}: return a token"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct TokensModel {
    pub design: Design,
    pub instances: usize,
    pub max_tokens: u8,
}

impl Model for TokensModel {
    type State = TokensState;
    type Action = TokensAction;

    fn init_states(&self) -> Vec<TokensState> {
        vec![TokensState {
            tokens_out: 0,
            outstanding_fetches: 0,
            lock: None,
            instances: vec![Pc::Idle; self.instances],
        }]
    }

    fn actions(&self, state: &TokensState, actions: &mut Vec<TokensAction>) {
        if state.tokens_out > self.max_tokens {
            return;
        }
        for (index, pc) in state.instances.iter().enumerate() {
            match pc {
                Pc::Idle => {
                    if state.lock.is_none() {
                        actions.push(TokensAction::TakeLock(index));
                    }
                    if state.tokens_out > 0 {
                        actions.push(TokensAction::ReturnToken(index));
                    }
                }
                Pc::Locked => actions.push(match self.design {
                    Design::LockWithTimeout => TokensAction::Check(index),
                    Design::Lease => TokensAction::Lease(index),
                }),
                Pc::Checked { .. } | Pc::Leased => actions.push(TokensAction::Fetch(index)),
                Pc::Releasing => actions.push(TokensAction::ReleaseLock(index)),
            }
        }
        if state.lock.is_some() {
            actions.push(TokensAction::LockExpires);
        }
    }

    fn next_state(&self, state: &TokensState, action: TokensAction) -> Option<TokensState> {
        let mut next = state.clone();
        match action {
            TokensAction::TakeLock(index) => {
                next.lock = Some(index);
                next.instances[index] = Pc::Locked;
            }
            TokensAction::Check(index) => {
                // The design tests `MaxTokens - fetched + returned > 1`; room for one more token
                // is `>= 1`, the tightest check, which makes the design's flaw the lock alone.
                next.instances[index] = Pc::Checked {
                    room: state.tokens_out < self.max_tokens,
                };
            }
            TokensAction::Lease(index) => {
                if state.tokens_out + state.outstanding_fetches < self.max_tokens {
                    next.outstanding_fetches += 1;
                    next.instances[index] = Pc::Leased;
                } else {
                    next.instances[index] = Pc::Releasing;
                }
            }
            TokensAction::Fetch(index) => {
                match state.instances[index] {
                    Pc::Checked { room: true } => next.tokens_out += 1,
                    Pc::Leased => {
                        next.tokens_out += 1;
                        next.outstanding_fetches -= 1;
                    }
                    _ => {}
                }
                next.instances[index] = Pc::Releasing;
            }
            TokensAction::ReleaseLock(index) => {
                // Redlock deletes the key only if it still holds this instance's value.
                if state.lock == Some(index) {
                    next.lock = None;
                }
                next.instances[index] = Pc::Idle;
            }
            TokensAction::LockExpires => next.lock = None,
            TokensAction::ReturnToken(_) => next.tokens_out -= 1,
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                MAX_TOKENS_NOT_EXCEEDED,
                |model: &TokensModel, state: &TokensState| state.tokens_out <= model.max_tokens,
            ),
            Property::sometimes(
                POOL_FULLY_USED,
                |model: &TokensModel, state: &TokensState| state.tokens_out == model.max_tokens,
            ),
        ]
    }
}
