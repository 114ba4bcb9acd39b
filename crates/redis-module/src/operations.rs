//! The function library's operations on one counter or one limit but acquire and commit,
//! natively, each a command of its own taking the library's keys and packed numbers unchanged
//! (`TOLLGATE.<OPERATION> numkeys key... packed`, as `FCALL <function> numkeys key... packed`),
//! writing the same bytes and expiries and answering the same reply (`tollgate-redis`'s
//! `lua/entry.lua`, `pauses.lua`, `operations.lua`, `keys.lua`):
//! - `TOLLGATE.PAUSE` and `TOLLGATE.RESUME` (`T.pause_op`, `T.resume_op`): a key's pause, on its
//!   counter (made or kept, its key admitted in its limit's key budget as a request's would be;
//!   a resume lifts a pause and leaves a hold after a loss of state), or a whole limit's pause,
//!   a key of its own;
//! - `TOLLGATE.USAGE` (`T.usage_op`): what a counter counts, its pause (and its limit's, read
//!   from its key when kept in the call's slot, else as the caller read it) and its hold;
//! - `TOLLGATE.CHARGE` (`T.charge_op` and `counter.lua`'s `T.debit`): units spent beyond any
//!   grant counted, at most one capacity past the limit, the key covered as far as a GCRA debt
//!   reaches; a concurrency limit's counts nothing;
//! - `TOLLGATE.ADMIT` (`entry.lua`'s admit, `keys.lua`'s `T.admit`): a key asked of its limit's
//!   key budget, for a call in another slot;
//! - `TOLLGATE.BEGIN` (`entry.lua`'s begin): a new namespace's generation, born at time zero,
//!   written unless one exists (1, else 0).
//!
//! It also owns the reading of one counter's call (`CounterCall`: its policy, admission, keys
//! and own numbers, as `entry.lua` lays them out), which the commit (`commit.rs`) shares. The
//! counters' arithmetic and their load, cover and save are the acquire's (`acquire.rs`).
//! Refused before anything is written (`ERR tollgate: not native: ...`), for the library to
//! decide: a policy of a kind or algorithm not known, and a value of a kind not known.

use crate::acquire::{
    ADMISSION_NUMBERS, ALG_GCRA, Admission, Admitted, BODY_FIXED, BODY_GCRA, BODY_SLIDING, Counter,
    Decision, Decoded, GENERATION_TTL_MS, Generation, KIND_RATE, Keys, POLICY_NUMBERS, Policy,
    RENEW_EVERY_US, admit, bad, bytes_of, clock, cover, identity, load, not_native, pack,
    split_call, sub0, ttl_ms,
};
use crate::commit::answer;
use crate::evictions::{self, with_record};
use crate::{Redis, Reply, Value};

const OP_PAUSE: f64 = 4.0;
const OP_USAGE: f64 = 5.0;
const OP_BEGIN: f64 = 6.0;
const OP_RESUME: f64 = 7.0;
const OP_ADMIT: f64 = 8.0;
const OP_CHARGE: f64 = 11.0;
/// `abi.rs`'s ARG_ADMISSION and ARG_OWN: a one-counter call's admission after the operation
/// and the policy, then the operation's own numbers. 1-based, as Lua's `a[i]`.
pub(crate) const ARG_ADMISSION: usize = 2 + POLICY_NUMBERS;
pub(crate) const ARG_OWN: usize = ARG_ADMISSION + ADMISSION_NUMBERS;

/// One counter's call (`entry.lua`'s layout for every operation on one counter but an
/// acquire): [2..10] its policy, [ARG_ADMISSION..] its admission, then its own numbers from
/// [ARG_OWN]; KEYS[1] the generation, KEYS[2..4] the counter's three keys (a whole limit's
/// pause: KEYS[2] alone), then the keys its numbers name.
pub(crate) struct CounterCall<'k> {
    /// kind, limit, period, margin, algorithm, burst, ttl, the two reserves.
    pub(crate) policy: [f64; POLICY_NUMBERS],
    pub(crate) adm: Admission,
    /// The operation's own numbers, as many as it asked for.
    pub(crate) own: Vec<f64>,
    keys: &'k [&'k [u8]],
}

