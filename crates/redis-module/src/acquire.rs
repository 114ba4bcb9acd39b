//! `TOLLGATE.ACQUIRE`: the function library's acquire (`tollgate-redis`'s `lua/acquire.lua`),
//! natively, alone or in a batch (`entry.lua`'s, the generation read once), for the cases it
//! decides alone so far: rate counters and concurrency limits' counters (their leases in
//! `leases.rs`), one or several all or none, GCRA, sliding window (its bucket log kept as the
//! library keeps it) or fixed window, a final grant or one recorded as a reservation a commit
//! can refund, each key admitted in its limit's key budget when it has one (the budget in this
//! slot, or the cover the caller brings), a request that waits or not, with its counters'
//! queues of waiters across the fleet (`queue.rs`: the places ahead it leaves room for, its own
//! place taken, renewed or left), and counters whose stored value is GCRA's, a sliding or fixed
//! window's, leases or none (one of another kind is carried into the policy's, as the library
//! carries it). It reads and writes the same keys and bytes as the library, with the library's
//! arithmetic (Lua's numbers are doubles, so this computes in doubles too) on Redis's clock (as
//! `TIME` reads it). Every other case is refused before anything is written (`ERR tollgate: not
//! native: ...`). It also owns the identity the module and the library write generations under
//! (`TOLLGATE.IDENTITY`).
//!
//! The numbers below are the library's (`tollgate-redis`'s `abi.rs`, `tally.rs` and the core's
//! bounds), which this crate cannot depend on (it is loaded into Redis); the interleaving test
//! holds the two to the same answers and bytes.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{Redis, Reply, Value};

const OP_ACQUIRE: f64 = 1.0;
const OP_BATCH: f64 = 10.0;
/// Where a batch's first acquire begins (1-based): after the operation and the count.
const BATCH_AT: usize = 3;
const KEYS_PER_COUNTER: f64 = 3.0;
pub(crate) const KIND_RATE: f64 = 1.0;
pub(crate) const KIND_CONCURRENCY: f64 = 2.0;
pub(crate) const ALG_SLIDING: f64 = 1.0;
pub(crate) const ALG_FIXED: f64 = 2.0;
pub(crate) const ALG_GCRA: f64 = 3.0;
const PRIORITY_NORMAL: f64 = 1.0;
const PRIORITY_HIGH: f64 = 2.0;
const OUTCOME_GRANTED: i64 = 0;
const OUTCOME_ALLOWED: i64 = 1;
/// Where a reply's first counter's numbers are (0-based), and how many each has.
const REPLY_HEAD: usize = 4;
const OUTCOME_NUMBERS: usize = 5;
const OUTCOME_DENIED: i64 = 2;
const REASON_CAPACITY: f64 = 0.0;
const REASON_PAUSED: f64 = 1.0;
const REASON_RECOVERING: f64 = 2.0;
const BODY_EMPTY: f64 = 0.0;
pub(crate) const BODY_SLIDING: f64 = 1.0;
pub(crate) const BODY_FIXED: f64 = 2.0;
pub(crate) const BODY_GCRA: f64 = 3.0;
pub(crate) const BODY_LEASES: f64 = 4.0;
/// A lease's numbers in a counter's value: fence, slots, expires_at.
pub(crate) const LEASE_NUMBERS: usize = 3;
const COUNTER_TAG: u8 = b'X';
pub(crate) const NUMBER_BYTES: usize = 8;
const COUNTER_HEADER_NUMBERS: usize = 10;
const GCRA_NUMBERS: usize = 3;
const FIXED_NUMBERS: usize = 3;
const SLIDING_NUMBERS: usize = 10;
/// A log's record: three numbers (a closed bucket: opened, stamp, units; a reservation: seq,
/// units, at).
pub(crate) const RECORD_BYTES: f64 = 24.0;
const BUCKET_STAMP: f64 = 8.0;
pub(crate) const RESERVATION_AT: f64 = 16.0;
const SLIDING_BUCKETS_MAX: f64 = 64.0;
const RESERVATIONS_TRACKED_MAX: f64 = 256.0;
const GENERATION_HEADER_BYTES: usize = 2 * NUMBER_BYTES;
const TALLY_TAG: u8 = b'K';
const TALLY_HEADER_BYTES: usize = 1 + 2 * NUMBER_BYTES;
const TALLY_RECORD_BYTES: usize = 2 * NUMBER_BYTES;
const COVER_SPANS: f64 = 2.0;
const HOLD_SPANS: f64 = 3.0;
const GRID_PER_DISTANCE: f64 = 8.0;
const LOG_SLACK_PER_WINDOW: f64 = 16.0;
const EXPIRY_SLACK_US: f64 = 2_000.0;
const US_PER_MS: f64 = 1_000.0;
const US_PER_S: f64 = 1_000_000.0;
pub(crate) const RENEW_EVERY_US: f64 = 86_400.0 * US_PER_S;
pub(crate) const GENERATION_TTL_MS: u64 = 30 * 86_400 * 1_000;
pub(crate) const POLICY_NUMBERS: usize = 9;
pub(crate) const ADMISSION_NUMBERS: usize = 4;
const ACQUIRE_HEAD: usize = 4;
const ACQUIRE_PER_COUNTER: usize = POLICY_NUMBERS + 1 + ADMISSION_NUMBERS + 1;

/// A refusal: the library decides this call.
pub(crate) fn not_native(what: &str) -> Reply {
    Reply::Value(Value::Error(format!("ERR tollgate: not native: {what}")))
}

pub(crate) fn bad(what: &str) -> Reply {
    Reply::Value(Value::Error(format!("ERR tollgate: {what}")))
}

pub(crate) fn div_ceil(a: f64, b: f64) -> f64 {
    ((a + b - 1.0) / b).floor()
}

pub(crate) fn sub0(a: f64, b: f64) -> f64 {
    if a > b { a - b } else { 0.0 }
}

/// A number as Lua hands it to `redis.call` (an integer's digits, for the whole numbers here).
pub(crate) fn text(n: f64) -> Vec<u8> {
    // A whole number within a double's exact integers, as an integer's digits (what `{:.0}`
    // writes for it, several times faster); anything else as `{:.0}` writes it.
    if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 && !(n == 0.0 && n.is_sign_negative())
    {
        return (n as i64).to_string().into_bytes();
    }
    format!("{n:.0}").into_bytes()
}

/// `common.lua`'s T.ttl_ms: an expiry in milliseconds from now, rounded up, plus one.
pub(crate) fn ttl_ms(until_us: f64, now: f64) -> Vec<u8> {
    text(div_ceil(until_us - now, US_PER_MS) + 1.0)
}

pub(crate) fn pack(words: &[f64]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(words.len() * NUMBER_BYTES);
    for word in words {
        bytes.extend_from_slice(&word.to_be_bytes());
    }
    bytes
}

/// A policy as `common.lua`'s T.read_policy makes it: a rate limit's or a concurrency
/// limit's (whose capacity is its limit and memory its leases' ttl; `alg` and `emission`
/// unused).
pub(crate) struct Policy {
    pub(crate) kind: f64,
    pub(crate) alg: f64,
    pub(crate) limit: f64,
    pub(crate) window: f64,
    pub(crate) capacity: f64,
    pub(crate) res_high: f64,
    pub(crate) res_normal: f64,
    pub(crate) emission: f64,
    pub(crate) memory: f64,
    /// A lease's lifetime (a concurrency limit's); 0 for a rate limit.
    pub(crate) ttl: f64,
}

impl Policy {
    /// `common.lua`'s T.read_policy for a rate limit: limit, period, margin, algorithm,
    /// burst and the two reserves.
    fn rate([limit, period, margin, alg, burst, res_high, res_normal]: [f64; 7]) -> Policy {
        let window = period + margin;
        let emission = div_ceil(window, limit);
        let (capacity, memory) = if alg == ALG_GCRA {
            (burst, emission * burst)
        } else {
            (limit, window)
        };
        Policy {
            kind: KIND_RATE,
            alg,
            limit,
            window,
            capacity,
            res_high,
            res_normal,
            emission,
            memory,
            ttl: 0.0,
        }
    }

    /// `common.lua`'s T.read_policy for a concurrency limit: limit, period, margin (its window
    /// still sizes its logs' slack and its span, as the library's), lease ttl and the two
    /// reserves.
    fn concurrency([limit, period, margin, ttl, res_high, res_normal]: [f64; 6]) -> Policy {
        Policy {
            kind: KIND_CONCURRENCY,
            alg: 0.0,
            limit,
            window: period + margin,
            capacity: limit,
            res_high,
            res_normal,
            emission: 0.0,
            memory: ttl,
            ttl,
        }
    }

