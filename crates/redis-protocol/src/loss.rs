//! The loss check (G6), as plain functions: what `T.generation` and `T.load` in the Redis
//! store's script (`crates/redis/src/lua/loss.lua`) decide, written once more in Rust so the
//! model in `tollgate-model` checks this rule, and so the script's behaviour has a reference
//! (`crates/redis/tests/stale_replica.rs` drives the script through each case).
//!
//! A slot's generation names its birth and the Redis master that owns it: node id, run id (every
//! start of a process draws a new one) and replication id (every promotion draws a new one).
//! Every call reads it; only a change writes it. No generation (a restart without persistence,
//! a flush, an eviction), or one another master owns (a failover, a restart from a snapshot, a
//! slot moved here by resharding), means state may be lost. A reshard loses nothing, but what a
//! script can see does not tell it from a failover to a stale copy: the model in
//! `tollgate-model` found four ways past an exception for slots whose old owner still looks
//! healthy (a forced failover, a failover or restart right after a reshard), so a moved slot is
//! held too.
//!
//! When state may be lost a new generation starts, born now. A counter written in an older
//! generation (or never) is held: it grants nothing until `born + memory`, by which time
//! everything it may have granted before has stopped counting.

/// The Redis master a script runs in: its cluster node id (empty outside a cluster), and its run
/// id and replication id as `run:replid`.
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

/// The generation a call by `me` at `now_us` decides under, given what it found.
pub fn generation(found: Option<&Generation>, me: &Owner, now_us: u64) -> Verdict {
    match found {
        Some(found) if found.owner == *me => Verdict {
            generation: found.clone(),
            lost: false,
        },
        _ => Verdict {
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
    fn any_other_owner_starts_a_new_generation() {
        let me = owner("b", "run-b:term-2");
        let at = |owner: Owner| Generation { born_us: 5, owner };
        // Nothing found: lost.
        assert!(generation(None, &me, 100).lost);
        // Ours: kept.
        let ours = generation(Some(&at(me.clone())), &me, 100);
        assert!(!ours.lost && ours.generation.born_us == 5);
        // Another node's (a failover, or a slot moved here): lost, born now, ours.
        let other = generation(Some(&at(owner("a", "run-a:term-1"))), &me, 100);
        assert_eq!(
            other,
            Verdict {
                generation: Generation {
                    born_us: 100,
                    owner: me.clone()
                },
                lost: true
            }
        );
        // This node restarted, or was promoted again: lost.
        assert!(generation(Some(&at(owner("b", "run-old:term-1"))), &me, 100).lost);
        assert!(generation(Some(&at(owner("b", "run-b:term-1"))), &me, 100).lost);
        let stored = at(owner("a", "run-a"));
        assert_eq!(Generation::decode(&stored.encode(7)), Some(stored));
        assert_eq!(Generation::decode(b"short"), None);
        assert_eq!(hold_until(Some(5), 5, 10), None);
        assert_eq!(hold_until(Some(4), 5, 10), Some(15));
        assert_eq!(hold_until(None, 5, 10), Some(15));
    }
}