impl<'k> CounterCall<'k> {
    /// The call's numbers `nums` (the operation first) and `keys`, with `own` numbers of the
    /// operation `what` (named in errors).
    pub(crate) fn parse(
        nums: &[f64],
        keys: &'k [&'k [u8]],
        own: usize,
        what: &str,
    ) -> Result<CounterCall<'k>, Reply> {
        let Some(policy) = nums
            .get(1..1 + POLICY_NUMBERS)
            .and_then(|policy| <[f64; POLICY_NUMBERS]>::try_from(policy).ok())
        else {
            return Err(bad(&format!("{what}: fewer than a policy's numbers")));
        };
        let Some(&[tally, budget, carried, apart]) = nums.get(ARG_ADMISSION - 1..ARG_OWN - 1)
        else {
            return Err(bad(&format!("{what}: fewer than its admission's numbers")));
        };
        let Some(own) = nums.get(ARG_OWN - 1..ARG_OWN - 1 + own) else {
            return Err(bad(&format!("{what}: fewer than its own numbers")));
        };
        Ok(CounterCall {
            policy,
            adm: Admission {
                tally,
                budget,
                carried,
                apart,
            },
            own: own.to_vec(),
            keys,
        })
    }

    pub(crate) fn kind(&self) -> f64 {
        self.policy[0]
    }

    /// The policy, when the module decides its kind and algorithm (`Policy::read`).
    pub(crate) fn policy(&self) -> Option<Policy> {
        Policy::read(self.policy)
    }

    /// KEYS[x], when `x` names one of the call's keys.
    pub(crate) fn key(&self, x: f64) -> Option<&'k [u8]> {
        if x >= 1.0 && x.fract() == 0.0 {
            self.keys.get(x as usize - 1).copied()
        } else {
            None
        }
    }

    /// The generation's key and the counter's three.
    pub(crate) fn counter_keys(&self, what: &str) -> Result<(&'k [u8], Keys<'k>), Reply> {
        match (self.key(1.0), self.key(2.0), self.key(3.0), self.key(4.0)) {
            (Some(gen_key), Some(ck), Some(rk), Some(qk)) => Ok((gen_key, Keys { ck, rk, qk })),
            _ => Err(bad(&format!("{what}: fewer keys than a counter's"))),
        }
    }

    /// The decision on counter `c` of this call, once `keys.lua`'s T.cover admitted its key for
    /// `need` (none: the operation writes nothing new), the hold not honoured (the operation is
    /// on a counter made, or makes one as the library's does); Err: the reply `cover` ends the
    /// call with (`admit`, `keys`, `held`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decision<'a, 'r>(
        &self,
        redis: &'r mut dyn Redis,
        keys: Keys<'a>,
        p: &'a Policy,
        now: f64,
        slot: &Generation,
        tally_key: Option<&[u8]>,
        mut c: Counter,
        need: Option<f64>,
    ) -> Result<Decision<'a, 'r>, Reply> {
        if let Some(need) = need {
            cover(
                redis, &mut c, p, now, need, &self.adm, slot, tally_key, false,
            )
            .map_err(|uncovered| uncovered.reply(now, slot))?;
        }
        Ok(Decision {
            redis,
            keys,
            p,
            now,
            c,
        })
    }

    /// The key budget's key, when the admission names one in this slot.
    pub(crate) fn tally_key(&self, what: &str) -> Result<Option<&'k [u8]>, Reply> {
        if self.adm.tally < 1.0 {
            return Ok(None);
        }
        match self.key(self.adm.tally) {
            Some(key) => Ok(Some(key)),
            None => Err(bad(&format!(
                "{what}: the key budget's key is not among the keys"
            ))),
        }
    }
}