    /// `common.lua`'s T.read_policy of a policy's nine numbers (kind, limit, period, margin,
    /// algorithm, burst, ttl, reserves): a rate limit's when its kind is, else a concurrency
    /// limit's, as the library reads every other kind.
    pub(crate) fn of(
        [
            kind,
            limit,
            period,
            margin,
            alg,
            burst,
            ttl,
            res_high,
            res_normal,
        ]: [f64; 9],
    ) -> Policy {
        if kind == KIND_RATE {
            Policy::rate([limit, period, margin, alg, burst, res_high, res_normal])
        } else {
            Policy::concurrency([limit, period, margin, ttl, res_high, res_normal])
        }
    }

    /// `Policy::of`, when the module decides the policy's kind and algorithm natively: a
    /// concurrency limit, or a GCRA, sliding or fixed window rate limit.
    pub(crate) fn read(numbers: [f64; 9]) -> Option<Policy> {
        let [kind, .., alg, _, _, _, _] = numbers;
        let native = kind == KIND_CONCURRENCY
            || (kind == KIND_RATE && (alg == ALG_GCRA || alg == ALG_SLIDING || alg == ALG_FIXED));
        native.then(|| Policy::of(numbers))
    }

    fn capacity_for(&self, priority: f64) -> f64 {
        if priority == PRIORITY_HIGH {
            self.capacity
        } else if priority == PRIORITY_NORMAL {
            self.capacity - self.res_high
        } else {
            self.capacity - self.res_high - self.res_normal
        }
    }

    /// The logs' slack past a record's end (`floor(window / LOG_SLACK_PER_WINDOW)`).
    pub(crate) fn slack(&self) -> f64 {
        (self.window / LOG_SLACK_PER_WINDOW).floor()
    }

    /// `keys.lua`'s T.span: the longest one write can make a counter live, its logs included.
    pub(crate) fn span(&self) -> f64 {
        self.window.max(self.memory) + self.slack() + EXPIRY_SLACK_US
    }
}

/// A counter's keys: its state, its reservations log, its bucket log.
pub(crate) struct Keys<'a> {
    pub(crate) ck: &'a [u8],
    pub(crate) rk: &'a [u8],
    pub(crate) qk: &'a [u8],
}

/// A counter's value as `words.lua` lays it out: the common header, then the sliding, fixed,
/// GCRA or leases body (a field of another kind's is kept but not written, as the library's
/// table keeps it).
#[derive(Clone)]
pub(crate) struct Counter {
    pub(crate) g: f64,
    pub(crate) p: f64,
    pub(crate) s: f64,
    pub(crate) k: f64,
    pub(crate) ro: f64,
    pub(crate) re: f64,
    pub(crate) ra: f64,
    pub(crate) rl: f64,
    pub(crate) rx: f64,
    pub(crate) a: f64,
    pub(crate) qu: f64,
    pub(crate) lo: f64,
    pub(crate) ls: f64,
    pub(crate) lu: f64,
    pub(crate) qo: f64,
    pub(crate) qe: f64,
    pub(crate) fs: f64,
    pub(crate) fu: f64,
    pub(crate) qx: f64,
    pub(crate) qw: f64,
    pub(crate) w: f64,
    pub(crate) wu: f64,
    pub(crate) u: f64,
    pub(crate) t: f64,
    pub(crate) e: f64,
    pub(crate) l: f64,
    /// The leases (`leases.lua`'s `b`): LEASE_NUMBERS numbers each, fence, slots, expires_at.
    pub(crate) b: Vec<f64>,
    /// Until when a cover just given keeps it (`keys.lua`'s T.cover); 0 none.
    pub(crate) keep: f64,
    pub(crate) dirty: bool,
}

/// What decoding a stored value found.
// Made once per decision and moved out at once: boxing the counter would add an allocation to
// every decision for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Decoded {
    Counter(Counter),
    /// Not a counter the library wrote (another format, or damaged): lost state.
    Foreign,
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
            qu: 0.0,
            lo: 0.0,
            ls: 0.0,
            lu: 0.0,
            qo: 0.0,
            qe: 0.0,
            fs: -1.0,
            fu: 0.0,
            qx: 0.0,
            qw: 0.0,
            w: 0.0,
            wu: 0.0,
            u: 0.0,
            t: 0.0,
            e: 0.0,
            l: 0.0,
            b: Vec::new(),
            keep: 0.0,
            dirty: true,
        }
    }

    /// `words.lua`'s T.decode; Err when the value is one of a kind decided here not yet (or
    /// one the library's decoding would stop on).
    pub(crate) fn decode(raw: &[u8], now: f64) -> Result<Decoded, &'static str> {
        let header = 1 + COUNTER_HEADER_NUMBERS * NUMBER_BYTES;
        if raw.first() != Some(&COUNTER_TAG) || raw.len() < header {
            return Ok(Decoded::Foreign);
        }
        let n = numbers(&raw[1..]);
        let mut c = Counter::empty(now, 0.0);
        c.dirty = false;
        [c.g, c.p, c.s, c.k, c.ro, c.re, c.ra, c.rl, c.rx, c.a] =
            [n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], n[9]];
        let body = if c.k == BODY_GCRA {
            GCRA_NUMBERS
        } else if c.k == BODY_SLIDING {
            SLIDING_NUMBERS
        } else if c.k == BODY_FIXED {
            FIXED_NUMBERS
        } else if c.k == BODY_LEASES {
            1
        } else if c.k == BODY_EMPTY {
            0
        } else {
            return Err("a counter of a kind not known");
        };
        let whole = header + body * NUMBER_BYTES;
        if raw.len() < whole {
            return Err("a counter value shorter than its kind's");
        }
        let b = &n[COUNTER_HEADER_NUMBERS..];
        if c.k == BODY_LEASES {
            // The count of leases, then their records: as the library's decoding reads them,
            // in doubles (a count whose records' bytes round to the length passes; a loop to
            // it reads its whole part), the rest another format's.
            let nb = b[0];
            let records = LEASE_NUMBERS * NUMBER_BYTES;
            if raw.len() as f64 != whole as f64 + nb * records as f64 {
                return Ok(Decoded::Foreign);
            }
            let read = if nb >= 1.0 { nb.floor() as usize } else { 0 };
            if whole + read * records != raw.len() {
                return Ok(Decoded::Foreign);
            }
            c.b = b[1..].to_vec();
            return Ok(Decoded::Counter(c));
        }
        if raw.len() != whole {
            return Ok(Decoded::Foreign);
        }
        if c.k == BODY_GCRA {
            [c.t, c.e, c.l] = [b[0], b[1], b[2]];
        } else if c.k == BODY_SLIDING {
            [c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw] =
                [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]];
        } else if c.k == BODY_FIXED {
            [c.w, c.wu, c.u] = [b[0], b[1], b[2]];
        }
        Ok(Decoded::Counter(c))
    }

    fn encode(&self) -> Vec<u8> {
        let header = [
            self.g, self.p, self.s, self.k, self.ro, self.re, self.ra, self.rl, self.rx, self.a,
        ];
        let gcra = [self.t, self.e, self.l];
        let fixed = [self.w, self.wu, self.u];
        let sliding = [
            self.qu, self.lo, self.ls, self.lu, self.qo, self.qe, self.fs, self.fu, self.qx,
            self.qw,
        ];
        let leases = [(self.b.len() / LEASE_NUMBERS) as f64];
        let (body, records): (&[f64], &[f64]) = if self.k == BODY_GCRA {
            (&gcra, &[])
        } else if self.k == BODY_SLIDING {
            (&sliding, &[])
        } else if self.k == BODY_FIXED {
            (&fixed, &[])
        } else if self.k == BODY_LEASES {
            (&leases, &self.b)
        } else {
            (&[], &[])
        };
        let words = header.len() + body.len() + records.len();
        let mut bytes = Vec::with_capacity(1 + words * NUMBER_BYTES);
        bytes.push(COUNTER_TAG);
        for word in header.iter().chain(body).chain(records) {
            bytes.extend_from_slice(&word.to_be_bytes());
        }
        bytes
    }

    /// `leases.lua`'s T.leases_used: the slots of every lease.
    fn leases_used(&self) -> f64 {
        self.b
            .chunks_exact(LEASE_NUMBERS)
            .fold(0.0, |sum, lease| sum + lease[1])
    }

    pub(crate) fn used(&self, p: &Policy, now: f64) -> f64 {
        if self.k == BODY_SLIDING {
            self.qu
        } else if self.k == BODY_FIXED {
            self.u
        } else if self.k == BODY_GCRA {
            div_ceil(sub0(self.t, now), p.emission)
        } else if self.k == BODY_LEASES {
            self.leases_used()
        } else {
            0.0
        }
    }

    pub(crate) fn counted_until(&self, p: &Policy) -> f64 {
        if self.k == BODY_SLIDING {
            if self.lu == 0.0 {
                0.0
            } else {
                self.ls + p.window
            }
        } else if self.k == BODY_FIXED {
            if self.u == 0.0 {
                0.0
            } else {
                (self.w + 1.0) * self.wu
            }
        } else if self.k == BODY_GCRA {
            self.t
        } else if self.k == BODY_LEASES {
            // `leases.lua`'s T.leases_counted_until: when the last lease ends (0 for none).
            self.b
                .chunks_exact(LEASE_NUMBERS)
                .fold(
                    0.0,
                    |latest, lease| if lease[2] > latest { lease[2] } else { latest },
                )
        } else {
            0.0
        }
    }

    fn idle_at(&self, p: &Policy) -> f64 {
        let mut idle = self.p.max(self.s).max(self.keep);
        if p.kind == KIND_RATE && self.re > self.ro {
            idle = idle.max(self.rl + p.window);
        }
        idle.max(self.counted_until(p))
    }

    /// `keys.lua`'s T.need, from now: until when the counter may live once granted.
    pub(crate) fn need(&self, p: &Policy, now: f64) -> f64 {
        self.need_for(p, now, true, None)
    }

    /// `keys.lua`'s T.need: until when the counter may live once written; `from_now`: the
    /// operation may make it count from now (a grant, a renewal); `reach`: until then (a
    /// charge's debt).
    pub(crate) fn need_for(&self, p: &Policy, now: f64, from_now: bool, reach: Option<f64>) -> f64 {
        let slack = p.slack() + EXPIRY_SLACK_US;
        let mut need = self.idle_at(p) + slack;
        if from_now {
            need = need.max(now + p.span());
        }
        if let Some(reach) = reach {
            need = need.max(reach + slack);
        }
        need
    }

    /// `keys.lua`'s T.cover, once the key is admitted: covered until `cover`, and kept at
    /// least a span from now within it.
    pub(crate) fn covered(&mut self, p: &Policy, now: f64, cover: f64) {
        self.a = cover;
        self.keep = (now + p.span()).min(cover - EXPIRY_SLACK_US);
        self.dirty = true;
    }
}

