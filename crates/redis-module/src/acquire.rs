//! `TOLLGATE.ACQUIRE`: the function library's acquire (`tollgate-redis`'s `lua/acquire.lua`),
//! natively, for the case it decides alone so far: one GCRA counter, a request that does not
//! wait, a final grant (no reservation recorded), no key budget to ask, no queue of waiters on
//! the counter, and a counter whose stored value is GCRA's or none. It reads and writes the
//! same keys and bytes as the library, with the library's arithmetic (Lua's numbers are doubles,
//! so this computes in doubles too) on Redis's clock (`TIME`, as the library reads it). Every
//! other case is refused before anything is written (`ERR tollgate: not native: ...`).
//!
//! The numbers below are the library's (`tollgate-redis`'s `abi.rs`), which this crate cannot
//! depend on (it is loaded into Redis); the interleaving test holds the two to the same
//! answers and bytes.

use crate::{Redis, Reply, Value};

const OP_ACQUIRE: f64 = 1.0;
const KIND_RATE: f64 = 1.0;
const ALG_GCRA: f64 = 3.0;
const PRIORITY_NORMAL: f64 = 1.0;
const PRIORITY_HIGH: f64 = 2.0;
const OUTCOME_GRANTED: i64 = 0;
const OUTCOME_DENIED: i64 = 2;
const REASON_CAPACITY: f64 = 0.0;
const REASON_PAUSED: f64 = 1.0;
const REASON_RECOVERING: f64 = 2.0;
const BODY_EMPTY: f64 = 0.0;
const BODY_GCRA: f64 = 3.0;
const COUNTER_TAG: u8 = b'X';
const NUMBER_BYTES: usize = 8;
const COUNTER_HEADER_NUMBERS: usize = 10;
const GCRA_NUMBERS: usize = 3;
const GENERATION_HEADER_BYTES: usize = 2 * NUMBER_BYTES;
const US_PER_MS: f64 = 1_000.0;
const US_PER_S: f64 = 1_000_000.0;
const RENEW_EVERY_US: f64 = 86_400.0 * US_PER_S;
const GENERATION_TTL_MS: u64 = 30 * 86_400 * 1_000;
const POLICY_NUMBERS: usize = 9;
const ADMISSION_NUMBERS: usize = 4;
const ACQUIRE_HEAD: usize = 4;
const ACQUIRE_PER_COUNTER: usize = POLICY_NUMBERS + 1 + ADMISSION_NUMBERS + 1;

/// A refusal: the library decides this call.
fn not_native(what: &str) -> Reply {
    Reply::Value(Value::Error(format!("ERR tollgate: not native: {what}")))
}

fn bad(what: &str) -> Reply {
    Reply::Value(Value::Error(format!("ERR tollgate: {what}")))
}

fn div_ceil(a: f64, b: f64) -> f64 {
    ((a + b - 1.0) / b).floor()
}

fn sub0(a: f64, b: f64) -> f64 {
    if a > b { a - b } else { 0.0 }
}

/// A number as Lua hands it to `redis.call` (an integer's digits, for the whole numbers here).
fn text(n: f64) -> Vec<u8> {
    format!("{n:.0}").into_bytes()
}

struct Policy {
    capacity: f64,
    res_high: f64,
    res_normal: f64,
    emission: f64,
    memory: f64,
}

impl Policy {
    fn capacity_for(&self, priority: f64) -> f64 {
        if priority == PRIORITY_HIGH {
            self.capacity
        } else if priority == PRIORITY_NORMAL {
            self.capacity - self.res_high
        } else {
            self.capacity - self.res_high - self.res_normal
        }
    }
}

/// A counter's common header and GCRA body, as `words.lua` lays them out.
#[derive(Clone, Copy)]
struct Counter {
    g: f64,
    p: f64,
    s: f64,
    k: f64,
    ro: f64,
    re: f64,
    ra: f64,
    rl: f64,
    rx: f64,
    a: f64,
    t: f64,
    e: f64,
    l: f64,
    dirty: bool,
}

impl Counter {
    fn empty(now: f64, born: f64) -> Counter {
        Counter {
            g: born,
            p: 0.0,
            s: now,
            k: BODY_EMPTY,
            ro: 0.0,
            re: 0.0,
            ra: -1.0,
            rl: 0.0,
            rx: 0.0,
            a: 0.0,
            t: 0.0,
            e: 0.0,
            l: 0.0,
            dirty: true,
        }
    }

