//! Property tests of the decision core against plain reference models.
//!
//! Each test drives one `Counter` under a random policy through random operations (acquire, commit,
//! renew, release, pause, time advances) and keeps its own record of every grant, refund, release,
//! renewal and pause. After every step it checks the guarantees G1-G4 (docs/guarantees.md) on that
//! record alone, never on the counter's own numbers, and it compares every verdict, retry hint and
//! commit result with what the reference model derives from the record: exactly where the core is
//! exact, and as a pair of bounds for sliding limits above `SLIDING_BUCKETS_MAX`, whose buckets
//! merge grants that are close together.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use tollgate_core::{
    Algorithm, Committed, CostError, Counter, DenyReason, LEASES_MAX, PermitError, Policy,
    Priority, Reserve, SLIDING_BUCKETS_MAX, SPAN_US_MAX, SPAN_US_MIN, UNITS_MAX, Verdict,
    gcra_admit,
};

/// The limit under test, with the parameters the reference model reasons with.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Sliding { limit: u64 },
    Fixed { limit: u64 },
    Gcra { limit: u64, burst: u64 },
    Leases { limit: u64, ttl_us: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Spec {
    shape: Shape,
    /// The period of a rate limit; unused for leases.
    period_us: u64,
    margin_us: u64,
    reserve: Reserve,
}

/// Units a request of `priority` must leave open, as `reserve` is defined: high keeps
/// nothing back, normal leaves `high`, low leaves `high + normal`.
fn kept_from(reserve: Reserve, priority: Priority) -> u64 {
    match priority {
        Priority::High => 0,
        Priority::Normal => reserve.high,
        Priority::Low => reserve.high + reserve.normal,
    }
}

impl Spec {
    fn policy(&self) -> Policy {
        let (period, margin, reserve) = (self.period_us, self.margin_us, self.reserve);
        let built = match self.shape {
            Shape::Sliding { limit } => {
                Policy::rate(limit, period, margin, Algorithm::Sliding, reserve)
            }
            Shape::Fixed { limit } => {
                Policy::rate(limit, period, margin, Algorithm::Fixed, reserve)
            }
            Shape::Gcra { limit, burst } => {
                Policy::rate(limit, period, margin, Algorithm::Gcra { burst }, reserve)
            }
            Shape::Leases { limit, ttl_us } => Policy::concurrency(limit, ttl_us, reserve),
        };
        built.expect("the strategies build only valid policies")
    }

    /// What the guarantee bounds: the limit, or the burst for GCRA.
    fn capacity(&self) -> u64 {
        match self.shape {
            Shape::Sliding { limit } | Shape::Fixed { limit } | Shape::Leases { limit, .. } => {
                limit
            }
            Shape::Gcra { burst, .. } => burst,
        }
    }

    /// How long a grant counts: period plus margin, or the lease TTL.
    fn window_us(&self) -> u64 {
        match self.shape {
            Shape::Leases { ttl_us, .. } => ttl_us,
            _ => self.period_us + self.margin_us,
        }
    }

    fn open(&self, priority: Priority) -> u64 {
        self.capacity() - kept_from(self.reserve, priority)
    }

    /// GCRA's emission interval: the window over the limit, rounded up, so that the sustained
    /// rate is never above `limit / window`.
    fn emission_us(&self) -> u64 {
        match self.shape {
            Shape::Gcra { limit, .. } => self.window_us().div_ceil(limit),
            _ => unreachable!("only GCRA has an emission interval"),
        }
    }

    /// How far apart two grants merged into one sliding bucket can be; zero where the sliding
    /// log is exact (at most `SLIDING_BUCKETS_MAX` units, so every instant has its own bucket).
    fn merge_span_us(&self) -> u64 {
        match self.shape {
            Shape::Sliding { limit } if limit > SLIDING_BUCKETS_MAX => {
                self.window_us() / SLIDING_BUCKETS_MAX
            }
            _ => 0,
        }
    }
}

/// One grant as the test saw it.
#[derive(Clone, Copy, Debug)]
struct Granted {
    seq: u64,
    at: u64,
    cost: u64,
    /// Units that still count: the cost less what a commit refunded.
    net: u64,
    committed: bool,
    /// Granted not refundable: no reservation was recorded, so nothing can be refunded.
    final_grant: bool,
    /// Granted by `gcra_admit` on the backlog alone: no number was handed out (`seq` is the
    /// one `decide` would have given), so there is nothing to commit.
    hot: bool,
    /// Leases: when the lease ends unless renewed again, and when it was released.
    expires_at: u64,
    released_at: Option<u64>,
}

impl Granted {
    /// A lease holds its slots from its grant until it expires or is released.
    fn live_at(&self, t: u64) -> bool {
        self.at <= t && t < self.expires_at && self.released_at.is_none_or(|released| t < released)
    }
}

#[derive(Clone, Copy, Debug)]
enum Advance {
    Zero,
    Micro(u64),
    Tiny(u64),
    Small(u64),
    Period,
    Window,
    JustUnderWindow,
    JustOverWindow,
    /// The algorithm's own step: a bucket span (sliding), up to the next window boundary
    /// (fixed), one emission interval (GCRA), half a TTL (leases).
    Step,
    Large(u64),
    /// Exactly the retry hint of the last denial.
    ToRetry,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire {
        cost: u64,
        priority: Priority,
        final_grant: bool,
    },
    Commit {
        permit: usize,
        used: u64,
    },
    CommitAboveCost {
        permit: usize,
        excess: u64,
    },
    CommitUnknown {
        offset: u64,
    },
    Renew {
        permit: usize,
    },
    Pause {
        raw: u64,
    },
    Advance(Advance),
}

/// A cost in `1..=capacity`, mostly small, from a raw draw.
fn cost_within(raw: u64, capacity: u64) -> u64 {
    if (1..=capacity).contains(&raw) {
        raw
    } else {
        1 + raw % capacity
    }
}

/// How far `advance` moves the clock from `now`.
fn advance_by(spec: &Spec, now: u64, advance: Advance, last_retry_us: u64) -> u64 {
    let window = spec.window_us();
    match advance {
        Advance::Zero => 0,
        Advance::Micro(micros) => micros,
        Advance::Tiny(raw) => raw % (window / SLIDING_BUCKETS_MAX + 2),
        Advance::Small(raw) => raw % (window / 4 + 1),
        Advance::Period => match spec.shape {
            Shape::Leases { ttl_us, .. } => ttl_us,
            _ => spec.period_us,
        },
        Advance::Window => window,
        Advance::JustUnderWindow => window - 1,
        Advance::JustOverWindow => window + 1,
        Advance::Step => match spec.shape {
            Shape::Sliding { .. } => spec.merge_span_us().max(1),
            Shape::Fixed { .. } => window - now % window,
            Shape::Gcra { .. } => spec.emission_us(),
            Shape::Leases { ttl_us, .. } => ttl_us / 2,
        },
        Advance::Large(raw) => window + raw % (3 * window),
        Advance::ToRetry => last_retry_us,
    }
}

/// A pause end from a raw draw: up to a window ahead, half of the time in the past (a pause
/// that must not shorten the current one).
fn pause_until(spec: &Spec, now: u64, raw: u64) -> u64 {
    let window = spec.window_us();
    (now + raw % (2 * window)).saturating_sub(window)
}

/// One of `len` earlier permits from a raw draw: half of the time one of the newest three,
/// which are the likeliest still to count.
fn pick(raw: usize, len: usize) -> usize {
    if raw.is_multiple_of(2) {
        len - 1 - (raw / 2) % len.min(3)
    } else {
        (raw / 2) % len
    }
}

/// What the reference says about a request of some cost at `now`, pauses aside: the units
/// counted against it and the earliest instant from which it fits, each as `(low, high)`.
/// They are equal where the core is exact. For merged sliding buckets `low` counts grants in
/// the window and `high` grants in the window widened by one bucket span: a bucket holds grants
/// at most one span apart and counts them all until its newest leaves the window.
#[derive(Clone, Copy, Debug)]
struct Outlook {
    used: (u64, u64),
    ready_at: (u64, u64),
}

/// A counter driven by the test, and the test's own record of what it granted.
struct Run {
    spec: Spec,
    policy: Policy,
    counter: Counter,
    created_at: u64,
    now: u64,
    paused_until: u64,
    grants: Vec<Granted>,
    last_retry_us: u64,
}

fn fail(error: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(error.to_string())
}

impl Run {
    fn new(spec: Spec, start: u64) -> Run {
        Run {
            spec,
            policy: spec.policy(),
            counter: Counter::new(start),
            created_at: start,
            now: start,
            paused_until: 0,
            grants: Vec::new(),
            last_retry_us: 0,
        }
    }

    fn apply_all(&mut self, ops: &[Op]) -> Result<(), TestCaseError> {
        for op in ops {
            self.apply(*op)?;
            self.check_guarantees()?;
        }
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Acquire {
                cost,
                priority,
                final_grant,
            } => self.acquire(cost, priority, final_grant),
            Op::Commit { permit, used } => self.commit(permit, used, None),
            Op::CommitAboveCost { permit, excess } => self.commit(permit, 0, Some(excess)),
            Op::CommitUnknown { offset } => self.commit_unknown(offset),
            Op::Renew { permit } => self.renew(permit),
            Op::Pause { raw } => {
                let until = pause_until(&self.spec, self.now, raw);
                self.counter.pause(until);
                self.paused_until = self.paused_until.max(until);
                prop_assert_eq!(self.counter.paused_until(), self.paused_until);
                Ok(())
            }
            Op::Advance(advance) => {
                self.now += advance_by(&self.spec, self.now, advance, self.last_retry_us);
                Ok(())
            }
        }
    }

    /// Net units of grants that still count at `t` in a sliding window of `window_us`.
    fn sliding_used_at(&self, window_us: u64, t: u64) -> u64 {
        self.grants
            .iter()
            .filter(|grant| grant.at + window_us > t)
            .map(|grant| grant.net)
            .sum()
    }

    fn lease_slots_at(&self, t: u64) -> u64 {
        self.grants
            .iter()
            .filter(|grant| grant.live_at(t))
            .map(|grant| grant.cost)
            .sum()
    }

    /// The first instant among `candidates` (and `now`) at which `cost` fits beside what
    /// `used_at` counts. `used_at` never grows with time while nothing is granted, so the
    /// first fitting candidate is the earliest fitting instant when the candidates include
    /// every instant at which a unit stops counting.
    fn first_fit(
        &self,
        cost: u64,
        open: u64,
        candidates: impl Iterator<Item = u64>,
        used_at: impl Fn(u64) -> u64,
    ) -> Result<u64, TestCaseError> {
        let mut instants: Vec<u64> = candidates.filter(|t| *t > self.now).collect();
        instants.push(self.now);
        instants.sort_unstable();
        instants
            .into_iter()
            .find(|t| used_at(*t) + cost <= open)
            .ok_or_else(|| fail("reference: no instant frees enough units"))
    }

    fn outlook(&self, cost: u64, open: u64) -> Result<Outlook, TestCaseError> {
        let now = self.now;
        let window = self.spec.window_us();
        Ok(match self.spec.shape {
            Shape::Sliding { .. } => {
                // A grant at `at` counts at `t` while `t < at + window`.
                let mut used = [0; 2];
                let mut ready_at = [0; 2];
                for (index, span) in [0, self.spec.merge_span_us()].into_iter().enumerate() {
                    let width = window + span;
                    used[index] = self.sliding_used_at(width, now);
                    ready_at[index] = self.first_fit(
                        cost,
                        open,
                        self.grants.iter().map(|grant| grant.at + width),
                        |t| self.sliding_used_at(width, t),
                    )?;
                }
                Outlook {
                    used: (used[0], used[1]),
                    ready_at: (ready_at[0], ready_at[1]),
                }
            }
            Shape::Fixed { .. } => {
                // Only grants in the aligned window holding `now` count; the next one is empty.
                let index = now / window;
                let used = self
                    .grants
                    .iter()
                    .filter(|grant| grant.at / window == index)
                    .map(|grant| grant.net)
                    .sum::<u64>();
                let ready = if used + cost <= open {
                    now
                } else {
                    (index + 1) * window
                };
                Outlook {
                    used: (used, used),
                    ready_at: (ready, ready),
                }
            }
            Shape::Gcra { .. } => {
                // Conformance of a bucket of `open` cells draining one per `T`: `cost` more units
                // fit at `t` when, for every earlier grant i with S_i the net units granted at
                // or after it, S_i + cost <= open + floor((t - t_i) / T), i.e. from
                // t_i + (S_i + cost - open) * T on. The backlog is max_i(t_i + S_i * T) - t,
                // counted in whole units rounded up.
                let emission = self.spec.emission_us();
                let mut after = 0;
                let mut ready = now;
                for grant in self.grants.iter().rev() {
                    after += grant.net;
                    if after + cost > open {
                        ready = ready.max(grant.at + (after + cost - open) * emission);
                    }
                }
                let used = self
                    .gcra_backlog_end()
                    .saturating_sub(now)
                    .div_ceil(emission);
                Outlook {
                    used: (used, used),
                    ready_at: (ready, ready),
                }
            }
            Shape::Leases { .. } => {
                let used = self.lease_slots_at(now);
                let ready = self.first_fit(
                    cost,
                    open,
                    self.grants.iter().map(|grant| grant.expires_at),
                    |t| self.lease_slots_at(t),
                )?;
                Outlook {
                    used: (used, used),
                    ready_at: (ready, ready),
                }
            }
        })
    }

    /// When GCRA's backlog drains: max over grants i of t_i + S_i * T.
    fn gcra_backlog_end(&self) -> u64 {
        let emission = self.spec.emission_us();
        let mut after = 0;
        let mut end = 0;
        for grant in self.grants.iter().rev() {
            after += grant.net;
            end = end.max(grant.at + after * emission);
        }
        end
    }

    fn acquire(
        &mut self,
        raw_cost: u64,
        priority: Priority,
        final_grant: bool,
    ) -> Result<(), TestCaseError> {
        let (policy, now) = (self.policy, self.now);
        let cost = cost_within(raw_cost, self.spec.capacity());
        let open = self.spec.open(priority);
        let mut hot_state = None;
        let before = self.counter.clone();
        let decided = self
            .counter
            .decide(&policy, now, cost, priority, !final_grant);
        // A counter that may be decided on its backlog alone: `gcra_admit` on that one
        // number must grant exactly when the counter does, the same hints and backlog.
        if final_grant && let Some(tat) = before.gcra_alone(&policy, now) {
            let step = gcra_admit(tat, &policy, now, cost, priority);
            match decided {
                Ok(Verdict::Granted(grant)) => {
                    let step = step.ok_or_else(|| fail("gcra_admit refused a grant"))?;
                    prop_assert_eq!(step.remaining, grant.remaining);
                    prop_assert_eq!(step.reset_after_us, grant.reset_after_us);
                    prop_assert_eq!(self.counter.gcra_alone(&policy, now), Some(step.tat));
                    // A store that decides on the backlog alone puts back only that number
                    // (no number is handed out): go on from such a state for odd costs, so
                    // that the bounds are checked on it too.
                    if cost % 2 == 1 {
                        let mut hot = before;
                        hot.set_gcra_tat(step.tat);
                        hot_state = Some(hot);
                    }
                }
                _ => prop_assert_eq!(step, None),
            }
        }
        if cost > open {
            prop_assert_eq!(
                decided,
                Err(CostError {
                    cost,
                    capacity: open
                })
            );
            return Ok(());
        }
        let verdict = decided.map_err(fail)?;
        let outlook = self.outlook(cost, open)?;
        let paused = self.paused_until > now;
        // Fitting at `low` is necessary for a grant; fitting at `high`, sufficient.
        let fits_low = now >= outlook.ready_at.0;
        let fits_high = now >= outlook.ready_at.1;
        match verdict {
            Verdict::Granted(grant) => {
                prop_assert!(
                    !paused,
                    "G4: granted at {} while paused until {}",
                    now,
                    self.paused_until
                );
                prop_assert!(
                    fits_low,
                    "G1/G3: granted {} at {} {:?} with {} of {} open units counted",
                    cost,
                    now,
                    priority,
                    outlook.used.0,
                    open
                );
                let remaining_max = open - outlook.used.0 - cost;
                let remaining_min = open.saturating_sub(outlook.used.1 + cost);
                prop_assert!(
                    (remaining_min..=remaining_max).contains(&grant.remaining),
                    "remaining {} outside {}..={}",
                    grant.remaining,
                    remaining_min,
                    remaining_max
                );
                prop_assert!(grant.seq >= self.created_at);
                if let Some(previous) = self.grants.iter().rev().find(|grant| !grant.hot) {
                    prop_assert!(grant.seq > previous.seq, "seq or fence did not grow");
                }
                let expires_at = match self.spec.shape {
                    Shape::Leases { ttl_us, .. } => {
                        prop_assert_eq!(grant.lease_expires_at, Some(now + ttl_us));
                        now + ttl_us
                    }
                    _ => {
                        prop_assert_eq!(grant.lease_expires_at, None);
                        0
                    }
                };
                // Once the reset has passed, the whole capacity is open again.
                let mut later = self.counter.clone();
                let full = later
                    .decide(
                        &policy,
                        now + grant.reset_after_us,
                        self.spec.capacity(),
                        Priority::High,
                        true,
                    )
                    .map_err(fail)?;
                prop_assert!(
                    full.is_granted(),
                    "capacity not open after reset {}: {:?}",
                    grant.reset_after_us,
                    full
                );
                self.grants.push(Granted {
                    seq: grant.seq,
                    at: now,
                    cost,
                    net: cost,
                    committed: false,
                    final_grant,
                    hot: hot_state.is_some(),
                    expires_at,
                    released_at: None,
                });
                // The reset is the time until nothing granted counts any more: the newest grant
                // leaves the sliding window, the fixed window ends, the GCRA backlog drains, the
                // newest lease expires.
                let window = self.spec.window_us();
                let counted_until = match self.spec.shape {
                    Shape::Sliding { .. } => now + window,
                    Shape::Fixed { .. } => (now / window + 1) * window,
                    Shape::Gcra { .. } => self.gcra_backlog_end(),
                    Shape::Leases { .. } => expires_at,
                };
                prop_assert_eq!(grant.reset_after_us, counted_until - now);
                if let Some(hot) = hot_state {
                    self.counter = hot;
                }
            }
            Verdict::Denied(denial) => {
                prop_assert!(
                    paused || !fits_high,
                    "G3: denied {} at {} {:?} with only {} of {} open units counted",
                    cost,
                    now,
                    priority,
                    outlook.used.1,
                    open
                );
                let reason = if paused {
                    DenyReason::Paused
                } else {
                    DenyReason::Capacity
                };
                prop_assert_eq!(denial.reason, reason);
                let remaining_max = open - outlook.used.0.min(open);
                let remaining_min = open.saturating_sub(outlook.used.1);
                prop_assert!(
                    (remaining_min..=remaining_max).contains(&denial.remaining),
                    "remaining {} outside {}..={}",
                    denial.remaining,
                    remaining_min,
                    remaining_max
                );
                let retry_min = outlook.ready_at.0.max(self.paused_until) - now;
                let retry_max = outlook.ready_at.1.max(self.paused_until) - now;
                let retry = denial.retry_after_us;
                prop_assert!(
                    (retry_min..=retry_max).contains(&retry),
                    "retry {} outside {}..={}",
                    retry,
                    retry_min,
                    retry_max
                );
                // The hint is exact for the counter itself: one microsecond early is still too
                // early, on time is granted.
                prop_assert!(retry > 0);
                let mut early = self.counter.clone();
                let too_early = early
                    .decide(&policy, now + retry - 1, cost, priority, true)
                    .map_err(fail)?;
                prop_assert!(!too_early.is_granted(), "granted before the retry hint");
                let mut on_time = self.counter.clone();
                let at_retry = on_time
                    .decide(&policy, now + retry, cost, priority, true)
                    .map_err(fail)?;
                prop_assert!(
                    at_retry.is_granted(),
                    "denied at the retry hint: {:?}",
                    at_retry
                );
                self.last_retry_us = retry;
            }
        }
        Ok(())
    }

    fn commit(
        &mut self,
        permit: usize,
        raw_used: u64,
        excess: Option<u64>,
    ) -> Result<(), TestCaseError> {
        if self.grants.is_empty() {
            return self.commit_unknown(raw_used % 4);
        }
        let (policy, now, window) = (self.policy, self.now, self.spec.window_us());
        let index = pick(permit, self.grants.len());
        let grant = self.grants[index];
        if grant.hot {
            return Ok(());
        }
        let used = match excess {
            Some(excess) => grant.cost + excess,
            None => raw_used % (grant.cost + 1),
        };
        let result = self.counter.commit(&policy, now, grant.seq, used);
        if let Shape::Leases { .. } = self.spec.shape {
            // Release: frees the slots of a live lease, once; `used` plays no part.
            let released = if grant.live_at(now) { grant.cost } else { 0 };
            prop_assert_eq!(
                result,
                Ok(Committed {
                    refunded: 0,
                    released
                })
            );
            if released > 0 {
                self.grants[index].released_at = Some(now);
            }
            return Ok(());
        }
        // A reservation can be committed once, while its units can still count; a final grant
        // recorded none.
        if grant.committed || grant.final_grant || grant.at + window <= now {
            prop_assert_eq!(result, Err(PermitError::Gone));
            return Ok(());
        }
        if used > grant.cost {
            prop_assert_eq!(
                result,
                Err(PermitError::UsedAboveCost {
                    used,
                    cost: grant.cost
                })
            );
            return Ok(());
        }
        let give_back = grant.cost - used;
        let refunded = match self.spec.shape {
            Shape::Sliding { .. } => give_back,
            // Units of an earlier window no longer count; giving them back changes nothing.
            Shape::Fixed { .. } if grant.at / window == now / window => give_back,
            Shape::Fixed { .. } => 0,
            // Only the newest grant can be taken back exactly.
            Shape::Gcra { .. } if index + 1 == self.grants.len() => give_back,
            Shape::Gcra { .. } => 0,
            Shape::Leases { .. } => unreachable!("handled above"),
        };
        prop_assert_eq!(
            result,
            Ok(Committed {
                refunded,
                released: 0
            })
        );
        let record = &mut self.grants[index];
        record.net -= refunded;
        record.committed = true;
        Ok(())
    }

    fn commit_unknown(&mut self, offset: u64) -> Result<(), TestCaseError> {
        let policy = self.policy;
        let seq = self
            .grants
            .last()
            .map_or(self.created_at, |grant| grant.seq + 1)
            + offset;
        prop_assert_eq!(
            self.counter.commit(&policy, self.now, seq, 0),
            Err(PermitError::Unknown)
        );
        let expected = match self.spec.shape {
            Shape::Leases { .. } => PermitError::Unknown,
            _ => PermitError::WrongKind,
        };
        prop_assert_eq!(self.counter.renew(&policy, self.now, seq), Err(expected));
        Ok(())
    }

    fn renew(&mut self, permit: usize) -> Result<(), TestCaseError> {
        let (policy, now) = (self.policy, self.now);
        let Shape::Leases { ttl_us, .. } = self.spec.shape else {
            let seq = self
                .grants
                .last()
                .map_or(self.created_at, |grant| grant.seq);
            prop_assert_eq!(
                self.counter.renew(&policy, now, seq),
                Err(PermitError::WrongKind)
            );
            return Ok(());
        };
        if self.grants.is_empty() {
            return self.commit_unknown(permit as u64 % 4);
        }
        let index = pick(permit, self.grants.len());
        let result = self.counter.renew(&policy, now, self.grants[index].seq);
        if self.grants[index].live_at(now) {
            prop_assert_eq!(result, Ok(now + ttl_us));
            self.grants[index].expires_at = now + ttl_us;
        } else {
            prop_assert_eq!(result, Err(PermitError::LeaseExpired));
        }
        Ok(())
    }

    /// G1 and G2 over the whole history, from the test's record only.
    fn check_guarantees(&self) -> Result<(), TestCaseError> {
        let grants = &self.grants;
        let window = self.spec.window_us();
        match self.spec.shape {
            Shape::Sliding { limit } => {
                // G1 sliding: every half-open interval [a, a + window) holds at most `limit` net
                // units. The fullest such interval starts at a grant, so those starts cover all.
                for (index, first) in grants.iter().enumerate() {
                    let units: u64 = grants[index..]
                        .iter()
                        .take_while(|grant| grant.at < first.at + window)
                        .map(|grant| grant.net)
                        .sum();
                    prop_assert!(
                        units <= limit,
                        "G1 sliding: {} units in [{}, {})",
                        units,
                        first.at,
                        first.at + window
                    );
                }
            }
            Shape::Fixed { limit } => {
                // G1 fixed: each aligned window [k * window, (k + 1) * window) holds at most
                // `limit` net units.
                let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
                for grant in grants {
                    *per_window.entry(grant.at / window).or_default() += grant.net;
                }
                for (index, units) in per_window {
                    prop_assert!(
                        units <= limit,
                        "G1 fixed: {} units in window {}",
                        units,
                        index
                    );
                }
            }
            Shape::Gcra { burst, .. } => {
                // G1 GCRA, with T = ceil(window / limit) the emission interval: for grant times
                // s <= e, the net units granted in [s, e] are at most burst + floor((e - s) / T).
                // Derivation: TAT after the grants from s on is at least s + units * T, and the
                // last of them, at e, fitted only if TAT <= e + burst * T; units are whole.
                // A high request fits exactly when this still holds with its own units added
                // (see `outlook`), so a single unit over the bound anywhere fails here. Over a
                // half-open [a, b) this reads burst + floor((b - 1 - a) / T), one tighter than
                // burst + floor((b - a) / T) when b - a is a multiple of T.
                let emission = self.spec.emission_us();
                for (index, first) in grants.iter().enumerate() {
                    let mut units = 0;
                    for last in &grants[index..] {
                        units += last.net;
                        let bound = burst + (last.at - first.at) / emission;
                        prop_assert!(
                            units <= bound,
                            "G1 gcra: {} units in [{}, {}], bound {}",
                            units,
                            first.at,
                            last.at,
                            bound
                        );
                    }
                }
            }
            Shape::Leases { limit, .. } => {
                // G2: outstanding slots never exceed the limit. They only grow at a grant, so
                // the instants of the grants cover every instant.
                for grant in grants {
                    let slots = self.lease_slots_at(grant.at);
                    prop_assert!(
                        slots <= limit,
                        "G2: {} slots outstanding at {}",
                        slots,
                        grant.at
                    );
                }
            }
        }
        Ok(())
    }
}