/// Big-endian doubles.
pub(crate) fn numbers(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(NUMBER_BYTES)
        .map(|chunk| {
            let mut word = [0u8; NUMBER_BYTES];
            word.copy_from_slice(chunk);
            f64::from_be_bytes(word)
        })
        .collect()
}

pub(crate) fn bytes_of(value: &Value) -> Option<&[u8]> {
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

/// Which Redis master runs this (`loss.lua`'s `T.identity`): node id, run id, replication id,
/// read from Redis.
fn read_identity(redis: &mut dyn Redis) -> Vec<u8> {
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

/// The identity this Redis process decides under, kept (reading it costs three commands and
/// the text of two `INFO` sections, about half of a native decision) and shared: the library
/// asks for it (`TOLLGATE.IDENTITY`) rather than reading its own whenever the module is loaded,
/// so module and library never write the slot's generation under two identities and take
/// turns declaring losses. It is forgotten when Redis loads a data set (a start, a full sync,
/// `DEBUG RELOAD`: the library is loaded anew then, and forgets its own too).
struct Kept {
    me: Option<Vec<u8>>,
    /// Loaded into a running Redis, no data set loaded since and no acquire decided yet: the
    /// library may have read an identity of this process before the module was there (the
    /// replication id changes without a load when a first replica attaches, or a backlog is
    /// freed). The first acquire that finds a generation written under such an identity, this
    /// process's node and run id with another replication id, takes it as the identity.
    adopt: bool,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    me: None,
    adopt: true,
});

/// Whether Redis tells the module of its loads (`loaded`); without that, the identity is read
/// on every call.
static KEEPING: AtomicBool = AtomicBool::new(false);

fn kept() -> std::sync::MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// The module was loaded; `keeping` when Redis will call `loaded` at every load of a data set.
pub(crate) fn module_loaded(keeping: bool) {
    *kept() = Kept {
        me: None,
        adopt: true,
    };
    KEEPING.store(keeping, Ordering::Relaxed);
}

/// Redis loaded (or began to load) a data set: the identity is read again, never adopted.
pub(crate) fn loaded() {
    *kept() = Kept {
        me: None,
        adopt: false,
    };
}

/// The identity kept, read first when there is none.
pub(crate) fn identity(redis: &mut dyn Redis) -> Vec<u8> {
    let mut kept = kept();
    match &kept.me {
        Some(me) if KEEPING.load(Ordering::Relaxed) => me.clone(),
        _ => {
            let me = read_identity(redis);
            kept.me = Some(me.clone());
            me
        }
    }
}

/// `TOLLGATE.IDENTITY`: the identity kept, for the library.
pub(crate) fn identity_command(redis: &mut dyn Redis, args: &[&[u8]]) -> Reply {
    if args.len() != 1 {
        return Reply::WrongArity;
    }
    Reply::Value(Value::Bytes(identity(redis)))
}

/// The first acquire since the module was loaded into a running Redis: a generation written
/// under this process's node and run id with another replication id is the library's, and
/// its identity becomes the one kept (see `Kept::adopt`).
fn adopt(me: Vec<u8>, written: Option<&[u8]>) -> Vec<u8> {
    let mut kept = kept();
    if !std::mem::replace(&mut kept.adopt, false) {
        return me;
    }
    let Some(theirs) = written.and_then(|raw| raw.get(GENERATION_HEADER_BYTES..)) else {
        return me;
    };
    let process = |id: &[u8]| {
        id.iter()
            .position(|&b| b == b':')
            .map(|at| id[..=at].to_vec())
    };
    match (process(&me), process(theirs)) {
        (Some(mine), Some(other)) if mine == other && theirs != me.as_slice() => {
            kept.me = Some(theirs.to_vec());
            theirs.to_vec()
        }
        _ => me,
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Generation {
    pub(crate) born: f64,
    pub(crate) lost: f64,
    /// When an eviction was last seen in this slot (`loss.lua`'s `gen.seen`); 0 when evictions
    /// are not watched.
    pub(crate) seen: f64,
}

/// The slot's generation (`loss.lua`'s `T.generation`), written when missing, foreign or due
/// for its daily renewal.
pub(crate) fn generation(
    redis: &mut dyn Redis,
    raw: Option<&[u8]>,
    key: &[u8],
    now: f64,
) -> Generation {
    let written_by = |me: &[u8]| {
        raw.is_some_and(|raw| {
            raw.len() > GENERATION_HEADER_BYTES && raw[GENERATION_HEADER_BYTES..] == *me
        })
    };
    let me = adopt(identity(redis), raw);
    let mut found = None;
    if let Some(raw) = raw
        && written_by(&me)
    {
        let n = numbers(&raw[..GENERATION_HEADER_BYTES]);
        found = Some((n[0], n[1]));
    }
    let (slot, renew) = match found {
        Some((born, renew)) => (
            Generation {
                born,
                lost: 0.0,
                seen: 0.0,
            },
            renew,
        ),
        None => (
            Generation {
                born: now,
                lost: 1.0,
                seen: 0.0,
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

/// `loss.lua`'s T.load then T.hold: the counter `loaded` (none: not kept), or a new one, held
/// until whatever it may have counted is over when it may have lost state: new, one the
/// library could not read, one written before the slot's generation began, or one missing
/// after an eviction was seen (`slot.seen`).
pub(crate) fn load(loaded: Option<Decoded>, now: f64, slot: &Generation, p: &Policy) -> Counter {
    let (mut c, hold_until) = match loaded {
        Some(Decoded::Counter(c)) if c.g == slot.born => (c, None),
        Some(Decoded::Counter(mut c)) => {
            c.g = slot.born;
            c.dirty = true;
            (c, Some(slot.born + p.memory))
        }
        Some(Decoded::Foreign) => (Counter::empty(now, slot.born), Some(now + p.memory)),
        None => (
            Counter::empty(now, slot.born),
            Some(slot.born.max(slot.seen) + p.memory),
        ),
    };
    if let Some(hold_until) = hold_until
        && hold_until > now
    {
        c.p = c.p.max(hold_until);
        c.s = c.s.max(hold_until);
    }
    c
}

/// A reply's head, with room for the numbers that follow it (five at most).
pub(crate) fn head(status: &str, now: f64, slot: &Generation) -> Vec<Value> {
    let mut reply = Vec::with_capacity(9);
    reply.extend([
        Value::Bytes(status.as_bytes().to_vec()),
        Value::Int(now as i64),
        Value::Int(slot.born as i64),
        Value::Int(slot.lost as i64),
    ]);
    reply
}

fn int_of(value: &Value) -> f64 {
    match value {
        Value::Int(n) => *n as f64,
        _ => -1.0,
    }
}

/// `logs.lua`'s T.log_read: the live records [lo, hi) (empty when the key is gone).
pub(crate) fn log_read(redis: &mut dyn Redis, key: &[u8], lo: f64, hi: f64) -> Vec<u8> {
    if hi <= lo {
        return Vec::new();
    }
    getrange(redis, key, lo, hi - 1.0)
}

fn getrange(redis: &mut dyn Redis, key: &[u8], from: f64, to: f64) -> Vec<u8> {
    match redis.call(&[b"GETRANGE", key, &text(from), &text(to)], false) {
        Value::Bytes(bytes) => bytes,
        _ => Vec::new(),
    }
}

/// `logs.lua`'s T.log_append: the new live range, expiry, and whether the log started over.
#[allow(clippy::too_many_arguments)]
fn log_append(
    redis: &mut dyn Redis,
    key: &[u8],
    (lo, hi, expiry): (f64, f64, f64),
    record: &[u8],
    until_us: f64,
    slack: f64,
    now: f64,
) -> (f64, f64, f64, bool) {
    let length = int_of(&redis.call(&[b"APPEND", key, record], true));
    if length != hi + RECORD_BYTES {
        let ttl = ttl_ms(until_us + slack, now);
        redis.call(&[b"SET", key, record, b"PX", &ttl], true);
        return (0.0, RECORD_BYTES, until_us + slack, true);
    }
    let mut expiry = expiry;
    if hi == 0.0 || expiry < until_us {
        expiry = until_us + slack;
        redis.call(&[b"PEXPIRE", key, &ttl_ms(expiry, now)], true);
    }
    (lo, length, expiry, false)
}

/// `logs.lua`'s T.log_rewrite.
pub(crate) fn log_rewrite(
    redis: &mut dyn Redis,
    key: &[u8],
    records: &[u8],
    expiry: f64,
    now: f64,
) -> (f64, f64, f64) {
    if records.is_empty() || expiry <= now {
        redis.call(&[b"DEL", key], true);
        return (0.0, 0.0, 0.0);
    }
    redis.call(&[b"SET", key, records, b"PX", &ttl_ms(expiry, now)], true);
    (0.0, records.len() as f64, expiry)
}

/// A counter being decided: its value, its keys, the policy and `now`, with Redis to reach its
/// logs.
pub(crate) struct Decision<'a, 'r> {
    pub(crate) redis: &'r mut dyn Redis,
    pub(crate) keys: Keys<'a>,
    pub(crate) p: &'a Policy,
    pub(crate) now: f64,
    pub(crate) c: Counter,
}

impl Decision<'_, '_> {
    // sliding.lua

    /// T.repair_buckets: closed buckets whose log was lost kept as one bucket.
    fn repair_buckets(&mut self) -> Vec<u8> {
        let c = &mut self.c;
        let units = c.qu - c.lu;
        let stamp = c.qx - self.p.window;
        let record = pack(&[stamp, stamp, units]);
        let ttl = ttl_ms(c.qx, self.now);
        self.redis
            .call(&[b"SET", self.keys.qk, &record, b"PX", &ttl], true);
        (c.qo, c.qe, c.fs, c.fu) = (0.0, RECORD_BYTES, stamp, units);
        c.dirty = true;
        record
    }

    /// T.closed_buckets: the closed buckets' records, read whole.
    pub(crate) fn closed_buckets(&mut self) -> Vec<u8> {
        let records = log_read(self.redis, self.keys.qk, self.c.qo, self.c.qe);
        if records.len() as f64 != self.c.qe - self.c.qo {
            return self.repair_buckets();
        }
        records
    }

    fn clear_closed(&mut self) {
        let c = &mut self.c;
        if c.qe > c.qo {
            c.dirty = true;
        }
        c.qu = c.lu;
        (c.qo, c.qe, c.fs, c.fu) = (c.qe, c.qe, -1.0, 0.0);
    }

    /// T.sliding_expire: drop the buckets that have left the window.
    fn sliding_expire(&mut self) {
        let window = self.p.window;
        let now = self.now;
        if self.c.qe > self.c.qo && window > self.c.qw && now < self.c.qx {
            self.c.qx += window - self.c.qw;
            self.c.qw = window;
            let ttl = ttl_ms(self.c.qx, now);
            self.redis.call(&[b"PEXPIRE", self.keys.qk, &ttl], true);
            self.c.dirty = true;
        }
        if self.c.qe > self.c.qo && now >= self.c.qx {
            self.clear_closed();
        }
        while self.c.qe > self.c.qo {
            if self.c.fs < 0.0 {
                let from = self.c.qo + BUCKET_STAMP;
                let bytes = getrange(self.redis, self.keys.qk, from, from + 15.0);
                if bytes.len() != 2 * NUMBER_BYTES {
                    self.repair_buckets();
                } else {
                    let n = numbers(&bytes);
                    (self.c.fs, self.c.fu) = (n[0], n[1]);
                }
                self.c.dirty = true;
            }
            if self.c.fs + window > now {
                break;
            }
            let c = &mut self.c;
            c.qu -= c.fu;
            c.qo += RECORD_BYTES;
            (c.fs, c.fu) = (-1.0, 0.0);
            c.dirty = true;
        }
        let c = &mut self.c;
        if c.lu > 0.0 && c.qe == c.qo && c.ls + window <= now {
            (c.qu, c.lo, c.ls, c.lu) = (0.0, 0.0, 0.0, 0.0);
            c.dirty = true;
        }
    }

    /// T.sliding_wait_for_room: until the oldest buckets holding `excess` units have left.
    fn sliding_wait_for_room(&mut self, excess: f64) -> f64 {
        let mut freed = 0.0;
        let records = self.closed_buckets();
        for record in records.chunks_exact(RECORD_BYTES as usize) {
            let n = numbers(&record[BUCKET_STAMP as usize..]);
            freed += n[1];
            if freed >= excess {
                return sub0(n[0] + self.p.window, self.now);
            }
        }
        sub0(self.c.ls + self.p.window, self.now)
    }

    /// T.sliding_grant: `cost` units in the newest bucket, or a new one; the time counted at.
    pub(crate) fn sliding_grant(&mut self, cost: f64, slack: f64) -> f64 {
        let (p, now) = (self.p, self.now);
        let span = if p.limit > SLIDING_BUCKETS_MAX {
            (p.window / SLIDING_BUCKETS_MAX).floor()
        } else {
            0.0
        };
        let mut at = now;
        if self.c.lu > 0.0 {
            at = self.c.ls.max(now);
        }
        if self.c.lu > 0.0 && at - self.c.lo <= span {
            self.c.ls = at;
            self.c.lu += cost;
        } else {
            if self.c.lu > 0.0 {
                // The newest bucket is closed: it moves to the log.
                let c = &self.c;
                let first = c.qe == c.qo;
                let (lost_units, lost_until) = (c.qu - c.lu, c.qx);
                let record = pack(&[c.lo, c.ls, c.lu]);
                let (qo, qe, qx, restarted) = log_append(
                    self.redis,
                    self.keys.qk,
                    (c.qo, c.qe, c.qx),
                    &record,
                    c.ls + p.window,
                    slack,
                    now,
                );
                let c = &mut self.c;
                (c.qo, c.qe, c.qx) = (qo, qe, qx);
                if first || restarted {
                    (c.fs, c.fu) = (c.ls, c.lu);
                    c.qw = p.window;
                } else {
                    c.qw = c.qw.min(p.window);
                }
                if restarted && !first {
                    // The log was lost with live buckets: counted as one until it would have
                    // expired.
                    let stamp = lost_until - p.window;
                    c.qx = c.qx.max(lost_until);
                    let mut value = pack(&[stamp, stamp, lost_units]);
                    value.extend(&record);
                    let ttl = ttl_ms(c.qx, now);
                    self.redis
                        .call(&[b"SET", self.keys.qk, &value, b"PX", &ttl], true);
                    (c.qo, c.qe, c.fs, c.fu) = (0.0, 2.0 * RECORD_BYTES, stamp, lost_units);
                }
            }
            (self.c.lo, self.c.ls, self.c.lu) = (at, at, cost);
        }
        self.c.qu += cost;
        at
    }

    // fixed.lua

    /// T.fixed_roll: the window `now` is in started, if it is a later one than the counter's.
    fn fixed_roll(&mut self) {
        let current = (self.now / self.p.window).floor();
        let c = &mut self.c;
        if c.w < current {
            c.w = current;
            c.u = 0.0;
            c.dirty = true;
        }
    }

    // reservations.lua

    pub(crate) fn clear_reservations(&mut self) {
        let c = &mut self.c;
        if c.re > c.ro {
            c.dirty = true;
        }
        (c.ro, c.re, c.ra) = (c.re, c.re, -1.0);
    }

    /// T.reservations_expire: drop the reservations that no longer count.
    fn reservations_expire(&mut self) {
        let window = self.p.window;
        if self.now >= self.c.rx {
            self.clear_reservations();
        }
        while self.c.re > self.c.ro {
            let mut at = self.c.ra;
            if at < 0.0 {
                let from = self.c.ro + RESERVATION_AT;
                let bytes = getrange(self.redis, self.keys.rk, from, from + 7.0);
                if bytes.len() != NUMBER_BYTES {
                    // The log is gone (evicted): its reservations can no longer be committed.
                    self.clear_reservations();
                    break;
                }
                at = numbers(&bytes)[0];
                self.c.ra = at;
                self.c.dirty = true;
            }
            if at + window > self.now {
                break;
            }
            self.c.ro += RECORD_BYTES;
            self.c.ra = -1.0;
            self.c.dirty = true;
        }
    }

    /// T.reservations_record: a refundable grant; past the cap the oldest is forgotten.
    fn reservations_record(&mut self, seq: f64, cost: f64, reserved_at: f64, slack: f64) {
        let c = &mut self.c;
        if c.re - c.ro >= RESERVATIONS_TRACKED_MAX * RECORD_BYTES {
            c.ro += RECORD_BYTES;
            c.ra = -1.0;
        }
        let first = c.re == c.ro;
        let (ro, re, rx, restarted) = log_append(
            self.redis,
            self.keys.rk,
            (c.ro, c.re, c.rx),
            &pack(&[seq, cost, reserved_at]),
            reserved_at + self.p.window,
            slack,
            self.now,
        );
        let c = &mut self.c;
        (c.ro, c.re, c.rx) = (ro, re, rx);
        if first || restarted {
            c.ra = reserved_at;
        }
        c.rl = reserved_at;
    }

    // counter.lua

    /// T.normalise: expired state dropped, or the body carried into the policy's algorithm
    /// (a rate policy's) or made leases (a concurrency limit's).
    pub(crate) fn normalise(&mut self) {
        let (p, now) = (self.p, self.now);
        if p.kind != KIND_RATE {
            self.clear_reservations();
            if self.c.k == BODY_LEASES {
                self.leases_expire();
            } else {
                if self.c.qe > 0.0 {
                    self.redis.call(&[b"DEL", self.keys.qk], true);
                }
                let c = &mut self.c;
                c.k = BODY_LEASES;
                c.b.clear();
                (c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw) =
                    (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0);
                c.dirty = true;
            }
            return;
        }
        if self.c.re > self.c.ro {
            self.reservations_expire();
        }
        if p.alg == ALG_SLIDING && self.c.k == BODY_SLIDING {
            self.sliding_expire();
        } else if p.alg == ALG_FIXED && self.c.k == BODY_FIXED && self.c.wu == p.window {
            self.fixed_roll();
        } else if p.alg == ALG_GCRA && self.c.k == BODY_GCRA && self.c.e == p.emission {
            // nothing expires in a TAT
        } else {
            let c = &mut self.c;
            let used_before = if c.k == BODY_SLIDING {
                c.qu
            } else if c.k == BODY_FIXED {
                c.u
            } else if c.k == BODY_GCRA {
                div_ceil(sub0(c.t, now), c.e)
            } else {
                0.0
            };
            c.dirty = true;
            c.b.clear();
            if c.qe > 0.0 {
                self.redis.call(&[b"DEL", self.keys.qk], true);
            }
            let c = &mut self.c;
            (c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw) =
                (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0);
            if p.alg == ALG_SLIDING {
                c.k = BODY_SLIDING;
                if used_before > 0.0 {
                    (c.lo, c.ls, c.lu, c.qu) = (now, now, used_before, used_before);
                }
            } else if p.alg == ALG_FIXED {
                // `fixed.lua`'s T.fixed_carried: counted in `now`'s window.
                c.k = BODY_FIXED;
                c.w = (now / p.window).floor();
                c.wu = p.window;
                c.u = used_before;
            } else {
                c.k = BODY_GCRA;
                c.t = now + used_before * p.emission;
                c.e = p.emission;
                c.l = 0.0;
            }
        }
    }

    pub(crate) fn wait_for_room(&mut self, cost: f64, open: f64) -> f64 {
        let in_use = self.c.used(self.p, self.now);
        if in_use + cost <= open {
            return 0.0;
        }
        if self.c.k == BODY_SLIDING {
            self.sliding_wait_for_room(in_use + cost - open)
        } else if self.c.k == BODY_FIXED {
            // `fixed.lua`'s T.fixed_wait_for_room: until the counter's window ends.
            sub0((self.c.w + 1.0) * self.p.window, self.now)
        } else if self.c.k == BODY_GCRA {
            sub0(sub0(self.c.t, (open - cost) * self.p.emission), self.now)
        } else if self.c.k == BODY_LEASES {
            self.leases_wait_for_room(in_use + cost - open)
        } else {
            0.0
        }
    }

    /// T.check: None when allowed, or (retry_after, remaining, reason, left).
    fn check(&mut self, cost: f64, open: f64, limit_paused_until: f64) -> Option<[f64; 4]> {
        self.normalise();
        let room_after = self.wait_for_room(cost, open);
        let pause_after = sub0(self.c.p.max(limit_paused_until), self.now);
        if room_after == 0.0 && pause_after == 0.0 {
            return None;
        }
        let used = self.c.used(self.p, self.now);
        if pause_after > 0.0 {
            return Some([
                room_after.max(pause_after),
                sub0(open, used),
                REASON_PAUSED,
                0.0,
            ]);
        }
        Some([
            room_after,
            sub0(open, used),
            REASON_CAPACITY,
            sub0(self.p.capacity, used),
        ])
    }

    /// T.grant: seq, remaining, reset_after, lease_expires_at (0 for a rate).
    fn grant(&mut self, cost: f64, open: f64, record: f64) -> [f64; 4] {
        let (p, now) = (self.p, self.now);
        let seq = self.c.s.max(now);
        self.c.s = seq + 1.0;
        self.c.dirty = true;
        let mut lease_expires_at = 0.0;
        let mut reserved_at = now;
        let slack = p.slack();
        if self.c.k == BODY_SLIDING {
            reserved_at = self.sliding_grant(cost, slack);
        } else if self.c.k == BODY_FIXED {
            self.c.u += cost;
        } else if self.c.k == BODY_GCRA {
            self.c.t = self.c.t.max(now) + cost * p.emission;
            self.c.l = seq;
        } else if self.c.k == BODY_LEASES {
            // `leases.lua`'s T.leases_grant: a lease of `cost` slots numbered `seq`.
            lease_expires_at = now + p.ttl;
            self.c.b.extend([seq, cost, lease_expires_at]);
        }
        if p.kind == KIND_RATE && record == 1.0 {
            self.reservations_record(seq, cost, reserved_at, slack);
        }
        [
            seq,
            sub0(open, self.c.used(p, now)),
            sub0(self.c.counted_until(p), now).min(p.memory),
            lease_expires_at,
        ]
    }

    /// T.save: the counter written back with its expiry, or deleted once idle.
    pub(crate) fn save(&mut self) {
        let now = self.now;
        if !self.c.dirty {
            return;
        }
        let idle = self.c.idle_at(self.p);
        let keys = &self.keys;
        if idle <= now {
            self.redis.call(&[b"DEL", keys.ck, keys.rk, keys.qk], true);
            return;
        }
        if self.c.re == self.c.ro {
            if self.c.re > 0.0 {
                self.redis.call(&[b"DEL", keys.rk], true);
                let c = &mut self.c;
                (c.ro, c.re, c.rx, c.ra) = (0.0, 0.0, 0.0, -1.0);
            }
        } else if self.c.ro >= RESERVATIONS_TRACKED_MAX * RECORD_BYTES {
            let live = log_read(self.redis, keys.rk, self.c.ro, self.c.re);
            (self.c.ro, self.c.re, self.c.rx) =
                log_rewrite(self.redis, keys.rk, &live, self.c.rx, now);
        }
        if self.c.k == BODY_SLIDING {
            if self.c.qe == self.c.qo {
                if self.c.qe > 0.0 {
                    self.redis.call(&[b"DEL", self.keys.qk], true);
                    let c = &mut self.c;
                    (c.qo, c.qe, c.qx, c.fs, c.fu) = (0.0, 0.0, 0.0, -1.0, 0.0);
                }
            } else if self.c.qo >= SLIDING_BUCKETS_MAX * RECORD_BYTES {
                let records = self.closed_buckets();
                (self.c.qo, self.c.qe, self.c.qx) =
                    log_rewrite(self.redis, self.keys.qk, &records, self.c.qx, now);
            }
        }
        let ttl = ttl_ms(idle, now);
        self.redis
            .call(&[b"SET", self.keys.ck, &self.c.encode(), b"PX", &ttl], true);
    }
}

/// A counter's admission (`keys.lua`'s T.read_admission): where its limit's key budget is
/// (0 none, x >= 1 at KEYS[x], below 0 in another slot), the budget, the cover the caller
/// brings (-x: held until x), and 1 when the budget can be lost apart from its counters.
pub(crate) struct Admission {
    pub(crate) tally: f64,
    pub(crate) budget: f64,
    pub(crate) carried: f64,
    pub(crate) apart: f64,
}

/// `keys.lua`'s T.cover_end: the cover given at `now` to a counter that must live until `need`.
fn cover_end(now: f64, need: f64, span: f64) -> f64 {
    let target = need.max(now + COVER_SPANS * span);
    let mut grid = div_ceil(span, 2.0);
    while target - now > GRID_PER_DISTANCE * grid {
        grid *= 2.0;
    }
    div_ceil(target, grid) * grid
}

/// What asking a key budget answered (`keys.lua`'s T.admit).
pub(crate) enum Admitted {
    Ok(f64),
    Keys(f64),
    Held(f64),
}

/// `keys.lua`'s T.admit: the key budget `raw` as read from `key` asked, the hold honoured or
/// not (`honour_hold`: a request's is, an operation on a counter already made, a commit, is
/// admitted through it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn admit(
    redis: &mut dyn Redis,
    key: &[u8],
    raw: Option<&[u8]>,
    now: f64,
    slot: &Generation,
    p: &Policy,
    old: f64,
    need: f64,
    adm: &Admission,
    honour_hold: bool,
) -> Admitted {
    let span = p.span();
    let mut found = None;
    let (mut ends, mut counts, mut counted) = (Vec::new(), Vec::new(), 0.0);
    if let Some(raw) = raw
        && raw.first() == Some(&TALLY_TAG)
        && raw.len() >= TALLY_HEADER_BYTES
        && (raw.len() - TALLY_HEADER_BYTES).is_multiple_of(TALLY_RECORD_BYTES)
    {
        let head = numbers(&raw[1..TALLY_HEADER_BYTES]);
        found = Some((head[0], head[1]));
        for record in numbers(&raw[TALLY_HEADER_BYTES..]).chunks_exact(2) {
            if record[0] > now {
                ends.push(record[0]);
                counts.push(record[1]);
                counted += record[1];
            }
        }
    }
    let born = slot.born;
    let lost_at = if adm.apart == 1.0 { born } else { 0.0 };
    let h = match found {
        None => lost_at.max(slot.seen) + HOLD_SPANS * span,
        Some((g, h)) if g != born => h.max(lost_at + HOLD_SPANS * span),
        Some((_, h)) => h,
    };
    if old > now {
        if let Some(i) = ends.iter().position(|&e| e == old) {
            counts[i] -= 1.0;
        }
    } else {
        if honour_hold && h > now {
            return Admitted::Held(h);
        }
        if counted >= adm.budget {
            return Admitted::Keys(adm.budget);
        }
    }
    let e = cover_end(now, need, span);
    let last = ends.last().copied().unwrap_or(0.0);
    let mut value = vec![TALLY_TAG];
    value.extend(pack(&[born, h]));
    let mut placed = false;
    for (i, &end) in ends.iter().enumerate() {
        if !placed && e <= end {
            placed = true;
            if e == end {
                counts[i] += 1.0;
            } else {
                value.extend(pack(&[e, 1.0]));
            }
        }
        if counts[i] > 0.0 {
            value.extend(pack(&[end, counts[i]]));
        }
    }
    if !placed {
        value.extend(pack(&[e, 1.0]));
    }
    let ttl = ttl_ms(h.max(e).max(last), now);
    redis.call(&[b"SET", key, &value, b"PX", &ttl], true);
    Admitted::Ok(e)
}

/// Why `cover` stopped an operation: the key's budget is in another slot (the caller asks it
/// for a cover reaching `need`, then calls again), full (`Keys`, the budget), or held after a
/// loss of its counts (`Held`, until when).
pub(crate) enum Uncovered {
    Admit { cover: f64, need: f64 },
    Keys(f64),
    Held(f64),
}

impl Uncovered {
    /// `keys.lua`'s T.uncovered: the reply to a one-counter operation `cover` stopped.
    pub(crate) fn reply(&self, now: f64, slot: &Generation) -> Reply {
        let (status, rest) = match *self {
            Uncovered::Admit { cover, need } => ("admit", vec![1.0, cover, need]),
            Uncovered::Keys(budget) => ("keys", vec![1.0, budget]),
            Uncovered::Held(until) => ("held", vec![1.0, until]),
        };
        let mut reply = head(status, now, slot);
        reply.extend(ints(&rest));
        Reply::Value(Value::Array(reply))
    }
}

/// `keys.lua`'s T.cover: counter `c`, of a key, about to be written by an operation that makes
/// it live until `need` (`Counter::need_for`): if that is past its cover, its key is admitted
/// first, with the cover the caller brings (`adm.carried`) or by asking its limit's budget at
/// `tally_key` (this slot; `honour_hold` as `admit`'s). Called before the operation writes
/// anything; Ok: `c` is covered (and kept a span, so that a retry finds it admitted).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cover(
    redis: &mut dyn Redis,
    c: &mut Counter,
    p: &Policy,
    now: f64,
    need: f64,
    adm: &Admission,
    slot: &Generation,
    tally_key: Option<&[u8]>,
    honour_hold: bool,
) -> Result<(), Uncovered> {
    if adm.tally == 0.0 || need <= c.a {
        return Ok(());
    }
    let admitted = if adm.carried < 0.0 {
        Admitted::Held(-adm.carried)
    } else if adm.carried < need {
        match tally_key {
            Some(tally_key) if adm.tally >= 1.0 => {
                let raw = redis.call(&[b"GET", tally_key], false);
                let raw = bytes_of(&raw);
                admit(
                    redis,
                    tally_key,
                    raw,
                    now,
                    slot,
                    p,
                    c.a,
                    need,
                    adm,
                    honour_hold,
                )
            }
            _ => return Err(Uncovered::Admit { cover: c.a, need }),
        }
    } else {
        Admitted::Ok(adm.carried)
    };
    match admitted {
        Admitted::Ok(cover) => {
            c.covered(p, now, cover);
            Ok(())
        }
        Admitted::Keys(budget) => Err(Uncovered::Keys(budget)),
        Admitted::Held(until) => Err(Uncovered::Held(until)),
    }
}

pub(crate) fn ints(numbers: &[f64]) -> impl Iterator<Item = Value> + '_ {
    numbers.iter().map(|&n| Value::Int(n as i64))
}

/// A command's arguments as the library's `FCALL` takes them: `numkeys key... packed`, then
/// exactly `trailing` more (a commit's wake-up channel). Redis takes every argument between the
/// count and the packed numbers for a key (the command's key positions), so nothing else may
/// follow. The keys, the packed numbers' doubles and the trailing arguments.
#[allow(clippy::type_complexity)]
pub(crate) fn split_call<'a>(
    args: &'a [&'a [u8]],
    trailing: usize,
) -> Result<(&'a [&'a [u8]], Vec<f64>, &'a [&'a [u8]]), Reply> {
    if args.len() < 3 {
        return Err(Reply::WrongArity);
    }
    let Some(numkeys) = std::str::from_utf8(args[1])
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return Err(bad("numkeys: not a count"));
    };
    if numkeys.checked_add(3 + trailing) != Some(args.len()) {
        return Err(bad(
            "numkeys: not the count of the arguments between it and the packed numbers",
        ));
    }
    let packed = args[2 + numkeys];
    if !packed.len().is_multiple_of(NUMBER_BYTES) {
        return Err(bad("packed numbers: not a whole count of doubles"));
    }
    Ok((&args[2..2 + numkeys], numbers(packed), &args[3 + numkeys..]))
}

