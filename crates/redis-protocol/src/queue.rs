//! One counter's queue across the fleet: the requests that wait for it in any process, in one
//! order, (priority, arrival), and what a request must leave for those ahead of it.
//!
//! Each process keeps its own waiters in order (the engine's `waiters.rs`); a process's waiter
//! that asks the store and is denied stands in this queue, kept beside the counter in the
//! counter's slot, until it is granted, leaves (its deadline passed, it was cancelled) or stops
//! renewing its place: a place lives `ttl` from its last ask, so a process that died while
//! waiting stops counting within that bound. A request is granted only if the counter has room
//! for its own cost plus the costs of every live place ahead of it (`need`): while a higher
//! priority waits anywhere, a lower one takes nothing that one could use, and a waiter at the
//! head needs only its own cost, so it is never held back by anyone behind it.
//!
//! A request that does not wait (it asks once) stands behind every place of its priority or
//! higher, as a newcomer to a process's own queue does.
//!
//! Plain functions over plain numbers: `crates/redis/src/lua/queue.lua` applies the same rule inside Redis (a
//! differential test compares them), and `tollgate-model` checks it with crashing waiters.

/// Places one counter's queue keeps at most. A place that would go past it evicts the last
/// place if it ranks before that one, and is not kept otherwise (its request still waits, on
/// its retry hints). What the queue costs Redis is bounded whatever callers do: a place is 40
/// bytes, and each process bounds its own waiters.
pub const PLACES_MAX: usize = 32;

/// Bytes of one place as the store keeps it: five big-endian doubles, (priority, arrival, id,
/// cost, expires), every number an integer below 2^53.
pub const PLACE_BYTES: usize = 40;

/// Where a request stands: higher priority first, then earlier arrival, then lower id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    pub priority: u64,
    pub arrival_us: u64,
    pub id: u64,
}

impl Rank {
    /// Whether `self` goes before `other`.
    pub fn before(&self, other: &Rank) -> bool {
        (other.priority, self.arrival_us, self.id) < (self.priority, other.arrival_us, other.id)
    }
}

/// One waiting request's place in a counter's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub rank: Rank,
    /// The units it asks for.
    pub cost: u64,
    /// When it stops counting unless its request asks again.
    pub expires_us: u64,
}

/// The id of a request that does not wait: it ranks after every place of its priority that
/// arrived when it did, or earlier.
pub const NOT_WAITING: u64 = 0;

/// The id such a request ranks with: past every id a waiter can have (below 2^53).
pub const NEWCOMER_ID: u64 = 1 << 53;

/// The shortest retry hint of a denial owed to places ahead: when the counter already has the
/// room, the request waits for those ahead to take it, which is no sooner than their next ask.
pub const QUEUED_RETRY_MIN_US: u64 = 10_000;

/// Where a request of `priority` stands at `now_us`: a waiting one (`id` not `NOT_WAITING`)
/// keeps the arrival of its live place, if it has one; anyone else arrives now.
pub fn rank_of(queue: &[Place], now_us: u64, priority: u64, id: u64) -> Rank {
    if id != NOT_WAITING
        && let Some(place) = queue
            .iter()
            .find(|place| place.rank.id == id && place.expires_us > now_us)
    {
        return Rank {
            priority,
            ..place.rank
        };
    }
    Rank {
        priority,
        arrival_us: now_us,
        id: if id == NOT_WAITING { NEWCOMER_ID } else { id },
    }
}

/// The units the live places ahead of `rank` ask for.
pub fn ahead(queue: &[Place], now_us: u64, rank: &Rank) -> u64 {
    queue
        .iter()
        .filter(|place| place.expires_us > now_us && place.rank.id != rank.id)
        .filter(|place| place.rank.before(rank))
        .fold(0u64, |sum, place| sum.saturating_add(place.cost))
}

/// What a counter must have room for to grant `cost` to a request with `ahead` units ahead of
/// it, when `open` is all the request's priority may ever use: `None` when even an empty
/// counter could not (the request waits for someone ahead to be granted or leave), else the
/// units to check for.
pub fn need(cost: u64, ahead: u64, open: u64) -> Option<u64> {
    let need = cost.saturating_add(ahead);
    (need <= open).then_some(need)
}

/// Drop the places that stopped counting at `now_us`; whether any did (their units are open to
/// the rest again: worth a wake-up).
pub fn expire(queue: &mut Vec<Place>, now_us: u64) -> bool {
    let before = queue.len();
    queue.retain(|place| place.expires_us > now_us);
    queue.len() != before
}

/// The request `id` leaves the queue (granted, or given up); whether it was in it.
pub fn leave(queue: &mut Vec<Place>, id: u64) -> bool {
    let before = queue.len();
    queue.retain(|place| place.rank.id != id);
    queue.len() != before
}

