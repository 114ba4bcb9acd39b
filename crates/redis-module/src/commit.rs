//! `TOLLGATE.COMMIT`: the function library's commit (`tollgate-redis`'s `T.commit_op` in
//! `lua/operations.lua`, reached through `T.decide`'s path for one counter), natively, for a
//! reservation of one rate counter, GCRA, sliding or fixed window, or a concurrency limit's
//! lease (evictions watched or not, `evictions.rs`): the unused units refunded (or nothing to refund), the
//! lease's slots released (`leases.rs`; `ok` with nothing released for a counter not kept),
//! `gone`, `unknown`, `used_above_cost`, the key admitted in its limit's key budget first when
//! the counter must live past its cover (or the cover asked of the caller, `admit`; `keys`,
//! `held`), and the wake-up published when units or slots came back. It takes the library's
//! keys and packed numbers unchanged (`TOLLGATE.COMMIT numkeys key... packed channel`, as
//! `FCALL <function> numkeys key... packed channel`), writes the same bytes and expiries and
//! answers the same reply; the arithmetic and the counter's helpers are the acquire's
//! (`acquire.rs`). A rate algorithm not known, or a value of a kind not known, is refused before anything is written (`ERR tollgate: not native: ...`), for the
//! library to decide.

use crate::acquire::{
    BODY_FIXED, BODY_GCRA, BODY_LEASES, BODY_SLIDING, Decision, Decoded, Generation,
    KIND_CONCURRENCY, Keys, NUMBER_BYTES, RECORD_BYTES, RESERVATION_AT, bad, head, ints, log_read,
    log_rewrite, not_native, numbers, pack, sub0, text,
};
use crate::operations::{CounterCall, FirstRead, first_read, split_with};
use crate::{Redis, Reply, Value};

const OP_COMMIT: f64 = 2.0;
/// Where a closed bucket's units are in its record (`abi.rs`'s BUCKET_UNITS).
const BUCKET_UNITS: f64 = 16.0;
const RECORD: usize = RECORD_BYTES as usize;

/// A reply's head and numbers.
pub(crate) fn answer(status: &str, now: f64, slot: &Generation, rest: &[f64]) -> Reply {
    let mut reply = head(status, now, slot);
    reply.extend(ints(rest));
    Reply::Value(Value::Array(reply))
}

/// `TOLLGATE.COMMIT numkeys key... packed channel`.
pub(crate) fn decide(redis: &mut dyn Redis, args: &[&[u8]]) -> Reply {
    let ((keys, op, nums, record), trailing) = match split_with(args, 1) {
        Ok(call) => call,
        Err(refusal) => return refusal,
    };
    if op != OP_COMMIT {
        return not_native("an operation other than a commit");
    }
    let call = match CounterCall::parse(&nums, keys, 2, "commit") {
        Ok(call) => call,
        Err(refusal) => return refusal,
    };
    let Some(p) = call.policy() else {
        return not_native(
            "a commit of other than a concurrency limit or a GCRA, sliding or fixed window rate limit",
        );
    };
    let [seq, used] = call.own[..] else {
        return bad("commit: fewer than its own numbers");
    };
    // The library publishes to ARGV[2] only when units come back; the store always sends it.
    let Some(&channel) = trailing.first() else {
        return bad("commit: no wake-up channel after the packed numbers");
    };
    let (gen_key, Keys { ck, rk, qk }) = match call.counter_keys("commit") {
        Ok(keys) => keys,
        Err(refusal) => return refusal,
    };
    let tally_key = match call.tally_key("commit") {
        Ok(key) => key,
        Err(refusal) => return refusal,
    };

    let FirstRead {
        now, loaded, slot, ..
    } = match first_read(redis, vec![gen_key, ck], record, true) {
        Ok(first) => first,
        Err(refusal) => return refusal,
    };
    // Not a counter the library wrote: as forgotten (its grants no longer count).
    let loaded = match loaded {
        Some(Decoded::Counter(c)) => Some(c),
        _ => None,
    };
    // Forgotten counters were idle: nothing they granted still counts.
    let Some(c) = loaded else {
        if p.kind == KIND_CONCURRENCY {
            return answer("ok", now, &slot, &[0.0, 0.0]);
        }
        return answer("gone", now, &slot, &[]);
    };
    if seq >= c.s {
        return answer("unknown", now, &slot, &[]);
    }

    // The key admitted before the counter is written past its cover.
    let need = c.need(&p, now);
    let keys = Keys { ck, rk, qk };
    let mut d = match call.decision(redis, keys, &p, now, &slot, tally_key, c, Some(need)) {
        Ok(d) => d,
        Err(uncovered) => return uncovered,
    };
    d.normalise();
    if d.c.k == BODY_LEASES {
        // A lease's release: its slots come back at once.
        let released = d.leases_release(seq);
        d.save();
        if released > 0.0 {
            d.redis.call(&[b"PUBLISH", channel, ck], true);
        }
        return answer("ok", now, &slot, &[0.0, released]);
    }
    let Some((index, units, at, live)) = d.reservations_find(seq) else {
        d.save();
        return answer("gone", now, &slot, &[]);
    };
    if used > units {
        d.save();
        return answer("used_above_cost", now, &slot, &[units]);
    }
    d.reservations_remove(&live, index);
    let give_back = units - used;
    let refunded = if d.c.k == BODY_SLIDING {
        d.sliding_refund(at, give_back)
    } else if d.c.k == BODY_FIXED {
        // `fixed.lua`'s T.fixed_refund: only a reservation made in the window that counts now.
        if (at / p.window).floor() == d.c.w {
            let refunded = give_back.min(d.c.u);
            d.c.u -= refunded;
            refunded
        } else {
            0.0
        }
    } else if d.c.k == BODY_GCRA {
        // `gcra.lua`'s T.gcra_refund: only the newest grant's time can be taken back.
        if d.c.l == seq {
            d.c.t = sub0(d.c.t, give_back * p.emission);
            give_back
        } else {
            0.0
        }
    } else {
        0.0
    };
    d.save();
    if refunded > 0.0 {
        // `queue.lua`'s T.wake: the counter's key on the namespace's wake-up channel. Called
        // to be replicated, as the library's call is: Redis sends a PUBLISH to replicas only.
        d.redis.call(&[b"PUBLISH", channel, ck], true);
    }
    answer("ok", now, &slot, &[refunded, 0.0])
}