/// `TOLLGATE.ACQUIRE numkeys key... packed`: an acquire, or a batch of them.
pub(crate) fn decide(redis: &mut dyn Redis, args: &[&[u8]]) -> Reply {
    let (keys, op, nums, record) = match crate::operations::split(args) {
        Ok(call) => call,
        Err(refusal) => return refusal,
    };
    if op == OP_BATCH {
        return batch(redis, &nums, keys, record);
    }
    if op != OP_ACQUIRE {
        return not_native("an operation other than an acquire or a batch of them");
    }
    let acquire = match Acquire::parse(&nums, 2, 0, keys) {
        Ok(acquire) => acquire,
        Err(refusal) => return refusal,
    };
    let now = match clock(redis) {
        Ok(now) => now,
        Err(refusal) => return refusal,
    };
    acquire.decide(redis, now, None, record)
}

/// `entry.lua`'s batch: acquires on one slot decided in order at one `now`, the generation read
/// once. Each acquire's numbers are read before anything is: one the module does not decide
/// refuses the whole batch, unwritten. One refused only for what Redis holds (a counter of
/// leases, or of a kind not known) is answered with that refusal in its place, the others decided:
/// its caller makes that acquire again through the library, as if it had come after them.
fn batch(redis: &mut dyn Redis, nums: &[f64], keys: &[&[u8]], record: Option<&[u8]>) -> Reply {
    let a = |i: usize| nums.get(i - 1).copied();
    // Every count bounded by what the call holds before it is used: a caller's numbers never
    // size an allocation or overflow an index (a panic here would stop Redis).
    let whole = |n: f64, most: usize| n >= 0.0 && n.fract() == 0.0 && n <= most as f64;
    let Some(count) = a(2).filter(|count| whole(*count, nums.len())) else {
        return bad("batch: no count of acquires, or more than its numbers hold");
    };
    let mut acquires = Vec::with_capacity(count as usize);
    let mut at = BATCH_AT;
    for _ in 0..count as usize {
        let (Some(shift), Some(own)) = (a(at), a(at + 1)) else {
            return bad("batch: fewer numbers than its acquires need");
        };
        if !whole(shift, keys.len()) || !whole(own, nums.len()) {
            return bad("batch: an acquire's shift or count is not a count within the call");
        }
        match Acquire::parse(nums, at + 2, shift as usize, keys) {
            Ok(acquire) => acquires.push(acquire),
            Err(refusal) => return refusal,
        }
        at += 2 + own as usize;
    }
    let Some(&gen_key) = keys.first() else {
        return bad("batch: no generation key");
    };
    let crate::operations::FirstRead { now, slot, .. } =
        match crate::operations::first_read(redis, vec![gen_key], record, false) {
            Ok(first) => first,
            Err(refusal) => return refusal,
        };
    let replies = acquires
        .iter()
        .map(
            |acquire| match acquire.decide(redis, now, Some(&slot), None) {
                Reply::Value(value) => value,
                Reply::WrongArity => Value::Error("ERR tollgate: batch: wrong arity".into()),
            },
        )
        .collect();
    Reply::Value(Value::Array(replies))
}