fn reserve_from(capacity: u64, (some, high, normal): (bool, u64, u64)) -> Reserve {
    if !some {
        return Reserve::default();
    }
    // Valid reserves leave at least one unit to every priority: high + normal < capacity.
    let high = high % capacity;
    let normal = normal % (capacity - high);
    Reserve { high, normal }
}

fn reserve_raw() -> impl Strategy<Value = (bool, u64, u64)> {
    (any::<bool>(), any::<u64>(), any::<u64>())
}

fn period_us() -> impl Strategy<Value = u64> {
    prop_oneof![Just(1_000u64), 1_000..=50_000u64]
}

fn margin_from(period_us: u64, raw: u64) -> u64 {
    if raw.is_multiple_of(3) {
        0
    } else {
        raw % (period_us + 1)
    }
}

fn sliding_spec_with(limit: impl Strategy<Value = u64>) -> impl Strategy<Value = Spec> {
    (limit, period_us(), any::<u64>(), reserve_raw()).prop_map(
        |(limit, period_us, margin, reserve)| Spec {
            shape: Shape::Sliding { limit },
            period_us,
            margin_us: margin_from(period_us, margin),
            reserve: reserve_from(limit, reserve),
        },
    )
}

fn sliding_spec() -> impl Strategy<Value = Spec> {
    // Up to 64 units the sliding log is exact; above, buckets merge.
    sliding_spec_with(prop_oneof![6 => 1..=10u64, 1 => 60..=70u64, 2 => 100..=300u64])
}

