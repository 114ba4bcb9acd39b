//! Quota leasing: take a block of k units of a rate limit from the shared store in one round
//! trip and hand them out in this process, giving back what was not handed out.
//!
//! Why it keeps G1 fleet-wide: the block's units count in the shared store from the moment the
//! block is granted, exactly like k ordinary grants. The only difference is *when* a caller gets
//! a unit: up to `block_lifetime` later. That spread is what a limit's `margin` is for (a
//! grant and its use apart by a varying delay), so a block lives at most `min(block_lifetime,
//! margin)` for a sliding limit: a unit used at `t + d`, `d <= margin`, is counted in the store
//! over `[t, t + period + margin)`, which covers `[t + d, t + d + period)`. For a fixed limit a
//! block lives until the end of the window it was granted in (its units count in that window).
//! GCRA limits, sliding limits without a margin, concurrency limits and requests over several
//! limits are passed through untouched.
//!
//! Pauses: a pause through this store drops its blocks at once, and a block whose fetch was
//! under way meanwhile is given back rather than handed out from. A pause set by another process
//! reaches this one's blocks only when they expire, so with leasing a pause may let through, in
//! each process, what that process's live block still holds, for at most the block's lifetime
//! (at most the limit's margin). Without leasing a pause holds fleet-wide at once (G4).
//!
//! k adapts to local demand: a block used up before it expires doubles the next one (up to
//! `block_units_max` and a quarter of the limit, so one process cannot hoard a fleet's quota);
//! a block that expires with units left shrinks the next to what was handed out. One caller per
//! counter fetches at a time; the others wait for its block.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::Result;
use tollgate::store::{
    Adjust, Adjusted, Ask, CounterOutcome, Decision, Forward, Offers, Store, StoreFuture, Take,
};
use tollgate_core::{Algorithm, Committed, Grant, Kind, Policy, Priority};

/// Reservation numbers of units handed out from a block carry this bit; the store's own numbers
/// are microsecond timestamps, far below it.
const LOCAL_SEQ: u64 = 1 << 62;

/// How blocks are taken.
#[derive(Clone, Copy, Debug)]
pub struct LeasingConfig {
    /// Longest a block is handed out from (a sliding limit's margin caps it further).
    pub block_lifetime: Duration,
    /// Most units in one block.
    pub block_units_max: u64,
}

/// What leasing has done, for measuring what it saves.
#[derive(Debug, Default)]
pub struct LeasingStats {
    /// Grants answered from a block, with no round trip.
    pub local_grants: AtomicU64,
    /// Acquires sent to the shared store (blocks and pass-through requests).
    pub store_acquires: AtomicU64,
    /// Blocks whose unused rest was given back to the shared store.
    pub store_returns: AtomicU64,
}

type PoolKey = (String, Option<String>);

#[derive(Debug)]
struct Pool {
    policy: Policy,
    priority: Priority,
    block_seq: u64,
    block_units: u64,
    /// Units handed out (net of local refunds).
    handed: u64,
    deadline: Instant,
    next_local_seq: u64,
    /// Units of each permit handed out and not yet committed, by local number.
    open_permits: HashMap<u64, u64>,
    /// Size of the next block.
    next_block: u64,
    remaining_in_store: u64,
}

impl Pool {
    fn left(&self) -> u64 {
        self.block_units - self.handed
    }
}

/// A store wrapper that leases blocks of rate units from `inner`.
pub struct LeasingStore {
    inner: Arc<dyn Store>,
    config: LeasingConfig,
    pools: Mutex<HashMap<PoolKey, Pool>>,
    /// One refill at a time per counter: callers that find its block empty while another
    /// fetches the next wait and take from that one. Fetching a block each, they would replace
    /// one another's blocks (stranding their units in the store until they expire) and restart
    /// the block size at one.
    refills: Mutex<HashMap<PoolKey, RefillGate>>,
    /// Pauses made through this store: a block fetched across one is not handed out from.
    pauses: AtomicU64,
    local_seq: AtomicU64,
    stats: Arc<LeasingStats>,
}

