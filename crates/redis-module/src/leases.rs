//! Concurrency limits, natively: a counter's leases (`tollgate-redis`'s `lua/leases.lua`, kept
//! in the counter's value as `words.lua` lays them out, `Counter::b`), their expiry, the wait
//! for room, release and finding one to renew, for the acquire (`acquire.rs`) and the commit
//! (`commit.rs`); and `TOLLGATE.RENEW`, the library's renew (`lua/operations.lua`'s
//! `T.renew_op`, reached through `T.decide`'s path for one counter): a lease's expiry moved to
//! now plus its limit's ttl, `wrong_kind` for a rate limit, `lease_expired` for a lease ended
//! (or a counter not kept), `unknown` for a fence not handed out yet, the key admitted in its
//! limit's key budget first when the counter must live past its cover, the hold not honoured
//! (or the cover asked of the caller, `admit`; `keys`, `held`). It takes the library's keys
//! and packed numbers unchanged (`TOLLGATE.RENEW numkeys key... packed`, as `FCALL <function>
//! numkeys key... packed`), writes the same bytes and expiries and answers the same reply.
//! Evictions watched, or a stored value the module does not read (a kind not known), are
//! refused before anything is written (`ERR tollgate: not native: ...`).

use crate::acquire::{
    ADMISSION_NUMBERS, Admission, Counter, Decision, Decoded, Generation, KIND_CONCURRENCY,
    LEASE_NUMBERS, POLICY_NUMBERS, Policy, bad, bytes_of, cover, generation, head, ints,
    not_native, sub0,
};
use crate::{Redis, Reply, Value};

const OP_RENEW: f64 = 3.0;
/// `abi.rs`'s ARG_ADMISSION and ARG_OWN: the admission after the operation and the policy,
/// then the renewal's own number (the fence). 1-based, as Lua's `a[i]`.
const ARG_ADMISSION: usize = 2 + POLICY_NUMBERS;
const ARG_OWN: usize = ARG_ADMISSION + ADMISSION_NUMBERS;

impl Decision<'_, '_> {
    /// T.leases_expire: drop the leases that have ended at `now`.
    pub(crate) fn leases_expire(&mut self) {
        let now = self.now;
        let before = self.c.b.len();
        let mut kept = Vec::with_capacity(before);
        for lease in self.c.b.chunks_exact(LEASE_NUMBERS) {
            if lease[2] > now {
                kept.extend_from_slice(lease);
            }
        }
        if kept.len() < before {
            self.c.b = kept;
            self.c.dirty = true;
        }
    }