fn sliding_merging_spec() -> impl Strategy<Value = Spec> {
    sliding_spec_with(prop_oneof![1 => 65..=70u64, 3 => 100..=300u64])
}

fn fixed_spec() -> impl Strategy<Value = Spec> {
    let limit = prop_oneof![3 => 1..=10u64, 1 => 100..=300u64];
    (limit, period_us(), any::<u64>(), reserve_raw()).prop_map(
        |(limit, period_us, margin, reserve)| Spec {
            shape: Shape::Fixed { limit },
            period_us,
            margin_us: margin_from(period_us, margin),
            reserve: reserve_from(limit, reserve),
        },
    )
}

fn gcra_spec() -> impl Strategy<Value = Spec> {
    let limit = prop_oneof![3 => 1..=10u64, 1 => 100..=300u64];
    let burst = prop_oneof![3 => 1..=10u64, 1 => 20..=50u64];
    (limit, burst, period_us(), any::<u64>(), reserve_raw()).prop_map(
        |(limit, burst, period_us, margin, reserve)| Spec {
            shape: Shape::Gcra { limit, burst },
            period_us,
            margin_us: margin_from(period_us, margin),
            reserve: reserve_from(burst, reserve),
        },
    )
}

fn lease_spec() -> impl Strategy<Value = Spec> {
    let limit = prop_oneof![4 => 1..=10u64, 1 => 20..=40u64];
    (limit, 1_000..=50_000u64, reserve_raw()).prop_map(|(limit, ttl_us, reserve)| Spec {
        shape: Shape::Leases { limit, ttl_us },
        period_us: ttl_us,
        margin_us: 0,
        reserve: reserve_from(limit, reserve),
    })
}