    /// The value's numbers, or None when it is not a counter the library wrote; Err when it
    /// is one of a kind decided here not yet.
    fn decode(raw: &[u8], now: f64) -> Result<Option<Counter>, &'static str> {
        let header = 1 + COUNTER_HEADER_NUMBERS * NUMBER_BYTES;
        if raw.first() != Some(&COUNTER_TAG) || raw.len() < header {
            return Ok(None);
        }
        let n = numbers(&raw[1..]);
        let mut c = Counter::empty(now, 0.0);
        c.dirty = false;
        [c.g, c.p, c.s, c.k, c.ro, c.re, c.ra, c.rl, c.rx, c.a] =
            [n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], n[9]];
        if c.k == BODY_GCRA {
            if raw.len() != header + GCRA_NUMBERS * NUMBER_BYTES {
                return Ok(None);
            }
            [c.t, c.e, c.l] = [n[10], n[11], n[12]];
        } else if c.k == BODY_EMPTY {
            if raw.len() != header {
                return Ok(None);
            }
        } else {
            return Err("a counter of another algorithm or kind");
        }
        if c.re > c.ro {
            return Err("a counter with reservations recorded");
        }
        Ok(Some(c))
    }

    fn encode(&self) -> Vec<u8> {
        let mut words = vec![
            self.g, self.p, self.s, self.k, self.ro, self.re, self.ra, self.rl, self.rx, self.a,
        ];
        if self.k == BODY_GCRA {
            words.extend([self.t, self.e, self.l]);
        }
        let mut bytes = vec![COUNTER_TAG];
        for word in words {
            bytes.extend(word.to_be_bytes());
        }
        bytes
    }

    fn used(&self, p: &Policy, now: f64) -> f64 {
        if self.k == BODY_GCRA {
            div_ceil(sub0(self.t, now), p.emission)
        } else {
            0.0
        }
    }
}

/// Big-endian doubles.
fn numbers(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(NUMBER_BYTES)
        .map(|chunk| {
            let mut word = [0u8; NUMBER_BYTES];
            word.copy_from_slice(chunk);
            f64::from_be_bytes(word)
        })
        .collect()
}

fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::Bytes(bytes) => Some(bytes),
        _ => None,
    }
}

/// The text after `field` in `info`, while it is hexadecimal (Lua's `field(%x+)`).
fn info_field(info: &Value, field: &str) -> Vec<u8> {
    let Some(info) = bytes_of(info) else {
        return Vec::new();
    };
    let Some(at) = info
        .windows(field.len())
        .position(|w| w == field.as_bytes())
    else {
        return Vec::new();
    };
    info[at + field.len()..]
        .iter()
        .take_while(|b| b.is_ascii_hexdigit())
        .copied()
        .collect()
}

/// Which Redis master runs this (`loss.lua`'s `T.identity`): node id, run id, replication id.
fn identity(redis: &mut dyn Redis) -> Vec<u8> {
    let run_id = info_field(&redis.call(&[b"INFO", b"server"], false), "run_id:");
    let term = info_field(
        &redis.call(&[b"INFO", b"replication"], false),
        "master_replid:",
    );
    let node = match redis.call(&[b"CLUSTER", b"MYID"], false) {
        Value::Bytes(node) => node,
        _ => Vec::new(),
    };
    let mut me = node;
    me.push(b'/');
    me.extend(run_id);
    me.push(b':');
    me.extend(term);
    me
}

struct Generation {
    born: f64,
    lost: f64,
}

/// The slot's generation (`loss.lua`'s `T.generation`), written when missing, foreign or due
/// for its daily renewal.
fn generation(redis: &mut dyn Redis, raw: Option<&[u8]>, key: &[u8], now: f64) -> Generation {
    let me = identity(redis);
    let mut found = None;
    if let Some(raw) = raw
        && raw.len() > GENERATION_HEADER_BYTES
        && raw[GENERATION_HEADER_BYTES..] == me[..]
    {
        let n = numbers(&raw[..GENERATION_HEADER_BYTES]);
        found = Some((n[0], n[1]));
    }
    let (slot, renew) = match found {
        Some((born, renew)) => (Generation { born, lost: 0.0 }, renew),
        None => (
            Generation {
                born: now,
                lost: 1.0,
            },
            0.0,
        ),
    };
    if renew <= now {
        let mut value = Vec::new();
        value.extend(slot.born.to_be_bytes());
        value.extend((now + RENEW_EVERY_US).to_be_bytes());
        value.extend(&me);
        let ttl = GENERATION_TTL_MS.to_string();
        redis.call(&[b"SET", key, &value, b"PX", ttl.as_bytes()], true);
    }
    slot
}

fn head(status: &str, now: f64, slot: &Generation) -> Vec<Value> {
    vec![
        Value::Bytes(status.as_bytes().to_vec()),
        Value::Int(now as i64),
        Value::Int(slot.born as i64),
        Value::Int(slot.lost as i64),
    ]
}

