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
//! A stored value the module does not read (a kind not known) is refused before anything is written (`ERR tollgate: not native: ...`).

use crate::acquire::{Decision, Decoded, KIND_CONCURRENCY, LEASE_NUMBERS, bad, not_native, sub0};
use crate::commit::answer;
use crate::operations::{CounterCall, FirstRead, first_read, split};
use crate::{Redis, Reply};

const OP_RENEW: f64 = 3.0;

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

/// `T.renew_op`: the lease numbered `fence` lives `ttl` from now.
pub(crate) fn renew(redis: &mut dyn Redis, args: &[&[u8]]) -> Result<Reply, Reply> {
    let (keys, op, nums, record) = split(args)?;
    if op != OP_RENEW {
        return Err(not_native("an operation other than a renew"));
    }
    let call = CounterCall::parse(&nums, keys, 1, "renew")?;
    let [fence] = call.own[..] else {
        return Err(bad("renew: fewer than its own numbers"));
    };
    let kind = call.kind();
    let (gen_key, counter) = call.counter_keys("renew")?;
    let tally_key = call.tally_key("renew")?;
    // A rate limit's renewal reads no counter in the library: it is answered whatever the
    // value holds.
    let FirstRead {
        now, loaded, slot, ..
    } = first_read(
        redis,
        vec![gen_key, counter.ck],
        record,
        kind == KIND_CONCURRENCY,
    )?;
    let Some(p) = call.policy().filter(|_| kind == KIND_CONCURRENCY) else {
        return Ok(answer("wrong_kind", now, &slot, &[]));
    };
    // Not a counter the library wrote (or none): as forgotten, its leases have ended.
    let Some(Decoded::Counter(c)) = loaded else {
        return Ok(answer("lease_expired", now, &slot, &[]));
    };
    if fence >= c.s {
        return Ok(answer("unknown", now, &slot, &[]));
    }

    let need = c.need(&p, now);
    let mut d = call.decision(redis, counter, &p, now, &slot, tally_key, c, Some(need))?;
    d.normalise();
    Ok(match d.leases_find(fence) {
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
    })
}