/// Redis's clock, in microseconds, as the library reads it (`TIME`).
pub(crate) fn clock(redis: &mut dyn Redis) -> Result<f64, Reply> {
    if let Some(now) = redis.time_us() {
        return Ok(now);
    }
    match redis.call(&[b"TIME"], false) {
        Value::Array(parts) => {
            let part = |i: usize| {
                parts
                    .get(i)
                    .and_then(bytes_of)
                    .and_then(|b| std::str::from_utf8(b).ok()?.parse::<f64>().ok())
            };
            match (part(0), part(1)) {
                (Some(s), Some(us)) => Ok(s * US_PER_S + us),
                _ => Err(bad("TIME: not seconds and microseconds")),
            }
        }
        _ => Err(bad("TIME: not seconds and microseconds")),
    }
}

/// One counter of an acquire: its policy, what the caller read of its limit's pause, its
/// admission, and its keys (state, reservations log, bucket log, queue; the pause's and the
/// key budget's when they are in this slot).
struct Take<'k> {
    cost: f64,
    p: Policy,
    open: f64,
    pause: f64,
    adm: Admission,
    ck: &'k [u8],
    rk: &'k [u8],
    qk: &'k [u8],
    wk: &'k [u8],
    pause_key: Option<&'k [u8]>,
    tally_key: Option<&'k [u8]>,
}