impl fmt::Debug for LeasingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasingStore")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// How long units of a block granted now may be handed out, if leasing applies to `policy`.
fn block_span(policy: &Policy, block_lifetime: Duration, decided_at_us: u64) -> Option<Duration> {
    let Kind::Rate(rate) = policy.kind() else {
        return None;
    };
    match rate.algorithm() {
        Algorithm::Sliding if rate.margin_us() > 0 => {
            Some(block_lifetime.min(Duration::from_micros(rate.margin_us())))
        }
        Algorithm::Fixed => {
            let window = rate.window_us();
            let left_in_window = window - decided_at_us % window;
            Some(block_lifetime.min(Duration::from_micros(left_in_window)))
        }
        _ => None,
    }
}

fn leasable(takes: &[Take<'_>]) -> bool {
    match takes {
        [take] => match take.policy.kind() {
            Kind::Rate(rate) => match rate.algorithm() {
                Algorithm::Sliding => rate.margin_us() > 0,
                Algorithm::Fixed => true,
                Algorithm::Gcra { .. } => false,
            },
            Kind::Concurrency(_) => false,
        },
        _ => false,
    }
}

impl LeasingStore {
    /// Wrap `inner`. Spawns a task (on the current tokio runtime) that gives back what expired
    /// blocks did not hand out, so unused units return to the fleet even without traffic here.
    pub fn new(inner: Arc<dyn Store>, config: LeasingConfig) -> Arc<LeasingStore> {
        let store = Arc::new(LeasingStore {
            inner,
            config,
            pools: Mutex::new(HashMap::new()),
            refills: Mutex::new(HashMap::new()),
            pauses: AtomicU64::new(0),
            local_seq: AtomicU64::new(LOCAL_SEQ),
            stats: Arc::new(LeasingStats::default()),
        });
        let weak = Arc::downgrade(&store);
        let period = config.block_lifetime.max(Duration::from_millis(1));
        tokio::spawn(return_expired_blocks(weak, period));
        store
    }

    pub fn stats(&self) -> &LeasingStats {
        &self.stats
    }

    /// `(local_grants, store_acquires, store_returns)` now.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.stats.local_grants.load(Ordering::Relaxed),
            self.stats.store_acquires.load(Ordering::Relaxed),
            self.stats.store_returns.load(Ordering::Relaxed),
        )
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Pool>> {
        match self.pools.lock() {
            Ok(pools) => pools,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn refills(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, RefillGate>> {
        match self.refills.lock() {
            Ok(refills) => refills,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Wait for this counter's turn to refill its block.
    async fn refill_turn(&self, key: &PoolKey) -> RefillTurn<'_> {
        let gate = {
            let mut refills = self.refills();
            let gate = refills.entry(key.clone()).or_default();
            gate.callers += 1;
            gate.lock.clone()
        };
        // Made before waiting, so that a caller dropped while it waits is counted out too.
        let mut turn = RefillTurn {
            store: self,
            key: key.clone(),
            guard: None,
        };
        turn.guard = Some(gate.lock_owned().await);
        turn
    }

    /// Hand `cost` units out of the block for this counter, if it has them.
    fn take_local(&self, take: &Take<'_>, cost: u64, priority: Priority) -> Option<Decision> {
        let key: PoolKey = (
            take.counter.limit.to_owned(),
            take.counter.key.map(str::to_owned),
        );
        let mut pools = self.pools();
        let pool = pools.get_mut(&key)?;
        let usable = pool.policy == *take.policy
            && priority >= pool.priority
            && Instant::now() < pool.deadline
            && pool.left() >= cost;
        if !usable {
            return None;
        }
        pool.handed += cost;
        let seq = pool.next_local_seq;
        pool.next_local_seq += 1;
        pool.open_permits.insert(seq, cost);
        self.stats.local_grants.fetch_add(1, Ordering::Relaxed);
        let grant = Grant {
            seq,
            remaining: pool.remaining_in_store + pool.left(),
            reset_after_us: 0,
            lease_expires_at: None,
        };
        Some(Decision::new(0, [CounterOutcome::Granted(grant)]))
    }

    /// Remove the counter's pool, if any, returning what it should give back: (block_seq, used).
    fn retire(&self, key: &PoolKey) -> Option<(Pool, u64)> {
        let pool = self.pools().remove(key)?;
        let used = pool.handed;
        Some((pool, used))
    }

    async fn give_back(&self, take: Take<'_>, pool: &Pool, used: u64) {
        if used < pool.block_units {
            self.stats.store_returns.fetch_add(1, Ordering::Relaxed);
            let take = Take {
                counter: take.counter,
                policy: &pool.policy,
            };
            // A failed return leaves the units counted until they expire: safe, only wasteful.
            let _ = self.inner.commit(take, pool.block_seq, used).await;
        }
    }

    async fn acquire_leased(
        &self,
        takes: &[Take<'_>],
        cost: u64,
        priority: Priority,
    ) -> Result<Decision> {
        let take = takes[0];
        if let Some(decision) = self.take_local(&take, cost, priority) {
            return Ok(decision);
        }
        let key: PoolKey = (
            take.counter.limit.to_owned(),
            take.counter.key.map(str::to_owned),
        );
        let _turn = self.refill_turn(&key).await;
        // Whoever had the turn before may have just refilled the block.
        if let Some(decision) = self.take_local(&take, cost, priority) {
            return Ok(decision);
        }
        let pauses = self.pauses.load(Ordering::SeqCst);
        let started = Instant::now();
        let mut next_block = 1;
        if let Some((pool, used)) = self.retire(&key) {
            // Used up before it expired: demand outruns the block size.
            let exhausted = started < pool.deadline;
            next_block = if exhausted {
                pool.next_block.saturating_mul(2)
            } else {
                pool.handed.max(1)
            };
            self.give_back(take, &pool, used).await;
        }
        let cap = self
            .config
            .block_units_max
            .min((take.policy.capacity_for(priority) / 4).max(1));
        let block = next_block.clamp(cost, cap.max(cost));
        self.stats.store_acquires.fetch_add(1, Ordering::Relaxed);
        let mut decision = self
            .inner
            .acquire(Ask::new(takes, block, priority).refundable(true))
            .await?;
        let mut granted_units = block;
        if !decision.is_granted() && block > cost {
            // Not room for a whole block: ask for just this request.
            self.stats.store_acquires.fetch_add(1, Ordering::Relaxed);
            decision = self
                .inner
                .acquire(Ask::new(takes, cost, priority).refundable(true))
                .await?;
            granted_units = cost;
        }
        let CounterOutcome::Granted(grant) = decision.outcomes()[0] else {
            return Ok(decision);
        };
        let Some(span) = block_span(take.policy, self.config.block_lifetime, decision.now_us)
        else {
            return Ok(decision);
        };
        let first_local_seq = self.local_seq.fetch_add(1 << 20, Ordering::Relaxed);
        let pool = Pool {
            policy: *take.policy,
            priority,
            block_seq: grant.seq,
            block_units: granted_units,
            handed: cost,
            deadline: started + span,
            next_local_seq: first_local_seq + 1,
            open_permits: HashMap::from([(first_local_seq, cost)]),
            next_block: block,
            remaining_in_store: grant.remaining,
        };
        let remaining = pool.remaining_in_store + pool.left();
        let stale = {
            let mut pools = self.pools();
            // Checked under the pools' lock, which a pause takes after counting itself: either
            // the pause is seen here, or it removes this block after.
            if self.pauses.load(Ordering::SeqCst) == pauses {
                pools.insert(key, pool);
                None
            } else {
                Some(pool)
            }
        };
        if let Some(pool) = stale {
            // Paused while the block was fetched: this caller's grant was decided before the
            // pause; the rest goes back at once.
            self.give_back(take, &pool, pool.handed).await;
        }
        let grant = Grant {
            seq: first_local_seq,
            remaining,
            reset_after_us: grant.reset_after_us,
            lease_expires_at: None,
        };
        Ok(Decision::new(
            decision.now_us,
            [CounterOutcome::Granted(grant)],
        ))
    }

    /// A permit handed out from a block: refund into the block while it lives.
    fn commit_local(&self, take: Take<'_>, seq: u64, used: u64) -> Result<Committed> {
        let key: PoolKey = (
            take.counter.limit.to_owned(),
            take.counter.key.map(str::to_owned),
        );
        let mut pools = self.pools();
        let Some(pool) = pools.get_mut(&key) else {
            // The block is gone; its units counted in the store as used.
            return Ok(Committed {
                refunded: 0,
                released: 0,
            });
        };
        let Some(&cost) = pool.open_permits.get(&seq) else {
            // From a block already retired (its rest went back to the store, this permit's units
            // with the used ones), or committed already: nothing more to give back.
            return Ok(Committed {
                refunded: 0,
                released: 0,
            });
        };
        if used > cost {
            return Err(tollgate_core::PermitError::UsedAboveCost { used, cost }.into());
        }
        pool.open_permits.remove(&seq);
        // Units given back while the block lives can be handed out again; after, they stay
        // counted in the store (the block's rest goes back there when it is retired).
        let refunded = if Instant::now() < pool.deadline {
            pool.handed -= cost - used;
            cost - used
        } else {
            0
        };
        Ok(Committed {
            refunded,
            released: 0,
        })
    }
}

/// A counter's refill lock, and how many callers hold it or wait for it.
#[derive(Default)]
struct RefillGate {
    lock: Arc<tokio::sync::Mutex<()>>,
    callers: usize,
}

/// A counter's turn to refill its block; the gate is forgotten when its last caller is done.
struct RefillTurn<'a> {
    store: &'a LeasingStore,
    key: PoolKey,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for RefillTurn<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut refills = self.store.refills();
        if let Some(gate) = refills.get_mut(&self.key) {
            gate.callers -= 1;
            if gate.callers == 0 {
                refills.remove(&self.key);
            }
        }
    }
}

async fn return_expired_blocks(store: Weak<LeasingStore>, period: Duration) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(store) = store.upgrade() else {
            return;
        };
        let now = Instant::now();
        let expired: Vec<(PoolKey, Pool)> = {
            let mut pools = store.pools();
            let keys: Vec<PoolKey> = pools
                .iter()
                .filter(|(_, pool)| pool.deadline <= now)
                .map(|(key, _)| key.clone())
                .collect();
            keys.into_iter()
                .filter_map(|key| pools.remove(&key).map(|pool| (key, pool)))
                .collect()
        };
        for ((limit, key), pool) in expired {
            let take = Take {
                counter: tollgate::store::CounterId {
                    limit: &limit,
                    key: key.as_deref(),
                },
                policy: &pool.policy,
            };
            let used = pool.handed;
            store.give_back(take, &pool, used).await;
        }
    }
}

/// Only what leasing changes: acquires that blocks can serve, commits of local grants, pauses
/// and charges that drop blocks. The rest is the inner store's.
impl Forward for LeasingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    /// A request that waits on a limit passed through waits in the inner store's queue; one
    /// served from blocks waits in this process's own order, and the block it may fetch is a
    /// request of its priority like any other (it leaves room for every place ahead of it in
    /// the inner store's queue).
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> StoreFuture<'a, Decision> {
        if !leasable(ask.takes) {
            // Counted when asked, not when the future is made: an unpolled one asks nothing.
            return StoreFuture::boxed(async move {
                self.stats.store_acquires.fetch_add(1, Ordering::Relaxed);
                self.inner.acquire(ask).await
            });
        }
        // A block is committed back when it retires, so it is always refundable; a local
        // grant from it records its permit either way.
        // One take: its cost is the request's.
        StoreFuture::boxed(self.acquire_leased(ask.takes, ask.costs.of(0), ask.priority))
    }

    fn commit<'a>(&'a self, take: Take<'a>, seq: u64, used: u64) -> StoreFuture<'a, Committed> {
        if seq >= LOCAL_SEQ {
            return StoreFuture::ready(self.commit_local(take, seq, used));
        }
        self.inner.commit(take, seq, used)
    }

    /// A paused limit must stop at once here too: its block is dropped (its units stay
    /// counted). A lifted pause lets this process's blocks be fetched again, as they would be
    /// after the pause ran out. A charged counter's block is retired before the charge (its
    /// rest goes back, a block in flight is not kept): the debt is paid before anything more
    /// is granted here, as in every other process, and counted against what was used.
    fn adjust<'a>(&'a self, take: Take<'a>, adjust: Adjust) -> StoreFuture<'a, Adjusted> {
        if let Adjust::Charge { .. } = adjust {
            let key: PoolKey = (
                take.counter.limit.to_owned(),
                take.counter.key.map(str::to_owned),
            );
            self.pauses.fetch_add(1, Ordering::SeqCst);
            let retired = self.retire(&key);
            return StoreFuture::boxed(async move {
                if let Some((pool, used)) = retired {
                    self.give_back(take, &pool, used).await;
                }
                self.inner.adjust(take, adjust).await
            });
        }
        if let Adjust::Pause { .. } = adjust {
            let key: PoolKey = (
                take.counter.limit.to_owned(),
                take.counter.key.map(str::to_owned),
            );
            self.pauses.fetch_add(1, Ordering::SeqCst);
            match take.counter.key {
                Some(_) => {
                    self.pools().remove(&key);
                }
                None => self
                    .pools()
                    .retain(|(limit, _), _| limit != take.counter.limit),
            }
        }
        self.inner.adjust(take, adjust)
    }

    /// The inner store's queue; no in-process way, which would decide without the blocks.
    fn offers(&self) -> Offers<'_> {
        Offers {
            queue: self.inner.offers().queue,
            in_process: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::{ManualClock, MemoryStore, MemoryStoreConfig};

    fn leasing() -> Arc<LeasingStore> {
        let memory = MemoryStore::new(
            MemoryStoreConfig {
                keys_tracked_max: 1_000,
                keys_per_limit_max: 1_000,
            },
            Arc::new(ManualClock::new(1_000_000)),
        );
        LeasingStore::new(
            Arc::new(memory),
            LeasingConfig {
                block_lifetime: Duration::from_secs(30),
                block_units_max: 16,
            },
        )
    }

    /// A refill gate lives only while a caller holds or awaits it, a caller dropped while it
    /// waits included: a flood of keys leaves none behind.
    #[tokio::test]
    async fn refill_gates_are_forgotten_when_their_callers_are_done() {
        let store = leasing();
        let key: PoolKey = ("vendor".into(), Some("k".into()));
        let held = store.refill_turn(&key).await;
        let waiting = tokio::time::timeout(Duration::from_millis(10), store.refill_turn(&key));
        assert!(waiting.await.is_err(), "the turn is held: the second waits");
        assert_eq!(
            store.refills()[&key].callers,
            1,
            "the dropped waiter counted out"
        );
        drop(held);
        assert!(store.refills().is_empty());

        let policy = Policy::rate(
            1_000,
            60_000_000,
            30_000_000,
            Algorithm::Sliding,
            tollgate_core::Reserve::default(),
        )
        .expect("valid");
        for k in 0..100 {
            let key = format!("k{k}");
            let take = Take {
                counter: tollgate::store::CounterId {
                    limit: "vendor",
                    key: Some(&key),
                },
                policy: &policy,
            };
            let decision = Store::acquire(
                &*store,
                Ask::new(&[take], 1, Priority::Normal).refundable(true),
            )
            .await
            .expect("answers");
            assert!(decision.is_granted());
        }
        assert!(store.refills().is_empty(), "no gate left after 100 keys");
    }
}
