//! A counter's queue of waiters across the fleet, natively, as the function library keeps it
//! (`tollgate-redis`'s `lua/queue.lua`, after `tollgate-redis-protocol`'s `queue.rs`): the
//! places of waiting requests, `PLACE_BYTES` each (priority, arrival, id, cost, expires, five
//! big-endian doubles) in rank order, at most `PLACES_MAX`; where a request stands and the
//! units the places ahead of it ask for; the `queued` denial an acquire owes them
//! (`acquire.lua`'s T.acquire, which `acquire.rs` follows and calls here); the places taken,
//! renewed and left, expired places dropped, and the wake-up published for them. It also owns
//! `TOLLGATE.LEAVE` (`entry.lua`'s OP_LEAVE): a waiting request gives up its place.
//!
//! Every number is a double, compared and summed as Lua does, so that module and library keep
//! one queue byte for byte; the bounds are the protocol's, held to the library's by the
//! interleaving test.

use crate::acquire::{Decision, bad, bytes_of, head, not_native, pack, sub0, ttl_ms};
use crate::{Redis, Reply, Value};

const OP_LEAVE: f64 = 9.0;
/// Places one counter's queue keeps at most (`queue.rs`'s PLACES_MAX).
const PLACES_MAX: usize = 32;
/// Bytes of one place (`queue.rs`'s PLACE_BYTES).
const PLACE_BYTES: usize = 40;
/// The id a request that does not wait ranks with (`queue.rs`'s NEWCOMER_ID, 2^53).
pub(crate) const NEWCOMER_ID: f64 = 9_007_199_254_740_992.0;
/// The shortest retry hint of a denial owed to places ahead (`queue.rs`'s
/// QUEUED_RETRY_MIN_US).
const QUEUED_RETRY_MIN_US: f64 = 10_000.0;
/// `abi.rs`'s REASON_QUEUED.
const REASON_QUEUED: f64 = 3.0;

/// One place: priority, arrival, id, cost, expires.
pub(crate) type Place = [f64; 5];

/// Where a request stands: priority, arrival, id.
pub(crate) type Rank = [f64; 3];

/// `queue.lua`'s T.queue_read: the live places of a stored queue (a trailing partial record
/// ignored), and whether any had expired.
pub(crate) fn read(raw: &[u8], now: f64) -> (Vec<Place>, bool) {
    let mut q = Vec::with_capacity(raw.len() / PLACE_BYTES);
    let mut expired = false;
    for record in raw.chunks_exact(PLACE_BYTES) {
        let n = crate::acquire::numbers(record);
        let place = [n[0], n[1], n[2], n[3], n[4]];
        if place[4] > now {
            q.push(place);
        } else {
            expired = true;
        }
    }
    (q, expired)
}

/// `queue.lua`'s T.before: whether `a` goes before `b` (higher priority, then earlier
/// arrival, then lower id).
fn before(a: &[f64], b: &[f64]) -> bool {
    if a[0] != b[0] {
        return a[0] > b[0];
    }
    if a[1] != b[1] {
        return a[1] < b[1];
    }
    a[2] < b[2]
}

/// `queue.lua`'s T.queue_rank: where a request of `priority` and `id` stands (the arrival of
/// its place, if it has one), and the units the places ahead of it ask for.
pub(crate) fn rank(q: &[Place], now: f64, priority: f64, id: f64) -> (Rank, f64) {
    let mut rank = [priority, now, id];
    for place in q {
        if place[2] == id {
            rank[1] = place[1];
        }
    }
    let mut ahead = 0.0;
    for place in q {
        if place[2] != id && before(place, &rank) {
            ahead += place[3];
        }
    }
    (rank, ahead)
}

/// `queue.lua`'s T.queue_leave: the place of `id` removed; whether it had one.
pub(crate) fn leave(q: &mut Vec<Place>, id: f64) -> bool {
    match q.iter().position(|place| place[2] == id) {
        Some(at) => {
            q.remove(at);
            true
        }
        None => false,
    }
}

/// `queue.lua`'s T.queue_stand: the place of a denied waiting request, taken or renewed until
/// `now + ttl`, in rank order; a full queue keeps its best.
pub(crate) fn stand(q: &mut Vec<Place>, rank: Rank, cost: f64, now: f64, ttl: f64) {
    leave(q, rank[2]);
    let place = [rank[0], rank[1], rank[2], cost, now + ttl];
    let at = q
        .iter()
        .position(|other| before(&place, other))
        .unwrap_or(q.len());
    if at >= PLACES_MAX {
        return;
    }
    q.insert(at, place);
    // One out, as the library's: a queue kept longer by another writer stays as long.
    if q.len() > PLACES_MAX {
        q.pop();
    }
}

/// `queue.lua`'s T.queue_write: the places stored until the last expires, or the key deleted.
/// Redis's error (an expiry not in the future, from a place's lifetime below zero) stops the
/// call there, as it stops the library's.
pub(crate) fn write(redis: &mut dyn Redis, key: &[u8], q: &[Place], now: f64) -> Result<(), Reply> {
    if q.is_empty() {
        redis.call(&[b"DEL", key], true);
        return Ok(());
    }
    let mut bytes = Vec::with_capacity(q.len() * PLACE_BYTES);
    let mut last = 0.0;
    for place in q {
        bytes.extend(pack(place));
        if place[4] > last {
            last = place[4];
        }
    }
    let ttl = ttl_ms(last, now);
    match redis.call(&[b"SET", key, &bytes, b"PX", &ttl], true) {
        Value::Error(error) => Err(Reply::Value(Value::Error(error))),
        _ => Ok(()),
    }
}