/// One acquire's numbers read (`acquire.lua`'s T.acquire): from `nums[s]` (1-based, its cost),
/// each key it names at `KEYS[x + shift]`, its counters' at `KEYS[shift + 3i - 1 ..]`, the
/// generation at `KEYS[1]`; every counter taken all or none.
struct Acquire<'k> {
    record: f64,
    gen_key: &'k [u8],
    takes: Vec<Take<'k>>,
    /// The request's priority, its waiter's id (`queue.rs`'s NEWCOMER_ID when it does not
    /// wait) and how long a place it takes lives.
    priority: f64,
    waiter: f64,
    place_ttl: f64,
}

impl<'k> Acquire<'k> {
    fn parse(
        nums: &[f64],
        s: usize,
        shift: usize,
        keys: &[&'k [u8]],
    ) -> Result<Acquire<'k>, Reply> {
        // Lua's a[i], 1-based; a missing number is an error, as the library's would be one.
        let a = |i: usize| nums.get(i - 1).copied();
        let key = |x: f64| -> Option<&'k [u8]> {
            if x >= 1.0 && x.fract() == 0.0 {
                keys.get(x as usize - 1).copied()
            } else {
                None
            }
        };
        let (Some(cost), Some(priority), Some(record), Some(n)) =
            (a(s), a(s + 1), a(s + 2), a(s + 3))
        else {
            return Err(bad("acquire: fewer than its head's numbers"));
        };
        // Bounded by the call's own numbers before it sizes anything.
        if n < 1.0 || n.fract() != 0.0 || n > nums.len() as f64 {
            return Err(bad(
                "acquire: its count of counters is not a count within the call",
            ));
        }
        let n = n as usize;
        let after = s + ACQUIRE_HEAD + n * ACQUIRE_PER_COUNTER;
        let (Some(waiter), Some(place_ttl)) = (a(after), a(after + 1)) else {
            return Err(bad(
                "acquire: fewer numbers than its counters and waiter need",
            ));
        };
        let waiter = if waiter == 0.0 {
            crate::queue::NEWCOMER_ID
        } else {
            waiter
        };
        let Some(gen_key) = key(1.0) else {
            return Err(bad("acquire: no generation key"));
        };
        let shifted = |x: f64| if x >= 1.0 { x + shift as f64 } else { x };
        let mut takes = Vec::with_capacity(n);
        for i in 0..n {
            // A cost per counter (below 0), after the place's lifetime, in the counters' order.
            let cost = if cost < 0.0 {
                match a(after + 2 + i) {
                    Some(own) => own,
                    None => return Err(bad("acquire: no cost for one of its counters")),
                }
            } else {
                cost
            };
            let at = s + ACQUIRE_HEAD + i * ACQUIRE_PER_COUNTER;
            let policy: Vec<f64> = (at..at + POLICY_NUMBERS).filter_map(a).collect();
            let adm_at = at + POLICY_NUMBERS + 1;
            let (Some(pause), Some(tally), Some(budget), Some(carried), Some(apart), Some(queue)) = (
                a(at + POLICY_NUMBERS),
                a(adm_at),
                a(adm_at + 1),
                a(adm_at + 2),
                a(adm_at + 3),
                a(adm_at + ADMISSION_NUMBERS),
            ) else {
                return Err(bad("acquire: fewer than a counter's numbers"));
            };
            let Ok(policy) = <[f64; POLICY_NUMBERS]>::try_from(policy) else {
                return Err(bad("acquire: fewer than a policy's numbers"));
            };
            let Some(p) = Policy::read(policy) else {
                return Err(not_native(
                    "a policy other than a concurrency limit or a GCRA, sliding or fixed window rate limit",
                ));
            };
            let counter = shift as f64 + KEYS_PER_COUNTER * (i + 1) as f64 - 1.0;
            let (Some(ck), Some(rk), Some(qk), Some(wk)) = (
                key(counter),
                key(counter + 1.0),
                key(counter + 2.0),
                key(shifted(queue)),
            ) else {
                return Err(bad(
                    "acquire: a key named by the numbers is not among the keys",
                ));
            };
            let pause_key = if pause >= 1.0 {
                match key(shifted(pause)) {
                    Some(k) => Some(k),
                    None => return Err(bad("acquire: the pause's key is not among the keys")),
                }
            } else {
                None
            };
            let tally_key = if tally >= 1.0 {
                match key(shifted(tally)) {
                    Some(k) => Some(k),
                    None => {
                        return Err(bad("acquire: the key budget's key is not among the keys"));
                    }
                }
            } else {
                None
            };
            let open = p.capacity_for(priority);
            takes.push(Take {
                cost,
                p,
                open,
                pause,
                adm: Admission {
                    tally,
                    budget,
                    carried,
                    apart,
                },
                ck,
                rk,
                qk,
                wk,
                pause_key,
                tally_key,
            });
        }
        Ok(Acquire {
            record,
            gen_key,
            takes,
            priority,
            waiter,
            place_ttl,
        })
    }

    /// Decide at `now`; `batch` the generation a batch read, else read here with the counters
    /// (and the evictions `record`, when the call watches them).
    fn decide(
        &self,
        redis: &mut dyn Redis,
        now: f64,
        batch: Option<&Generation>,
        record: Option<&[u8]>,
    ) -> Reply {
        let n = self.takes.len();
        for (i, take) in self.takes.iter().enumerate() {
            if take.cost < 1.0 || take.cost > take.open {
                let slot = match batch {
                    Some(slot) => *slot,
                    None => {
                        let raw = redis.call(&[b"GET", self.gen_key], false);
                        generation(redis, bytes_of(&raw), self.gen_key, now)
                    }
                };
                let mut reply = head("cost", now, &slot);
                reply.extend(ints(&[(i + 1) as f64, take.open]));
                return Reply::Value(Value::Array(reply));
            }
        }

        // One read, as the library's: the generation (unless a batch read it), every counter,
        // their queues, the limits' pauses kept here.
        let mut names: Vec<&[u8]> = Vec::with_capacity(2 + 3 * n);
        names.push(b"MGET");
        if batch.is_none() {
            names.push(self.gen_key);
        }
        names.extend(self.takes.iter().map(|take| take.ck));
        names.extend(self.takes.iter().map(|take| take.wk));
        names.extend(self.takes.iter().filter_map(|take| take.pause_key));
        if batch.is_none() {
            names.extend(record);
        }
        let values = match redis.call(&names, false) {
            Value::Array(values) if values.len() == names.len() - 1 => values,
            _ => return bad("MGET: not one value per key"),
        };
        // The generation first unless a batch read it; it is written (when due) only after
        // the refusals a value can make, so a refused acquire writes nothing.
        let first = usize::from(batch.is_none());
        let mut loaded = Vec::with_capacity(n);
        for raw in &values[first..first + n] {
            loaded.push(match bytes_of(raw) {
                Some(raw) => match Counter::decode(raw, now) {
                    Ok(c) => Some(c),
                    Err(what) => return not_native(what),
                },
                None => None,
            });
        }
        let slot = match batch {
            Some(slot) => *slot,
            None => crate::evictions::slot(redis, &values, self.gen_key, record, now),
        };
        let mut counters: Vec<Counter> = Vec::with_capacity(n);
        let mut pauses_at = first + 2 * n;
        let mut paused_until = Vec::with_capacity(n);
        for (take, loaded) in self.takes.iter().zip(loaded) {
            let c = load(loaded, now, &slot, &take.p);
            counters.push(c);
            paused_until.push(match take.pause_key {
                Some(_) => {
                    let value = crate::operations::paused_until(&values[pauses_at]);
                    pauses_at += 1;
                    value
                }
                None => -take.pause,
            });
        }

        // Keys to admit in another slot's budget: asked of the caller before anything more
        // is written.
        let mut ask: Option<Vec<Value>> = None;
        for (i, (take, c)) in self.takes.iter().zip(&counters).enumerate() {
            let adm = &take.adm;
            if adm.tally < 0.0 && adm.carried >= 0.0 {
                let need = c.need(&take.p, now);
                if need > c.a && adm.carried < need {
                    ask.get_or_insert_with(|| head("admit", now, &slot))
                        .extend(ints(&[(i + 1) as f64, c.a, need]));
                }
            }
        }
        if let Some(ask) = ask {
            return Reply::Value(Value::Array(ask));
        }
        // `keys.lua`'s T.cover, counter by counter: each key admitted before its counter is
        // written past its cover.
        let mut held: Vec<Option<f64>> = vec![None; n];
        for (i, (take, c)) in self.takes.iter().zip(counters.iter_mut()).enumerate() {
            let need = c.need(&take.p, now);
            match cover(
                redis,
                c,
                &take.p,
                now,
                need,
                &take.adm,
                &slot,
                take.tally_key,
                true,
            ) {
                Ok(()) => {}
                Err(Uncovered::Keys(budget)) => {
                    let mut reply = head("keys", now, &slot);
                    reply.extend(ints(&[(i + 1) as f64, budget]));
                    return Reply::Value(Value::Array(reply));
                }
                // Held after a loss of its budget: recovering, and not written past its cover.
                Err(Uncovered::Held(until)) => held[i] = Some(until),
                // Asked of the caller above, before anything was written.
                Err(Uncovered::Admit { .. }) => {
                    return bad("acquire: the key budget's key is not among the keys");
                }
            }
        }

        // Every counter checked, each its five numbers; granted on all only when all allow.
        let mut reply = head("ok", now, &slot);
        let mut all_allowed = true;
        // Each counter's queue, when its key holds one.
        let mut queues: Vec<Option<crate::queue::Found>> = Vec::with_capacity(n);
        for (i, take) in self.takes.iter().enumerate() {
            let (p, cost, open) = (&take.p, take.cost, take.open);
            let mut d = Decision {
                redis: &mut *redis,
                keys: Keys {
                    ck: take.ck,
                    rk: take.rk,
                    qk: take.qk,
                },
                p,
                now,
                c: std::mem::replace(&mut counters[i], Counter::empty(now, slot.born)),
            };
            let limit_paused_until = paused_until[i];
            let mut denial = match held[i] {
                Some(until) => Some([sub0(until, now), 0.0, REASON_RECOVERING, 0.0]),
                None => d.check(cost, open, limit_paused_until),
            };
            // Room for itself is not enough: also for every place ahead, or it waits behind
            // them.
            queues.push(bytes_of(&values[first + n + i]).map(|raw| {
                let (places, expired) = crate::queue::read(raw, now);
                let (rank, ahead) = crate::queue::rank(&places, now, self.priority, self.waiter);
                if denial.is_none() {
                    denial = d.queued(cost, ahead, open);
                }
                crate::queue::Found {
                    places,
                    rank,
                    expired,
                }
            }));
            counters[i] = d.c;
            let c = &counters[i];
            match denial {
                Some([retry, remaining, mut reason, left]) => {
                    all_allowed = false;
                    // Held after a loss rather than paused by someone: recovering, when the
                    // hold is what the request waits for.
                    if reason == REASON_PAUSED
                        && c.p >= limit_paused_until
                        && now + retry <= c.p
                        && (c.p == slot.born + p.memory || c.p == slot.seen + p.memory)
                    {
                        reason = REASON_RECOVERING;
                    }
                    let left = if reason == REASON_CAPACITY { left } else { 0.0 };
                    reply.push(Value::Int(OUTCOME_DENIED));
                    reply.extend(ints(&[retry, remaining, reason, left]));
                }
                None => {
                    reply.push(Value::Int(OUTCOME_ALLOWED));
                    reply.extend(ints(&[0.0, sub0(open, c.used(p, now)), 0.0, 0.0]));
                }
            }
        }
        for (i, take) in self.takes.iter().enumerate() {
            let mut d = Decision {
                redis: &mut *redis,
                keys: Keys {
                    ck: take.ck,
                    rk: take.rk,
                    qk: take.qk,
                },
                p: &take.p,
                now,
                c: std::mem::replace(&mut counters[i], Counter::empty(now, slot.born)),
            };
            if all_allowed {
                let at = REPLY_HEAD + OUTCOME_NUMBERS * i;
                reply[at] = Value::Int(OUTCOME_GRANTED);
                let granted = d.grant(take.cost, take.open, self.record);
                for (place, number) in reply[at + 1..at + OUTCOME_NUMBERS].iter_mut().zip(granted) {
                    *place = Value::Int(number as i64);
                }
            }
            // Denied: normalising may have dropped expired state; the store kept as small as
            // the core's.
            if held[i].is_none() {
                d.save();
            }
        }
        // A waiting request denied takes (or renews) its place; granted, it leaves. Places
        // that expired are dropped, and whoever they held back is woken.
        let counters = self.takes.iter().map(|take| (take.cost, take.wk, take.ck));
        let stands = self.waiter < crate::queue::NEWCOMER_ID && !all_allowed;
        let (waiter, priority, ttl) = (self.waiter, self.priority, self.place_ttl);
        let request = crate::queue::Waiter {
            id: waiter,
            priority,
            place_ttl: ttl,
            stands,
        };
        if let Err(failed) =
            crate::queue::settle(redis, now, self.gen_key, &request, counters, queues)
        {
            return failed;
        }
        Reply::Value(Value::Array(reply))
    }
}