/// A denied waiting request takes, or renews, its place at `rank` until `now_us + ttl_us`.
/// Kept in rank order. A full queue keeps its best `PLACES_MAX`: whether this request has a
/// place after the call.
pub fn stand(queue: &mut Vec<Place>, rank: Rank, cost: u64, now_us: u64, ttl_us: u64) -> bool {
    leave(queue, rank.id);
    let place = Place {
        rank,
        cost,
        expires_us: now_us.saturating_add(ttl_us),
    };
    let at = queue
        .iter()
        .position(|other| rank.before(&other.rank))
        .unwrap_or(queue.len());
    if at >= PLACES_MAX {
        return false;
    }
    queue.insert(at, place);
    queue.truncate(PLACES_MAX);
    true
}

/// The places as the store keeps them.
pub fn encode(queue: &[Place]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(queue.len() * PLACE_BYTES);
    for place in queue {
        for number in [
            place.rank.priority,
            place.rank.arrival_us,
            place.rank.id,
            place.cost,
            place.expires_us,
        ] {
            bytes.extend_from_slice(&(number as f64).to_be_bytes());
        }
    }
    bytes
}

/// The places in `bytes`; a trailing partial record is ignored.
pub fn decode(bytes: &[u8]) -> Vec<Place> {
    bytes
        .chunks_exact(PLACE_BYTES)
        .map(|record| {
            let number = |at: usize| {
                let mut word = [0u8; 8];
                word.copy_from_slice(&record[at * 8..at * 8 + 8]);
                f64::from_be_bytes(word) as u64
            };
            Place {
                rank: Rank {
                    priority: number(0),
                    arrival_us: number(1),
                    id: number(2),
                },
                cost: number(3),
                expires_us: number(4),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(priority: u64, arrival_us: u64, id: u64, cost: u64, expires_us: u64) -> Place {
        Place {
            rank: Rank {
                priority,
                arrival_us,
                id,
            },
            cost,
            expires_us,
        }
    }

    #[test]
    fn higher_priority_then_earlier_arrival_then_lower_id_goes_first() {
        let rank = |priority, arrival_us, id| Rank {
            priority,
            arrival_us,
            id,
        };
        assert!(rank(2, 50, 9).before(&rank(1, 10, 1)));
        assert!(rank(1, 10, 9).before(&rank(1, 20, 1)));
        assert!(rank(1, 10, 1).before(&rank(1, 10, 2)));
        assert!(!rank(1, 10, 1).before(&rank(1, 10, 1)));
    }

    #[test]
    fn a_request_leaves_room_for_live_places_ahead_of_it_only() {
        let queue = vec![
            place(2, 100, 7, 3, 1_000),
            place(1, 50, 8, 2, 1_000),
            place(1, 60, 9, 4, 500),
            place(0, 10, 10, 5, 1_000),
        ];
        // A low newcomer at 600: the high place and the first normal one; the second expired.
        let newcomer = rank_of(&queue, 600, 0, NOT_WAITING);
        assert_eq!(ahead(&queue, 600, &newcomer), 3 + 2 + 5);
        // A high waiter standing in the queue: nobody ahead.
        let head = rank_of(&queue, 600, 2, 7);
        assert_eq!(head.arrival_us, 100);
        assert_eq!(ahead(&queue, 600, &head), 0);
        // A new high waiter arriving later: behind the first.
        let second = rank_of(&queue, 600, 2, 11);
        assert_eq!(ahead(&queue, 600, &second), 3);
        assert_eq!(need(1, 3, 3), None);
        assert_eq!(need(1, 3, 4), Some(4));
    }

    #[test]
    fn a_full_queue_keeps_its_best_places() {
        let mut queue = Vec::new();
        for id in 1..=PLACES_MAX as u64 {
            assert!(stand(
                &mut queue,
                Rank {
                    priority: 0,
                    arrival_us: id,
                    id
                },
                1,
                0,
                100
            ));
        }
        let late_low = Rank {
            priority: 0,
            arrival_us: 1_000,
            id: 1_000,
        };
        assert!(!stand(&mut queue, late_low, 1, 0, 100));
        let high = Rank {
            priority: 2,
            arrival_us: 1_000,
            id: 1_001,
        };
        assert!(stand(&mut queue, high, 1, 0, 100));
        assert_eq!(queue.len(), PLACES_MAX);
        assert_eq!(queue[0].rank, high);
        assert!(!queue.iter().any(|place| place.rank.id == PLACES_MAX as u64));
    }

    #[test]
    fn a_place_renewed_keeps_its_arrival_and_an_expired_one_goes() {
        let mut queue = Vec::new();
        let rank = rank_of(&queue, 10, 1, 5);
        stand(&mut queue, rank, 2, 10, 100);
        let again = rank_of(&queue, 60, 1, 5);
        assert_eq!(again.arrival_us, 10);
        stand(&mut queue, again, 2, 60, 100);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue[0].expires_us, 160);
        assert!(!expire(&mut queue, 159));
        assert!(expire(&mut queue, 160));
        assert!(queue.is_empty());
        assert_eq!(
            decode(&encode(&[place(2, 1 << 50, 3, 4, 5)])),
            vec![place(2, 1 << 50, 3, 4, 5)]
        );
    }
}
