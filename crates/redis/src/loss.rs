//! The loss check (G6), as plain functions: what `T.generation` and `T.load` in `tollgate.lua`
//! decide, written once more in Rust so the model in `tollgate-model` checks this rule, and so
//! the script's behaviour has a reference (`tests/stale_replica.rs` drives the script through
//! each case).
//!
//! A slot's generation names its birth and the Redis process that owns it (node id and run id;
//! every start of a process draws a new run id). Every call reads it; only a change writes it:
//!
//! - no generation (a restart without persistence, a flush, an eviction): state may be lost;
//! - another owner on the same node (a restart that kept a snapshot, which may be older than
//!   the last writes): state may be lost;
//! - another owner on another node that is still a master the cluster does not mark failing:
//!   the slot was moved by resharding, which copies every key; nothing is lost, the generation
//!   is taken over as it is;
//! - another owner otherwise (a replica promoted after its master failed, or a manual
//!   failover): state may be lost.
//!
//! When state may be lost a new generation starts, born now. A counter written in an older
//! generation (or never) is held: it grants nothing until `born + memory`, by which time
//! everything it may have granted before has stopped counting.

/// The Redis process a script runs in: its cluster node id (empty outside a cluster) and its
/// run id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub node: String,
    pub run: String,
}

/// What a call finds in its slot's generation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Generation {
    pub born_us: u64,
    pub owner: Owner,
}

impl Generation {
    /// Read a generation as the script stores it: its birth and the day its expiry is next
    /// pushed back (big-endian doubles), then the owner as `node/run`. `None` if it is not one.
    pub fn decode(bytes: &[u8]) -> Option<Generation> {
        let born = f64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
        let owner = std::str::from_utf8(bytes.get(16..)?).ok()?;
        let (node, run) = owner.split_once('/')?;
        Some(Generation {
            born_us: born as u64,
            owner: Owner {
                node: node.to_owned(),
                run: run.to_owned(),
            },
        })
    }

    /// The stored form of this generation, with `renew_us` as the next push of its expiry.
    pub fn encode(&self, renew_us: u64) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(16 + self.owner.node.len() + 1 + self.owner.run.len());
        bytes.extend_from_slice(&(self.born_us as f64).to_be_bytes());
        bytes.extend_from_slice(&(renew_us as f64).to_be_bytes());
        bytes.extend_from_slice(self.owner.node.as_bytes());
        bytes.push(b'/');
        bytes.extend_from_slice(self.owner.run.as_bytes());
        bytes
    }
}

/// The generation a call decides under, and whether it had to start it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub generation: Generation,
    pub lost: bool,
}

/// The generation a call by `me` at `now_us` decides under, given what it found. `owner_is_live_master`
/// says whether the cluster names the found owner's node a master not marked failing.
pub fn generation(
    found: Option<&Generation>,
    me: &Owner,
    now_us: u64,
    owner_is_live_master: impl FnOnce(&Owner) -> bool,
) -> Verdict {
    let kept = match found {
        None => None,
        Some(found) if found.owner == *me => Some(found.born_us),
        Some(found) => {
            let moved = !me.node.is_empty()
                && !found.owner.node.is_empty()
                && found.owner.node != me.node
                && owner_is_live_master(&found.owner);
            moved.then_some(found.born_us)
        }
    };
    match kept {
        Some(born_us) => Verdict {
            generation: Generation {
                born_us,
                owner: me.clone(),
            },
            lost: false,
        },
        None => Verdict {
            generation: Generation {
                born_us: now_us,
                owner: me.clone(),
            },
            lost: true,
        },
    }
}

/// Until when a counter last written in the generation born at `written_in_us` (`None`: not
/// found) must be held, deciding under the generation born at `born_us`, for a limit whose
/// grants count for `memory_us`. `None`: not held.
pub fn hold_until(written_in_us: Option<u64>, born_us: u64, memory_us: u64) -> Option<u64> {
    match written_in_us {
        Some(written) if written == born_us => None,
        _ => Some(born_us + memory_us),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(node: &str, run: &str) -> Owner {
        Owner {
            node: node.into(),
            run: run.into(),
        }
    }

    #[test]
    fn only_a_move_between_live_masters_keeps_a_generation_that_changed_owner() {
        let me = owner("b", "run-b");
        let at = |owner: Owner| Generation { born_us: 5, owner };
        // Nothing found: lost.
        assert!(generation(None, &me, 100, |_| true).lost);
        // Ours: kept.
        let ours = generation(Some(&at(me.clone())), &me, 100, |_| false);
        assert!(!ours.lost && ours.generation.born_us == 5);
        // Moved here from a live master: kept, now ours.
        let moved = generation(Some(&at(owner("a", "run-a"))), &me, 100, |_| true);
        assert_eq!(
            moved,
            Verdict {
                generation: at(me.clone()),
                lost: false
            }
        );
        // Its master failed (this node is the promoted replica): lost.
        assert!(generation(Some(&at(owner("a", "run-a"))), &me, 100, |_| false).lost);
        // This node restarted: lost, whatever the cluster says.
        assert!(generation(Some(&at(owner("b", "run-old"))), &me, 100, |_| true).lost);
        // Outside a cluster any other owner is a loss.
        let single = owner("", "run-2");
        assert!(generation(Some(&at(owner("", "run-1"))), &single, 100, |_| true).lost);
        let stored = at(owner("a", "run-a"));
        assert_eq!(Generation::decode(&stored.encode(7)), Some(stored));
        assert_eq!(Generation::decode(b"short"), None);
        assert_eq!(hold_until(Some(5), 5, 10), None);
        assert_eq!(hold_until(Some(4), 5, 10), Some(15));
        assert_eq!(hold_until(None, 5, 10), Some(15));
    }
}