/// A record's three numbers.
fn record(records: &[u8], i: usize) -> [f64; 3] {
    let n = numbers(&records[i * RECORD..(i + 1) * RECORD]);
    [n[0], n[1], n[2]]
}

/// `records` without its record `i` (0-based).
fn without(records: &[u8], i: usize) -> Vec<u8> {
    let mut rest = records[..i * RECORD].to_vec();
    rest.extend_from_slice(&records[(i + 1) * RECORD..]);
    rest
}

impl Decision<'_, '_> {
    // reservations.lua

    /// T.reservations_find: the open reservation numbered `seq` (its place, 1-based as the
    /// library's, its units and time) and the live records read; None when it is not open.
    fn reservations_find(&mut self, seq: f64) -> Option<(usize, f64, f64, Vec<u8>)> {
        let mut live = log_read(self.redis, self.keys.rk, self.c.ro, self.c.re);
        if live.len() as f64 != self.c.re - self.c.ro {
            self.clear_reservations();
            live = Vec::new();
        }
        // Records are in seq order: binary search, with the library's midpoints.
        let (mut lo, mut hi) = (1_i64, (live.len() / RECORD) as i64);
        while lo <= hi {
            let mid = (lo + hi) / 2;
            let [record_seq, record_units, record_at] = record(&live, mid as usize - 1);
            if record_seq == seq {
                return Some((mid as usize, record_units, record_at, live));
            } else if record_seq < seq {
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        None
    }

    /// T.reservations_remove: the reservation at `index` (1-based) of the live records.
    fn reservations_remove(&mut self, live: &[u8], index: usize) {
        let count = live.len() / RECORD;
        if index == 1 {
            self.c.ro += RECORD_BYTES;
            self.c.ra = if count > 1 {
                numbers(&live[RECORD + RESERVATION_AT as usize..2 * RECORD])[0]
            } else {
                -1.0
            };
        } else {
            let live = without(live, index - 1);
            (self.c.ro, self.c.re, self.c.rx) =
                log_rewrite(self.redis, self.keys.rk, &live, self.c.rx, self.now);
            self.c.ra = numbers(&live[RESERVATION_AT as usize..RECORD])[0];
            if index == count {
                self.c.rl = numbers(&live[live.len() - NUMBER_BYTES..])[0];
            }
        }
        self.c.dirty = true;
    }

    // sliding.lua

    /// T.sliding_refund: up to `give_back` units of a reservation made at `at` taken off the
    /// bucket that holds it (the last opened at or before it), if it still counts it; the
    /// units given back.
    fn sliding_refund(&mut self, at: f64, give_back: f64) -> f64 {
        let now = self.now;
        let mut refunded = 0.0;
        if self.c.lu > 0.0 && self.c.lo <= at {
            if self.c.ls >= at {
                refunded = give_back.min(self.c.lu);
                self.c.lu -= refunded;
                self.c.qu -= refunded;
                if self.c.lu == 0.0 {
                    // The newest bucket is gone: the newest closed one takes its place.
                    let records = self.closed_buckets();
                    if records.is_empty() {
                        (self.c.lo, self.c.ls) = (0.0, 0.0);
                    } else {
                        let last = records.len() / RECORD - 1;
                        [self.c.lo, self.c.ls, self.c.lu] = record(&records, last);
                        let records = &records[..last * RECORD];
                        (self.c.qo, self.c.qe, self.c.qx) =
                            log_rewrite(self.redis, self.keys.qk, records, self.c.qx, now);
                        if records.is_empty() {
                            (self.c.fs, self.c.fu) = (-1.0, 0.0);
                        }
                    }
                }
            }
        } else if self.c.qe > self.c.qo {
            let records = self.closed_buckets();
            for i in (0..records.len() / RECORD).rev() {
                let [opened, stamp, bucket_units] = record(&records, i);
                if opened <= at {
                    if stamp >= at {
                        refunded = give_back.min(bucket_units);
                        self.c.qu -= refunded;
                        let left = bucket_units - refunded;
                        if left > 0.0 {
                            let offset = self.c.qo + (i * RECORD) as f64 + BUCKET_UNITS;
                            self.redis.call(
                                &[b"SETRANGE", self.keys.qk, &text(offset), &pack(&[left])],
                                true,
                            );
                            if i == 0 {
                                self.c.fu = left;
                            }
                        } else {
                            let records = without(&records, i);
                            (self.c.qo, self.c.qe, self.c.qx) =
                                log_rewrite(self.redis, self.keys.qk, &records, self.c.qx, now);
                            if i == 0 {
                                (self.c.fs, self.c.fu) = (-1.0, 0.0);
                            }
                        }
                    }
                    break;
                }
            }
        }
        refunded
    }
}