/// The command: `TOLLGATE.ACQUIRE numkeys key... packed`.
pub(crate) fn command(redis: &mut crate::ffi::Ctx, args: &[&[u8]]) -> Reply {
    decide(redis, args)
}

pub(crate) fn decide(redis: &mut dyn Redis, args: &[&[u8]]) -> Reply {
    if args.len() < 3 {
        return Reply::WrongArity;
    }
    let Some(numkeys) = std::str::from_utf8(args[1])
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return bad("numkeys: not a count");
    };
    if args.len() < 2 + numkeys + 1 {
        return bad("numkeys: more keys than arguments, or no packed numbers after them");
    }
    let keys = &args[2..2 + numkeys];
    let packed = args[2 + numkeys];
    if !packed.len().is_multiple_of(NUMBER_BYTES) {
        return bad("packed numbers: not a whole count of doubles");
    }
    let nums = numbers(packed);
    // Lua's a[i], 1-based; a missing number is an error, as the library's would be one.
    let a = |i: usize| nums.get(i - 1).copied();
    let key = |x: f64| -> Option<&[u8]> {
        if x >= 1.0 && x.fract() == 0.0 {
            keys.get(x as usize - 1).copied()
        } else {
            None
        }
    };

    let Some(op) = a(1) else {
        return bad("packed numbers: empty");
    };
    if op != OP_ACQUIRE {
        return not_native("an operation other than a single acquire (without evictions watched)");
    }
    let (Some(cost), Some(priority), Some(record), Some(n)) = (a(2), a(3), a(4), a(5)) else {
        return bad("acquire: fewer than its head's numbers");
    };
    if n != 1.0 {
        return not_native("an acquire of other than one counter");
    }
    let after = 2 + ACQUIRE_HEAD + ACQUIRE_PER_COUNTER;
    let (Some(waiter), Some(_place_ttl)) = (a(after), a(after + 1)) else {
        return bad("acquire: fewer numbers than its counters and waiter need");
    };
    if waiter != 0.0 {
        return not_native("a waiting request (the queue across the fleet)");
    }
    if record != 0.0 {
        return not_native("a grant that records a reservation");
    }
    let at = 2 + ACQUIRE_HEAD;
    let policy: Vec<f64> = (at..at + POLICY_NUMBERS).filter_map(a).collect();
    let (Some(pause), Some(tally), Some(queue)) = (
        a(at + POLICY_NUMBERS),
        a(at + POLICY_NUMBERS + 1),
        a(at + POLICY_NUMBERS + 1 + ADMISSION_NUMBERS),
    ) else {
        return bad("acquire: fewer than a counter's numbers");
    };
    let [
        kind,
        limit,
        period,
        margin,
        alg,
        burst,
        _ttl,
        res_high,
        res_normal,
    ] = policy[..]
    else {
        return bad("acquire: fewer than a policy's numbers");
    };
    if kind != KIND_RATE || alg != ALG_GCRA {
        return not_native("a policy other than a GCRA rate limit");
    }
    if tally != 0.0 {
        return not_native("a counter of a key counted in its limit's key budget");
    }
    let window = period + margin;
    let emission = div_ceil(window, limit);
    let p = Policy {
        capacity: burst,
        res_high,
        res_normal,
        emission,
        memory: emission * burst,
    };
    let (Some(gen_key), Some(ck), Some(rk), Some(qk), Some(wk)) =
        (key(1.0), key(2.0), key(3.0), key(4.0), key(queue))
    else {
        return bad("acquire: a key named by the numbers is not among the keys");
    };
    let pause_key = if pause >= 1.0 {
        match key(pause) {
            Some(k) => Some(k),
            None => return bad("acquire: the pause's key is not among the keys"),
        }
    } else {
        None
    };

    let time = redis.call(&[b"TIME"], false);
    let now = match &time {
        Value::Array(parts) => {
            let part = |i: usize| {
                parts
                    .get(i)
                    .and_then(bytes_of)
                    .and_then(|b| std::str::from_utf8(b).ok()?.parse::<f64>().ok())
            };
            match (part(0), part(1)) {
                (Some(s), Some(us)) => s * US_PER_S + us,
                _ => return bad("TIME: not seconds and microseconds"),
            }
        }
        _ => return bad("TIME: not seconds and microseconds"),
    };

    let open = p.capacity_for(priority);
    if cost < 1.0 || cost > open {
        let raw = redis.call(&[b"GET", gen_key], false);
        let slot = generation(redis, bytes_of(&raw), gen_key, now);
        let mut reply = head("cost", now, &slot);
        reply.extend([Value::Int(1), Value::Int(open as i64)]);
        return Reply::Value(Value::Array(reply));
    }

    // One read, as the library's: the generation, the counter, its queue, the limit's pause.
    let mut names: Vec<&[u8]> = vec![b"MGET", gen_key, ck, wk];
    if let Some(pause_key) = pause_key {
        names.push(pause_key);
    }
    let values = match redis.call(&names, false) {
        Value::Array(values) if values.len() == names.len() - 1 => values,
        _ => return bad("MGET: not one value per key"),
    };
    if values[2] != Value::Nil {
        return not_native("a counter with a queue of waiters");
    }
    let loaded = match bytes_of(&values[1]) {
        Some(raw) => match Counter::decode(raw, now) {
            Ok(c) => c,
            Err(what) => return not_native(what),
        },
        None => None,
    };
    let slot = generation(redis, bytes_of(&values[0]), gen_key, now);
    // `loss.lua`'s T.load, no evictions watched (seen 0), then T.hold.
    let (mut c, hold_until) = match loaded {
        Some(c) if c.g == slot.born => (c, None),
        Some(mut c) => {
            c.g = slot.born;
            c.dirty = true;
            (c, Some(slot.born + p.memory))
        }
        None if values[1] != Value::Nil => (Counter::empty(now, slot.born), Some(now + p.memory)),
        None => (
            Counter::empty(now, slot.born),
            Some(slot.born.max(0.0) + p.memory),
        ),
    };
    if let Some(hold_until) = hold_until
        && hold_until > now
    {
        c.p = c.p.max(hold_until);
        c.s = c.s.max(hold_until);
    }
    let limit_paused_until = match pause_key {
        Some(_) => bytes_of(&values[3])
            .and_then(|b| std::str::from_utf8(b).ok()?.parse::<f64>().ok())
            .unwrap_or(0.0),
        None => -pause,
    };

    // counter.lua's T.check: normalised (carried into GCRA when its interval changed).
    if !(c.k == BODY_GCRA && c.e == p.emission) {
        let used_before = if c.k == BODY_GCRA {
            div_ceil(sub0(c.t, now), c.e)
        } else {
            0.0
        };
        c.dirty = true;
        c.k = BODY_GCRA;
        c.t = now + used_before * p.emission;
        c.e = p.emission;
        c.l = 0.0;
    }
    let in_use = c.used(&p, now);
    let room_after = if in_use + cost <= open {
        0.0
    } else {
        sub0(sub0(c.t, (open - cost) * p.emission), now)
    };
    let pause_after = sub0(c.p.max(limit_paused_until), now);
    let denial = if room_after == 0.0 && pause_after == 0.0 {
        None
    } else if pause_after > 0.0 {
        Some((
            room_after.max(pause_after),
            sub0(open, in_use),
            REASON_PAUSED,
            0.0,
        ))
    } else {
        Some((
            room_after,
            sub0(open, in_use),
            REASON_CAPACITY,
            sub0(p.capacity, in_use),
        ))
    };
    let mut reply = head("ok", now, &slot);
    match denial {
        Some((retry, remaining, mut reason, left)) => {
            if reason == REASON_PAUSED
                && c.p >= limit_paused_until
                && (c.p == slot.born + p.memory || c.p == p.memory)
            {
                reason = REASON_RECOVERING;
            }
            let left = if reason == REASON_CAPACITY { left } else { 0.0 };
            reply.extend([
                Value::Int(OUTCOME_DENIED),
                Value::Int(retry as i64),
                Value::Int(remaining as i64),
                Value::Int(reason as i64),
                Value::Int(left as i64),
            ]);
        }
        None => {
            // counter.lua's T.grant, a final grant of a GCRA counter.
            let seq = c.s.max(now);
            c.s = seq + 1.0;
            c.dirty = true;
            c.t = c.t.max(now) + cost * p.emission;
            c.l = seq;
            reply.extend([
                Value::Int(OUTCOME_GRANTED),
                Value::Int(seq as i64),
                Value::Int(sub0(open, c.used(&p, now)) as i64),
                Value::Int(sub0(c.t, now).min(p.memory) as i64),
                Value::Int(0),
            ]);
        }
    }
    // counter.lua's T.save.
    if c.dirty {
        let idle = c.p.max(c.s).max(c.t);
        if idle <= now {
            redis.call(&[b"DEL", ck, rk, qk], true);
        } else {
            if c.re > 0.0 {
                redis.call(&[b"DEL", rk], true);
                (c.ro, c.re, c.rx, c.ra) = (0.0, 0.0, 0.0, -1.0);
            }
            let ttl = text(div_ceil(idle - now, US_PER_MS) + 1.0);
            redis.call(&[b"SET", ck, &c.encode(), b"PX", &ttl], true);
        }
    }
    Reply::Value(Value::Array(reply))
}