    /// T.leases_wait_for_room: time from now until the leases ending first have freed
    /// `excess` slots (0 when they never do).
    pub(crate) fn leases_wait_for_room(&self, excess: f64) -> f64 {
        let mut expiries: Vec<(f64, f64)> = self
            .c
            .b
            .chunks_exact(LEASE_NUMBERS)
            .map(|lease| (lease[2], lease[1]))
            .collect();
        // The library's order: by expiry, then slots (equal pairs free the same).
        expiries.sort_by(|x, y| {
            x.0.partial_cmp(&y.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(x.1.partial_cmp(&y.1).unwrap_or(std::cmp::Ordering::Equal))
        });
        let mut freed = 0.0;
        for (expires_at, slots) in expiries {
            freed += slots;
            if freed >= excess {
                return sub0(expires_at, self.now);
            }
        }
        0.0
    }

    /// T.leases_release: end the lease `fence`; the slots it freed (0 when it had already
    /// ended). The last lease takes its place, as the library's swap_remove.
    pub(crate) fn leases_release(&mut self, fence: f64) -> f64 {
        let Some(i) = self.leases_find(fence) else {
            return 0.0;
        };
        let b = &mut self.c.b;
        let released = b[i + 1];
        let last = b.len() - LEASE_NUMBERS;
        b.copy_within(last.., i);
        b.truncate(last);
        self.c.dirty = true;
        released
    }

    /// T.leases_find: where the lease `fence` is in `b` (its first number, 0-based); None when
    /// it has ended.
    pub(crate) fn leases_find(&self, fence: f64) -> Option<usize> {
        self.c
            .b
            .chunks_exact(LEASE_NUMBERS)
            .position(|lease| lease[0] == fence)
            .map(|at| at * LEASE_NUMBERS)
    }
}

/// The command: `TOLLGATE.RENEW numkeys key... packed`.
pub(crate) fn command(redis: &mut crate::ffi::Ctx, args: &[&[u8]]) -> Reply {
    renew(redis, args)
}

/// A reply's head and numbers.
fn answer(status: &str, now: f64, slot: &Generation, rest: &[f64]) -> Reply {
    let mut reply = head(status, now, slot);
    reply.extend(ints(rest));
    Reply::Value(Value::Array(reply))
}

/// `T.renew_op`: the lease numbered `fence` lives `ttl` from now.
pub(crate) fn renew(redis: &mut dyn Redis, args: &[&[u8]]) -> Reply {
    let (keys, nums, _) = match crate::acquire::split_call(args, 0) {
        Ok(call) => call,
        Err(refusal) => return refusal,
    };
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
    if op != OP_RENEW {
        return not_native("an operation other than a renew (without evictions watched)");
    }
    let policy: Vec<f64> = (2..2 + POLICY_NUMBERS).filter_map(a).collect();
    let Ok(
        [
            kind,
            limit,
            period,
            margin,
            _alg,
            _burst,
            ttl,
            res_high,
            res_normal,
        ],
    ) = <[f64; POLICY_NUMBERS]>::try_from(policy)
    else {
        return bad("renew: fewer than a policy's numbers");
    };
    let (Some(tally), Some(budget), Some(carried), Some(apart), Some(fence)) = (
        a(ARG_ADMISSION),
        a(ARG_ADMISSION + 1),
        a(ARG_ADMISSION + 2),
        a(ARG_ADMISSION + 3),
        a(ARG_OWN),
    ) else {
        return bad("renew: fewer than its admission's and its own numbers");
    };
    let adm = Admission {
        tally,
        budget,
        carried,
        apart,
    };
    let p = Policy::concurrency([limit, period, margin, ttl, res_high, res_normal]);
    let (Some(gen_key), Some(ck), Some(rk), Some(qk)) = (key(1.0), key(2.0), key(3.0), key(4.0))
    else {
        return bad("renew: fewer keys than a counter's");
    };
    let tally_key = if adm.tally >= 1.0 {
        match key(adm.tally) {
            Some(k) => Some(k),
            None => return bad("renew: the key budget's key is not among the keys"),
        }
    } else {
        None
    };

    let now = match crate::acquire::clock(redis) {
        Ok(now) => now,
        Err(refusal) => return refusal,
    };
    let values = match redis.call(&[b"MGET", gen_key, ck], false) {
        Value::Array(values) if values.len() == 2 => values,
        _ => return bad("MGET: not one value per key"),
    };
    // Decoded before the generation is written: a value decided here not is refused first.
    // (A rate limit's renewal reads no counter in the library: it is refused whatever the
    // value holds.)
    let loaded = match bytes_of(&values[1]) {
        Some(raw) if kind == KIND_CONCURRENCY => match Counter::decode(raw, now) {
            Ok(Decoded::Counter(c)) => Some(c),
            // Not a counter the library wrote: as forgotten (its leases have ended).
            Ok(Decoded::Foreign) => None,
            Err(what) => return not_native(what),
        },
        _ => None,
    };
    let slot = generation(redis, bytes_of(&values[0]), gen_key, now);
    if kind != KIND_CONCURRENCY {
        return answer("wrong_kind", now, &slot, &[]);
    }
    let Some(mut c) = loaded else {
        return answer("lease_expired", now, &slot, &[]);
    };
    if fence >= c.s {
        return answer("unknown", now, &slot, &[]);
    }

    // `keys.lua`'s T.cover, from now, the hold not honoured.
    let need = c.need(&p, now);
    if let Err(uncovered) = cover(redis, &mut c, &p, now, need, &adm, &slot, tally_key, false) {
        return uncovered.reply(now, &slot);
    }
    let mut d = Decision {
        redis,
        keys: crate::acquire::Keys { ck, rk, qk },
        p: &p,
        now,
        c,
    };
    d.normalise();
    match d.leases_find(fence) {
        Some(i) => {
            let expires_at = now + p.ttl;
            d.c.b[i + 2] = expires_at;
            d.c.dirty = true;
            d.save();
            answer("ok", now, &slot, &[expires_at])
        }
        None => {
            d.save();
            answer("lease_expired", now, &slot, &[])
        }
    }
}