fn any_spec() -> impl Strategy<Value = Spec> {
    prop_oneof![sliding_spec(), fixed_spec(), gcra_spec(), lease_spec()]
}

fn start_us() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..=10_000_000u64]
}

fn advance() -> impl Strategy<Value = Advance> {
    prop_oneof![
        2 => Just(Advance::Zero),
        1 => (1..=3u64).prop_map(Advance::Micro),
        2 => any::<u64>().prop_map(Advance::Tiny),
        3 => any::<u64>().prop_map(Advance::Small),
        1 => Just(Advance::Period),
        1 => Just(Advance::Window),
        1 => Just(Advance::JustUnderWindow),
        1 => Just(Advance::JustOverWindow),
        2 => Just(Advance::Step),
        1 => any::<u64>().prop_map(Advance::Large),
        2 => Just(Advance::ToRetry),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    // Mostly small costs, so that limits fill step by step; sometimes anything up to capacity.
    let cost = prop_oneof![3 => 1..=3u64, 1 => any::<u64>()];
    let priority = prop::sample::select(Priority::ALL.to_vec());
    prop_oneof![
        8 => (cost, priority, prop::bool::weighted(0.25)).prop_map(|(cost, priority, final_grant)| {
            Op::Acquire {
                cost,
                priority,
                final_grant,
            }
        }),
        3 => (any::<usize>(), any::<u64>()).prop_map(|(permit, used)| Op::Commit { permit, used }),
        1 => (any::<usize>(), 1..=3u64)
            .prop_map(|(permit, excess)| Op::CommitAboveCost { permit, excess }),
        1 => (0..=3u64).prop_map(|offset| Op::CommitUnknown { offset }),
        2 => any::<usize>().prop_map(|permit| Op::Renew { permit }),
        1 => any::<u64>().prop_map(|raw| Op::Pause { raw }),
        7 => advance().prop_map(Op::Advance),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..100)
}

/// Cases per property; each runs up to 100 operations.
const CASES: u32 = 2048;

fn run_ops(spec: Spec, start: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    Run::new(spec, start).apply_all(ops)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Relative to the package root, where `cargo test` runs the tests.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/properties.txt",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(CASES))]

    #[test]
    fn sliding_matches_reference(spec in sliding_spec(), start in start_us(), ops in ops()) {
        run_ops(spec, start, &ops)?;
    }

    /// Limits above `SLIDING_BUCKETS_MAX`, where buckets merge: G1 exactly, the verdicts
    /// between the window's count and the count over the window widened by one bucket span.
    #[test]
    fn sliding_with_merged_buckets_stays_within_bounds(
        spec in sliding_merging_spec(),
        start in start_us(),
        ops in ops(),
    ) {
        run_ops(spec, start, &ops)?;
    }

    #[test]
    fn fixed_matches_reference(spec in fixed_spec(), start in start_us(), ops in ops()) {
        run_ops(spec, start, &ops)?;
    }

    #[test]
    fn gcra_matches_reference(spec in gcra_spec(), start in start_us(), ops in ops()) {
        run_ops(spec, start, &ops)?;
    }

    #[test]
    fn concurrency_matches_reference(spec in lease_spec(), start in start_us(), ops in ops()) {
        run_ops(spec, start, &ops)?;
    }

    /// A counter read back from its words (what a store saves across a restart) is the same
    /// counter, and goes on deciding alike; words cut short or with a byte changed are refused
    /// or read as a counter that is itself consistent.
    #[test]
    fn a_counter_read_back_from_its_words_is_the_same(
        spec in any_spec(),
        start in start_us(),
        before in ops(),
        after in ops(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
    ) {
        let mut run = Run::new(spec, start);
        run.apply_all(&before)?;
        let words = run.counter.to_words();
        let read = Counter::from_words(&words);
        prop_assert_eq!(read.as_ref(), Ok(&run.counter));
        let mut twin = Run::new(spec, start);
        twin.apply_all(&before)?;
        twin.counter = read.map_err(|e| TestCaseError::fail(e.to_string()))?;
        run.apply_all(&after)?;
        twin.apply_all(&after)?;
        prop_assert_eq!(&run.counter, &twin.counter);
        let short = &words[..cut.index(words.len())];
        prop_assert!(Counter::from_words(short).is_err());
        let mut changed = words.clone();
        let at = flip.index(changed.len());
        changed[at] = changed[at].wrapping_add(1 << 40);
        if let Ok(counter) = Counter::from_words(&changed) {
            prop_assert_eq!(Counter::from_words(&counter.to_words()), Ok(counter));
        }
    }

    /// From `idle_at` on, the counter can be forgotten: a fresh one decides every request,
    /// commit, renewal and status exactly alike, and hands out larger numbers than any before.
    #[test]
    fn idle_counter_decides_like_a_fresh_one(
        spec in any_spec(),
        start in start_us(),
        warmup in ops(),
        extra in prop_oneof![3 => Just(0u64), 1 => 1..=3u64, 1 => 0..=100_000u64],
        then in ops(),
    ) {
        let mut run = Run::new(spec, start);
        run.apply_all(&warmup)?;
        let policy = run.policy;
        let idle = run.counter.idle_at(&policy);
        let mut now = idle.max(run.now) + extra;
        let fresh_at = now;
        // Numbers handed out: a grant on the backlog alone hands out none.
        let issued = || run.grants.iter().filter(|grant| !grant.hot).map(|grant| grant.seq);
        let issued_max = issued().max();
        // The clock has passed every number handed out, so a fresh counter numbers above them.
        prop_assert!(issued_max.is_none_or(|max| idle > max), "idle_at {} not above seq {:?}", idle, issued_max);
        let mut old = run.counter.clone();
        let mut fresh = Counter::new(now);
        let mut seqs: Vec<u64> = issued().collect();
        let mut last_retry_us = 0;
        for op in then {
            match op {
                Op::Acquire { cost, priority, .. } => {
                    let cost = cost_within(cost, spec.capacity());
                    let verdict = fresh.decide(&policy, now, cost, priority, true);
                    prop_assert_eq!(old.decide(&policy, now, cost, priority, true), verdict);
                    match verdict {
                        Ok(Verdict::Granted(grant)) => {
                            prop_assert!(issued_max.is_none_or(|max| grant.seq > max));
                            seqs.push(grant.seq);
                        }
                        Ok(Verdict::Denied(denial)) => last_retry_us = denial.retry_after_us,
                        Err(_) => {}
                    }
                }
                Op::Commit { permit, used } | Op::CommitAboveCost { permit, excess: used } => {
                    if seqs.is_empty() {
                        continue;
                    }
                    let seq = seqs[pick(permit, seqs.len())];
                    let used = used % 8;
                    prop_assert_eq!(
                        old.commit(&policy, now, seq, used),
                        fresh.commit(&policy, now, seq, used)
                    );
                }
                Op::CommitUnknown { offset } => {
                    // A number neither counter handed out. (One below the fresh counter's start
                    // that the old counter skipped is `Unknown` to the old and `Gone` to the
                    // fresh, which cannot tell it from one its predecessor handed out.)
                    let seq = seqs.iter().max().map_or(fresh_at, |max| (max + 1).max(fresh_at))
                        + offset;
                    prop_assert_eq!(
                        old.commit(&policy, now, seq, 0),
                        fresh.commit(&policy, now, seq, 0)
                    );
                }
                Op::Renew { permit } => {
                    if seqs.is_empty() {
                        continue;
                    }
                    let seq = seqs[pick(permit, seqs.len())];
                    prop_assert_eq!(old.renew(&policy, now, seq), fresh.renew(&policy, now, seq));
                }
                Op::Pause { raw } => {
                    let until = pause_until(&spec, now, raw);
                    old.pause(until);
                    fresh.pause(until);
                }
                Op::Advance(advance) => now += advance_by(&spec, now, advance, last_retry_us),
            }
            for priority in Priority::ALL {
                prop_assert_eq!(
                    old.status(&policy, now, priority),
                    fresh.status(&policy, now, priority)
                );
            }
        }
    }

    /// A counter standing in for lost state grants nothing before `until`, says exactly when
    /// it will, and numbers its permits from `until` on.
    #[test]
    fn recovering_counter_waits_until_the_end(
        spec in any_spec(),
        now in start_us(),
        wait in 0..=100_000u64,
        probe in any::<u64>(),
        priority in prop::sample::select(Priority::ALL.to_vec()),
    ) {
        let policy = spec.policy();
        let until = now + wait;
        let mut counter = Counter::recovering(now, until);
        if wait > 0 {
            let at = now + probe % wait;
            let verdict = counter.decide(&policy, at, 1, priority, true).map_err(fail)?;
            let Verdict::Denied(denial) = verdict else {
                return Err(fail(format!("granted at {at} while recovering until {until}")));
            };
            prop_assert_eq!(denial.reason, DenyReason::Paused);
            prop_assert_eq!(denial.retry_after_us, until - at);
            prop_assert_eq!(denial.remaining, spec.open(priority));
        }
        let verdict = counter.decide(&policy, until, 1, priority, true).map_err(fail)?;
        let Verdict::Granted(grant) = verdict else {
            return Err(fail(format!("denied at the end of recovery: {verdict:?}")));
        };
        prop_assert!(grant.seq >= until);
    }

    /// Every policy the constructors accept can be decided at the edges of what they accept
    /// (units up to `UNITS_MAX`, spans up to `SPAN_US_MAX`, clocks up to 2^53 micros) without
    /// overflow: the whole capacity is granted at once, one unit more is denied with an exact
    /// hint, and the capacity comes back.
    #[test]
    fn extreme_policies_decide_without_overflow(
        shape in 0..4u8,
        limit in extreme_units(),
        burst in extreme_units(),
        period_us in prop_oneof![Just(SPAN_US_MIN), Just(SPAN_US_MAX), SPAN_US_MIN..=SPAN_US_MAX],
        margin_us in prop_oneof![Just(0), Just(SPAN_US_MAX), 0..=SPAN_US_MAX],
        now in prop_oneof![Just(0u64), Just(1u64 << 53), 0..=1u64 << 53],
    ) {
        let built = match shape {
            0 => Policy::rate(limit, period_us, margin_us, Algorithm::Sliding, Reserve::default()),
            1 => Policy::rate(limit, period_us, margin_us, Algorithm::Fixed, Reserve::default()),
            2 => Policy::rate(
                limit,
                period_us,
                margin_us,
                Algorithm::Gcra { burst },
                Reserve::default(),
            ),
            _ => Policy::concurrency(limit.min(LEASES_MAX), period_us, Reserve::default()),
        };
        // Refusing a policy is always allowed; deciding one that was accepted must work.
        let Ok(policy) = built else { return Ok(()) };
        let capacity = policy.capacity();
        let mut counter = Counter::new(now);
        let first = counter.decide(&policy, now, capacity, Priority::High, true).map_err(fail)?;
        prop_assert!(first.is_granted(), "empty counter denied its capacity: {:?}", first);
        let second = counter.decide(&policy, now, 1, Priority::High, true).map_err(fail)?;
        let Verdict::Denied(denial) = second else {
            return Err(fail(format!("granted {} units at once: {second:?}", capacity + 1)));
        };
        let retry = denial.retry_after_us;
        prop_assert!(retry > 0);
        let mut early = counter.clone();
        prop_assert!(!early.decide(&policy, now + retry - 1, 1, Priority::High, true).map_err(fail)?.is_granted());
        let mut on_time = counter.clone();
        prop_assert!(on_time.decide(&policy, now + retry, 1, Priority::High, true).map_err(fail)?.is_granted());
        let idle = counter.idle_at(&policy);
        let mut later = counter.clone();
        prop_assert!(later.decide(&policy, idle, capacity, Priority::High, true).map_err(fail)?.is_granted());
    }
}

fn extreme_units() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1u64),
        Just(2),
        Just(3),
        Just(UNITS_MAX),
        Just(UNITS_MAX - 1),
        1..=UNITS_MAX
    ]
}
