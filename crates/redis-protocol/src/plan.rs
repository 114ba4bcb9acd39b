//! Deciding one request over counters in several Redis Cluster slots. A script may only touch
//! keys of one slot, so such a request is one call per slot: each call decides its counters all
//! or nothing, the calls go in ascending slot order, and a denial rolls back every slot granted
//! before it (a commit of nothing: rate units refunded, leases released). So the request is
//! granted on every counter or on none, and no limit ever counts less than it granted: while a
//! rollback is under way the units it gives back are still counted (a transient
//! under-admission), never the other way round. The fixed order keeps two requests over the
//! same slots from each holding a part the other needs, retry after retry. A slot's call may
//! first have a new key admitted to its limit's budget of keys, kept in another slot
//! (`crates/redis/src/tally.rs`); an admission grants no units, so a request rolled back leaves
//! only that admission counted until its cover ends: room for fewer keys for a while, never
//! more units.
//!
//! The steps are plain functions over slot numbers, so the model in `tollgate-model` checks
//! this very protocol.

/// The counters of one slot: their indices in the request, in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub slot: u16,
    pub takes: Vec<usize>,
}

/// The request's counters by slot, in the order the slots are asked: ascending.
pub fn groups(slots: &[u16]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut order: Vec<usize> = (0..slots.len()).collect();
    order.sort_by_key(|&index| (slots[index], index));
    for index in order {
        match groups.last_mut() {
            Some(group) if group.slot == slots[index] => group.takes.push(index),
            _ => groups.push(Group {
                slot: slots[index],
                takes: vec![index],
            }),
        }
    }
    groups
}

/// Whether the call for group `index` of `count` records its reservations: every group but the
/// last may have to be rolled back, which needs them; the last records them only if the caller
/// may commit a refund.
pub fn records(index: usize, count: usize, refundable: bool) -> bool {
    refundable || index + 1 < count
}

/// Where a cross-slot request stands: the groups granted so far, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Progress {
    granted: usize,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Ask group `n` (its index in [`groups`]' answer).
    Ask(usize),
    /// Every group granted: the request is granted.
    Granted,
    /// A group denied: roll back these groups (all granted before it), then answer the denial.
    RollBack(Vec<usize>),
}

impl Progress {
    /// The next step for a request of `count` groups, after the answer `denied` from the group
    /// last asked (`None` before the first call).
    pub fn step(&mut self, count: usize, denied: Option<bool>) -> Step {
        match denied {
            Some(true) => return Step::RollBack((0..self.granted).collect()),
            Some(false) => self.granted += 1,
            None => {}
        }
        if self.granted == count {
            Step::Granted
        } else {
            Step::Ask(self.granted)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_asked_slot_by_slot_in_ascending_order() {
        let groups = groups(&[9, 3, 9, 12, 3]);
        assert_eq!(
            groups,
            vec![
                Group {
                    slot: 3,
                    takes: vec![1, 4]
                },
                Group {
                    slot: 9,
                    takes: vec![0, 2]
                },
                Group {
                    slot: 12,
                    takes: vec![3]
                },
            ]
        );
        assert!(records(0, 3, false) && records(1, 3, false) && !records(2, 3, false));
        assert!(records(2, 3, true));
    }

    #[test]
    fn a_denial_rolls_back_every_group_granted_before_it() {
        let mut progress = Progress::default();
        assert_eq!(progress.step(3, None), Step::Ask(0));
        assert_eq!(progress.step(3, Some(false)), Step::Ask(1));
        assert_eq!(progress.step(3, Some(false)), Step::Ask(2));
        assert_eq!(progress.step(3, Some(true)), Step::RollBack(vec![0, 1]));
        let mut progress = Progress::default();
        assert_eq!(progress.step(1, None), Step::Ask(0));
        assert_eq!(progress.step(1, Some(false)), Step::Granted);
        let mut progress = Progress::default();
        assert_eq!(progress.step(2, None), Step::Ask(0));
        assert_eq!(progress.step(2, Some(true)), Step::RollBack(vec![]));
    }
}
