//! Evictions watched (`tollgate-redis`'s `lua/loss.lua`, `T.evictions`): a call whose
//! operation code has `OP_WATCH_EVICTIONS` added names the slot's evictions record last among
//! its keys, and every counter it finds missing is held from the last time Redis's count of
//! evicted keys was seen to move (`Generation::seen`), as the library holds it: nothing tells
//! an evicted counter from one that expired idle. This owns reading Redis's count, the record
//! (`>ddd`: the count seen, when it was seen to move, when the record is next renewed) and
//! what a new namespace writes into it.

use crate::acquire::{
    GENERATION_TTL_MS, Generation, RENEW_EVERY_US, bad, bytes_of, generation, numbers, pack,
};
use crate::{Redis, Reply, Value};

/// Added to an operation's code when the call watches evictions (`abi.rs`'s
/// OP_WATCH_EVICTIONS).
const OP_WATCH_EVICTIONS: f64 = 16.0;

/// An evictions record's bytes (`abi.rs`'s EVICTIONS_BYTES).
const EVICTIONS_BYTES: usize = 24;

/// The operation a call's code names, and the evictions record's key (the call's last key)
/// when the call watches evictions.
pub(crate) fn operation<'k>(
    code: f64,
    keys: &[&'k [u8]],
) -> Result<(f64, Option<&'k [u8]>), Reply> {
    if code < OP_WATCH_EVICTIONS {
        return Ok((code, None));
    }
    match keys.last() {
        Some(&record) if keys.len() > 1 => Ok((code - OP_WATCH_EVICTIONS, Some(record))),
        _ => Err(bad(
            "evictions watched: no evictions record after the call's keys",
        )),
    }
}

/// The keys a call reads first, `names`, with the evictions record's last when watched.
pub(crate) fn with_record<'k>(mut names: Vec<&'k [u8]>, record: Option<&'k [u8]>) -> Vec<&'k [u8]> {
    names.extend(record);
    names
}

/// The slot's generation from the values read first (`values`: the generation's first, the
/// evictions record's last when `record` is watched), written when due, and when an eviction
/// was last seen (`Generation::seen`).
pub(crate) fn slot(
    redis: &mut dyn Redis,
    values: &[Value],
    gen_key: &[u8],
    record: Option<&[u8]>,
    now: f64,
) -> Generation {
    let mut slot = generation(redis, values.first().and_then(bytes_of), gen_key, now);
    if let Some(key) = record {
        watch(redis, &mut slot, values.last().and_then(bytes_of), key, now);
    }
    slot
}

/// Redis's count of evicted keys (`INFO stats`, this node's), -1 when it does not say.
fn evicted_keys(redis: &mut dyn Redis) -> f64 {
    let info = redis.call(&[b"INFO", b"stats"], false);
    let Some(text) = bytes_of(&info) else {
        return -1.0;
    };
    let field = b"evicted_keys:";
    let Some(at) = text.windows(field.len()).position(|w| w == field) else {
        return -1.0;
    };
    let digits: Vec<u8> = text[at + field.len()..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits)
        .ok()
        .and_then(|digits| digits.parse::<f64>().ok())
        .unwrap_or(-1.0)
}

/// `T.evictions`: `slot.seen` from the record `raw` read at `key` and Redis's count now; the
/// record written when the count moved, when it is missing (taken as an eviction seen now,
/// unless the node never evicted anything) and once a day.
fn watch(redis: &mut dyn Redis, slot: &mut Generation, raw: Option<&[u8]>, key: &[u8], now: f64) {
    let count = evicted_keys(redis);
    let record = raw.filter(|raw| raw.len() == EVICTIONS_BYTES).map(numbers);
    let (seen, renew) = match record.as_deref() {
        Some(&[seen_count, seen, renew]) if seen_count == count => (seen, renew),
        Some(_) => (now, 0.0),
        None => (if count == 0.0 { 0.0 } else { now }, 0.0),
    };
    if renew <= now {
        write(redis, key, count, seen, now);
    }
    slot.seen = seen;
}

/// A new namespace's record (`entry.lua`'s begin): nothing of it was evicted, so it starts at
/// the count now, never seen to move.
pub(crate) fn begin(redis: &mut dyn Redis, key: &[u8], now: f64) {
    let count = evicted_keys(redis);
    write(redis, key, count, 0.0, now);
}

fn write(redis: &mut dyn Redis, key: &[u8], count: f64, seen: f64, now: f64) {
    let value = pack(&[count, seen, now + RENEW_EVERY_US]);
    let ttl = GENERATION_TTL_MS.to_string();
    redis.call(&[b"SET", key, &value, b"PX", ttl.as_bytes()], true);
}