/// `entry.lua`'s first read of an operation on one counter or limit: `names` (the generation,
/// KEYS[2], and the limit's pause for a usage that names it), in one `MGET`.
pub(crate) fn read(redis: &mut dyn Redis, names: &[&[u8]]) -> Result<Vec<Value>, Reply> {
    let mut args: Vec<&[u8]> = Vec::with_capacity(names.len() + 1);
    args.push(b"MGET");
    args.extend_from_slice(names);
    match redis.call(&args, false) {
        Value::Array(values) if values.len() == names.len() => Ok(values),
        _ => Err(bad("MGET: not one value per key")),
    }
}

/// What a call on one key reads first, in one `MGET`: the generation, the key `names[1]` (a
/// counter's state, a limit's pause, its key budget, a queue), any more `names`, and the
/// evictions record when watched; then the counter in `names[1]` decoded when `decode` (before
/// anything is written: one the module does not read is refused first), and the slot's
/// generation written when due.
pub(crate) struct FirstRead {
    pub(crate) now: f64,
    pub(crate) values: Vec<Value>,
    pub(crate) loaded: Option<Decoded>,
    pub(crate) slot: Generation,
}

pub(crate) fn first_read(
    redis: &mut dyn Redis,
    names: Vec<&[u8]>,
    record: Option<&[u8]>,
    decode: bool,
) -> Result<FirstRead, Reply> {
    let Some(&gen_key) = names.first() else {
        return Err(bad("no generation key"));
    };
    let now = clock(redis)?;
    let values = read(redis, &with_record(names, record))?;
    let loaded = match values.get(1) {
        Some(value) if decode => decoded(value, now)?,
        _ => None,
    };
    let slot = evictions::slot(redis, &values, gen_key, record, now);
    Ok(FirstRead {
        now,
        values,
        loaded,
        slot,
    })
}

/// The counter a value holds, decoded before anything is written: one decided here not is
/// refused first.
pub(crate) fn decoded(value: &Value, now: f64) -> Result<Option<Decoded>, Reply> {
    match bytes_of(value) {
        Some(raw) => Counter::decode(raw, now).map(Some).map_err(not_native),
        None => Ok(None),
    }
}