/// `queue.lua`'s T.wake_channel: the namespace's wake channel from its generation's key
/// (`tg:{<tag>}:<namespace>:gen`): `tg:<namespace>:wake`; None for a key not of that shape
/// (the library fails there).
fn wake_channel(gen_key: &[u8]) -> Option<Vec<u8>> {
    let rest = gen_key.strip_suffix(b":gen")?;
    let colon = rest.iter().rposition(|&b| b == b':')?;
    if colon == 0 || rest[colon - 1] != b'}' {
        return None;
    }
    let mut channel = b"tg:".to_vec();
    channel.extend(&rest[colon + 1..]);
    channel.extend(b":wake");
    Some(channel)
}

/// `queue.lua`'s T.wake: `message` (a counter's key) published on the namespace's channel.
pub(crate) fn wake(redis: &mut dyn Redis, gen_key: &[u8], message: &[u8]) -> Result<(), Reply> {
    let Some(channel) = wake_channel(gen_key) else {
        return Err(bad(
            "the generation's key is not tg:{<tag>}:<namespace>:gen: no wake-up channel",
        ));
    };
    redis.call(&[b"PUBLISH", &channel, message], true);
    Ok(())
}

/// A counter's queue as an acquire found it: its live places, where the request stands, and
/// whether places had expired.
pub(crate) struct Found {
    pub(crate) places: Vec<Place>,
    pub(crate) rank: Rank,
    pub(crate) expired: bool,
}

impl Decision<'_, '_> {
    /// `acquire.lua`'s room for every place ahead: a request the counter has room for is
    /// denied `queued` unless it also has room for the `ahead` units of the places before it
    /// (checked after `check`, the counter normalised).
    pub(crate) fn queued(&mut self, cost: f64, ahead: f64, open: f64) -> Option<[f64; 4]> {
        if ahead <= 0.0 {
            return None;
        }
        let over = cost + ahead > open;
        let mut room = if over {
            self.wait_for_room(open, open)
        } else {
            self.wait_for_room(cost + ahead, open)
        };
        if room > 0.0 || over {
            // No sooner than those ahead can take it: at least 10 ms when the room is there.
            if room == 0.0 {
                room = QUEUED_RETRY_MIN_US;
            }
            return Some([
                room,
                sub0(open, self.c.used(self.p, self.now)),
                REASON_QUEUED,
                0.0,
            ]);
        }
        None
    }
}

/// `TOLLGATE.LEAVE numkeys generation queue packed counter_key`, `entry.lua`'s OP_LEAVE: a
/// waiting request, `[2]` its id, gives up its place in the queue at
/// `KEYS[2]`; when it had one or places had expired, the queue is written back and the
/// counter's key (the argument after the numbers) published on the namespace's wake channel.
/// Reply: ok now born lost.
pub(crate) fn decide_leave(redis: &mut dyn Redis, args: &[&[u8]]) -> Reply {
    let ((keys, op, nums, record), trailing) = match crate::operations::split_with(args, 1) {
        Ok(call) => call,
        Err(refusal) => return refusal,
    };
    if op != OP_LEAVE {
        return not_native("an operation other than a leave");
    }
    let Some(&id) = nums.get(1) else {
        return bad("leave: no waiter's id");
    };
    let (Some(&gen_key), Some(&queue_key), Some(&message)) =
        (keys.first(), keys.get(1), trailing.first())
    else {
        return bad("leave: fewer keys than the generation and the queue");
    };
    let crate::operations::FirstRead {
        now, values, slot, ..
    } = match crate::operations::first_read(redis, vec![gen_key, queue_key], record, false) {
        Ok(first) => first,
        Err(refusal) => return refusal,
    };
    let (mut q, expired) = match bytes_of(&values[1]) {
        Some(raw) => read(raw, now),
        None => (Vec::new(), false),
    };
    if leave(&mut q, id) || expired {
        if let Err(failed) = write(redis, queue_key, &q, now) {
            return failed;
        }
        if let Err(failed) = wake(redis, gen_key, message) {
            return failed;
        }
    }
    Reply::Value(Value::Array(head("ok", now, &slot)))
}

/// A request as its queues see it: its waiter's id, priority and place's lifetime, and
/// whether it stands in them (it waits, and was denied).
pub(crate) struct Waiter {
    pub(crate) id: f64,
    pub(crate) priority: f64,
    pub(crate) place_ttl: f64,
    pub(crate) stands: bool,
}

/// The end of `acquire.lua`'s T.acquire, counter by counter (`counters`: each one's cost, queue
/// key and state key; `found`: its queue as read, if its key held one): a waiter denied takes
/// or renews its place, else it leaves; a queue changed is written back, and one whose places
/// had expired wakes whoever they held back.
pub(crate) fn settle<'k>(
    redis: &mut dyn Redis,
    now: f64,
    gen_key: &[u8],
    request: &Waiter,
    counters: impl Iterator<Item = (f64, &'k [u8], &'k [u8])>,
    found: Vec<Option<Found>>,
) -> Result<(), Reply> {
    for ((cost, queue_key, counter_key), found) in counters.zip(found) {
        let (mut places, rank, expired) = match found {
            Some(found) => (found.places, found.rank, found.expired),
            None if request.stands => (Vec::new(), [request.priority, now, request.id], false),
            None => continue,
        };
        let changed = if request.stands {
            // The place records what it waits for on this counter: its own cost.
            stand(&mut places, rank, cost, now, request.place_ttl);
            true
        } else {
            leave(&mut places, request.id) || expired
        };
        if changed {
            write(redis, queue_key, &places, now)?;
        }
        if expired {
            wake(redis, gen_key, counter_key)?;
        }
    }
    Ok(())
}