/// A limit's pause as its key holds it (Lua's `tonumber(value) or 0`).
pub(crate) fn paused_until(value: &Value) -> f64 {
    bytes_of(value)
        .and_then(|b| std::str::from_utf8(b).ok()?.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A call's keys, its operation, its numbers (the operation first) and the evictions record's
/// key when the call watches evictions.
type Split<'a> = (&'a [&'a [u8]], f64, Vec<f64>, Option<&'a [u8]>);

/// The call's keys, operation, numbers and evictions record (`evictions::operation`).
pub(crate) fn split<'a>(args: &'a [&'a [u8]]) -> Result<Split<'a>, Reply> {
    split_with(args, 0).map(|(split, _)| split)
}

/// `split`, with exactly `trailing` arguments after the packed numbers (a commit's wake-up
/// channel, a leave's counter key), returned too.
#[allow(clippy::type_complexity)]
pub(crate) fn split_with<'a>(
    args: &'a [&'a [u8]],
    trailing: usize,
) -> Result<(Split<'a>, &'a [&'a [u8]]), Reply> {
    let (keys, nums, rest) = split_call(args, trailing)?;
    let Some(&code) = nums.first() else {
        return Err(bad("packed numbers: empty"));
    };
    let (op, record) = evictions::operation(code, keys)?;
    Ok(((keys, op, nums, record), rest))
}

/// A command's reply, or its refusal.
pub(crate) fn reply_of(result: Result<Reply, Reply>) -> Reply {
    result.unwrap_or_else(|refusal| refusal)
}

/// The refusal of a key's pause, resume or usage of a counter of a policy not decided here.
fn counter_not_native() -> Reply {
    not_native(
        "a pause, resume or usage of a counter of other than a concurrency limit or a GCRA, sliding or fixed window rate limit",
    )
}

/// `pauses.lua`'s T.pause_op: [ARG_OWN] duration, [ARG_OWN + 1] keyed (1: a key's counter at
/// KEYS[2..4]; else the limit's pause at KEYS[2]). Reply: ok now born lost paused_until.
pub(crate) fn pause(redis: &mut dyn Redis, args: &[&[u8]]) -> Result<Reply, Reply> {
    let (keys, op, nums, record) = split(args)?;
    if op != OP_PAUSE {
        return Err(not_native("an operation other than a pause"));
    }
    let call = CounterCall::parse(&nums, keys, 2, "pause")?;
    let [duration, keyed] = call.own[..] else {
        return Err(bad("pause: fewer than its own numbers"));
    };
    if keyed != 1.0 {
        let (Some(gen_key), Some(pause_key)) = (call.key(1.0), call.key(2.0)) else {
            return Err(bad("pause: no generation or pause key"));
        };
        let FirstRead {
            now, values, slot, ..
        } = first_read(redis, vec![gen_key, pause_key], record, false)?;
        let until_us = (now + duration).max(paused_until(&values[1]));
        let value = crate::acquire::text(until_us);
        redis.call(
            &[b"SET", pause_key, &value, b"PX", &ttl_ms(until_us, now)],
            true,
        );
        return Ok(answer("ok", now, &slot, &[until_us]));
    }
    let Some(p) = call.policy() else {
        return Err(counter_not_native());
    };
    let (gen_key, counter) = call.counter_keys("pause")?;
    let tally_key = call.tally_key("pause")?;
    let FirstRead {
        now, loaded, slot, ..
    } = first_read(redis, vec![gen_key, counter.ck], record, true)?;
    let mut c = load(loaded, now, &slot, &p);
    let until_us = now + duration;
    if until_us > c.p {
        c.p = until_us;
        c.dirty = true;
    }
    let need = c.need_for(&p, now, false, None);
    let mut d = call.decision(redis, counter, &p, now, &slot, tally_key, c, Some(need))?;
    d.save();
    Ok(answer("ok", now, &slot, &[d.c.p]))
}

/// `pauses.lua`'s T.resume_op: [ARG_OWN] keyed (as for a pause). Reply: ok now born lost
/// lifted (1 when a pause was on). A hold after a loss of state stays; a counter not kept is
/// not made.
pub(crate) fn resume(redis: &mut dyn Redis, args: &[&[u8]]) -> Result<Reply, Reply> {
    let (keys, op, nums, record) = split(args)?;
    if op != OP_RESUME {
        return Err(not_native("an operation other than a resume"));
    }
    let call = CounterCall::parse(&nums, keys, 1, "resume")?;
    if call.own[0] != 1.0 {
        let (Some(gen_key), Some(pause_key)) = (call.key(1.0), call.key(2.0)) else {
            return Err(bad("resume: no generation or pause key"));
        };
        let FirstRead {
            now, values, slot, ..
        } = first_read(redis, vec![gen_key, pause_key], record, false)?;
        let lifted = f64::from(u8::from(paused_until(&values[1]) > now));
        redis.call(&[b"DEL", pause_key], true);
        return Ok(answer("ok", now, &slot, &[lifted]));
    }
    let Some(p) = call.policy() else {
        return Err(counter_not_native());
    };
    let (gen_key, counter) = call.counter_keys("resume")?;
    let tally_key = call.tally_key("resume")?;
    let FirstRead {
        now,
        values,
        loaded,
        slot,
    } = first_read(redis, vec![gen_key, counter.ck], record, true)?;
    if values[1] == Value::Nil {
        return Ok(answer("ok", now, &slot, &[0.0]));
    }
    let mut c = load(loaded, now, &slot, &p);
    // A hold after a loss ends here: a pause past it is lifted to it, never below.
    let keep = slot.born + p.memory;
    let lifted = f64::from(u8::from(c.p > now.max(keep)));
    if c.p > keep {
        c.p = keep;
        c.dirty = true;
    }
    let need = c.need_for(&p, now, false, None);
    call.decision(redis, counter, &p, now, &slot, tally_key, c, Some(need))?
        .save();
    Ok(answer("ok", now, &slot, &[lifted]))
}

/// `operations.lua`'s T.usage_op, counting nothing: [ARG_OWN] where the limit's pause is
/// (x >= 1: KEYS[x], read with the counter's state; else -x, as the caller read it). Reply: ok
/// now born lost used reset_after paused_until held_until. A counter not kept is not made.
pub(crate) fn usage(redis: &mut dyn Redis, args: &[&[u8]]) -> Result<Reply, Reply> {
    let (keys, op, nums, record) = split(args)?;
    if op != OP_USAGE {
        return Err(not_native("an operation other than a usage"));
    }
    let call = CounterCall::parse(&nums, keys, 1, "usage")?;
    let Some(p) = call.policy() else {
        return Err(counter_not_native());
    };
    let (gen_key, counter) = call.counter_keys("usage")?;
    let tally_key = call.tally_key("usage")?;
    let pause = call.own[0];
    let mut names = vec![gen_key, counter.ck];
    if pause >= 1.0 {
        match call.key(pause) {
            Some(pause_key) => names.push(pause_key),
            None => return Err(bad("usage: the pause's key is not among the keys")),
        }
    }
    let FirstRead {
        now,
        values,
        loaded,
        slot,
    } = first_read(redis, names, record, true)?;
    let limit_paused_until = if pause >= 1.0 {
        paused_until(&values[2])
    } else {
        -pause
    };
    let kept = values[1] != Value::Nil;
    let c = load(loaded, now, &slot, &p);
    let need = kept.then(|| c.need(&p, now));
    let mut d = call.decision(redis, counter, &p, now, &slot, tally_key, c, need)?;
    d.normalise();
    let c = &d.c;
    // Held after a loss rather than paused by someone, as an acquire tells `recovering` apart.
    let held = if c.p > now
        && c.p >= limit_paused_until
        && (c.p == slot.born + p.memory || c.p == slot.seen + p.memory)
    {
        c.p
    } else {
        0.0
    };
    let reply = answer(
        "ok",
        now,
        &slot,
        &[
            c.used(&p, now),
            sub0(c.counted_until(&p), now).min(p.memory),
            c.p.max(limit_paused_until),
            held,
        ],
    );
    // Normalising may have dropped expired state: the store kept as small as the core's.
    if kept {
        d.save();
    }
    Ok(reply)
}

/// `operations.lua`'s T.charge_op: [ARG_OWN] units. Reply: ok now born lost charged. A
/// concurrency limit counts nothing and makes nothing.
pub(crate) fn charge(redis: &mut dyn Redis, args: &[&[u8]]) -> Result<Reply, Reply> {
    let (keys, op, nums, record) = split(args)?;
    if op != OP_CHARGE {
        return Err(not_native("an operation other than a charge"));
    }
    let call = CounterCall::parse(&nums, keys, 1, "charge")?;
    let rate = call.kind() == KIND_RATE;
    let p = call.policy();
    if rate && p.is_none() {
        return Err(not_native(
            "a charge of a rate limit of other than GCRA, sliding or fixed window",
        ));
    }
    let (gen_key, counter) = call.counter_keys("charge")?;
    let tally_key = call.tally_key("charge")?;
    // A concurrency limit's counter is not read at all (its leases are not refused).
    let FirstRead {
        now, loaded, slot, ..
    } = first_read(redis, vec![gen_key, counter.ck], record, rate)?;
    let Some(p) = p.filter(|_| rate) else {
        return Ok(answer("ok", now, &slot, &[0.0]));
    };
    let c = load(loaded, now, &slot, &p);
    // A GCRA debt can leave a backlog of two capacities, longer than a grant's span: the key is
    // covered that far before anything is written.
    let reach = (p.alg == ALG_GCRA).then_some(now + 2.0 * p.capacity * p.emission);
    let need = c.need_for(&p, now, true, reach);
    let mut d = call.decision(redis, counter, &p, now, &slot, tally_key, c, Some(need))?;
    let charged = d.debit(call.own[0]);
    d.save();
    Ok(answer("ok", now, &slot, &[charged]))
}

impl Decision<'_, '_> {
    /// `counter.lua`'s T.debit for a rate limit: `units` spent at now beyond anything granted
    /// counted, even past the limit, at most one capacity past it; the units counted.
    fn debit(&mut self, units: f64) -> f64 {
        let (p, now) = (self.p, self.now);
        self.normalise();
        let units = units.min(sub0(2.0 * p.capacity, self.c.used(p, now)));
        if units <= 0.0 {
            return 0.0;
        }
        self.c.dirty = true;
        if self.c.k == BODY_SLIDING {
            self.sliding_grant(units, p.slack());
        } else if self.c.k == BODY_FIXED {
            self.c.u += units;
        } else if self.c.k == BODY_GCRA {
            self.c.t = self.c.t.max(now) + units * p.emission;
        }
        units
    }
}

/// `entry.lua`'s admit: [2..10] the policy, [11] the budget, [12] the counter's cover, [13]
/// until when it must live, [14] honour a hold, [15] apart; KEYS[2] the limit's key budget.
/// Reply: ok now born lost cover_end, keys now born lost budget, or held now born lost until.
pub(crate) fn admit_key(redis: &mut dyn Redis, args: &[&[u8]]) -> Result<Reply, Reply> {
    let (keys, op, nums, record) = split(args)?;
    if op != OP_ADMIT {
        return Err(not_native("an operation other than an admission of a key"));
    }
    let a = |i: usize| nums.get(i - 1).copied();
    let Some(policy) = nums
        .get(1..1 + POLICY_NUMBERS)
        .and_then(|policy| <[f64; POLICY_NUMBERS]>::try_from(policy).ok())
    else {
        return Err(bad("admit: fewer than a policy's numbers"));
    };
    let (Some(budget), Some(old), Some(need), Some(honour_hold), Some(apart)) = (
        a(ARG_ADMISSION),
        a(ARG_ADMISSION + 1),
        a(ARG_ADMISSION + 2),
        a(ARG_ADMISSION + 3),
        a(ARG_ADMISSION + 4),
    ) else {
        return Err(bad("admit: fewer than its own numbers"));
    };
    let (Some(&gen_key), Some(&tally_key)) = (keys.first(), keys.get(1)) else {
        return Err(bad("admit: no generation or key budget key"));
    };
    // Only the policy's span is read: a concurrency limit's counters live a lease's time.
    let p = Policy::of(policy);
    let FirstRead {
        now, values, slot, ..
    } = first_read(redis, vec![gen_key, tally_key], record, false)?;
    let adm = Admission {
        tally: 2.0,
        budget,
        carried: 0.0,
        apart,
    };
    let (status, value) = match admit(
        redis,
        tally_key,
        bytes_of(&values[1]),
        now,
        &slot,
        &p,
        old,
        need,
        &adm,
        honour_hold == 1.0,
    ) {
        Admitted::Ok(end) => ("ok", end),
        Admitted::Keys(budget) => ("keys", budget),
        Admitted::Held(until) => ("held", until),
    };
    Ok(answer(status, now, &slot, &[value]))
}

/// `entry.lua`'s begin: KEYS[1] a new namespace's generation, born at time zero and owned
/// here, written unless one exists. Reply: 1 when written, else 0.
pub(crate) fn begin(redis: &mut dyn Redis, args: &[&[u8]]) -> Result<Reply, Reply> {
    let (keys, op, _, record) = split(args)?;
    if op != OP_BEGIN {
        return Err(not_native(
            "an operation other than a new namespace's begin",
        ));
    }
    let Some(&gen_key) = keys.first() else {
        return Err(bad("begin: no generation key"));
    };
    let now = clock(redis)?;
    let mut value = pack(&[0.0, now + RENEW_EVERY_US]);
    value.extend(identity(redis));
    let ttl = GENERATION_TTL_MS.to_string();
    let set = redis.call(
        &[b"SET", gen_key, &value, b"NX", b"PX", ttl.as_bytes()],
        true,
    ) != Value::Nil;
    // Nothing of a new namespace was evicted: its record starts at the count now.
    if set && let Some(record) = record {
        evictions::begin(redis, record, now);
    }
    Ok(Reply::Value(Value::Int(i64::from(set))))
}
