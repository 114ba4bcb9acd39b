//! The gate: one host's send protocol, shared by the dispatcher's jobs and the reqwest
//! middleware. Before each attempt it takes the host's quota (waiting in priority order, with a
//! deadline), re-checks that no pause began since the grant and that the lease is current, and
//! only then lets the request leave. After the attempt it reads the classifier's verdict: a
//! rate-limit answer pauses the host fleet-wide through the quota source, a transient failure
//! is retried after a jittered backoff, anything else goes back to the caller unchanged.
//!
//! The race it closes, and the one it cannot: a request granted before a pause was recorded and
//! not yet sent is refunded and waits, when this process recorded or observed the pause (the
//! check is local, no round trip). A request granted by the store before another process
//! recorded the pause, and sent within that store round trip, still leaves; so does a request
//! already on the wire when the vendor's 429 comes back. Both are bounded by the host's limits:
//! with a concurrency limit of 1 there is never a second request in flight, and with a rate
//! limit the gap between two grants is what a pause has to land in.

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tollgate::{PAUSE_MS_MAX, Priority};

use crate::advice::{AdvisedQuota, read_advice};
use crate::classify::{Answer, Classifier, Classify, Verdict};
use crate::error::DispatchError;
use crate::quota::{Acquired, Lesson, Quota, QuotaPermit};

/// A vendor's quotas, unchanged, are taught again after this long, so that a server that
/// forgot them (they expire) learns them again.
pub const RETEACH_AFTER: Duration = Duration::from_secs(60);

/// Most retries a configuration may ask for.
pub const RETRIES_MAX_LIMIT: u32 = 100;

/// How a host's gate behaves. Every field is the caller's decision; there is deliberately no
/// `Default` (a vendor's numbers are not ours to guess), but [`GateConfig::conservative`] gives
/// documented starting values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateConfig {
    /// Longest one attempt waits for the host's quota (pauses included) before failing with
    /// `WaitTimedOut`.
    pub wait_ms_max: u64,
    /// Retries after the first attempt, for rate-limit answers and transient failures together.
    /// When they are spent, the last answer goes to the caller as it is.
    pub retries_max: u32,
    /// The first retry's backoff; each later one doubles it, up to `backoff_ms_max`. The wait is
    /// drawn between half and all of it (jitter), so retries of many callers spread out.
    pub backoff_ms: u64,
    pub backoff_ms_max: u64,
    /// The pause when a rate-limit answer carries no `Retry-After` that can be read.
    pub retry_after_ms_default: u64,
    /// The longest pause a vendor's `Retry-After` can cause; longer values are cut to it.
    pub retry_after_ms_max: u64,
    /// Resumption jitter: a pause lasts the vendor's `Retry-After` plus a random 0 to this many
    /// milliseconds, never less, so nobody resumes early and the fleet does not resume at once.
    pub resume_jitter_ms_max: u64,
    /// A lease whose remaining life at send time is below this is renewed first; a lease that
    /// cannot be renewed (it expired: its fence is stale) is refused before sending.
    pub lease_margin_ms: u64,
    /// Learn from the vendor's answers (on in `conservative()`; `false` is the off switch):
    /// the rate-limit headers of every answer teach the host's rate limit, fleet-wide, what the
    /// vendor allows (a lower limit while it says so, a pause until its reset when it says
    /// nothing remains), a rate-limit answer that advertises nothing halves the limit until it
    /// climbs back, and each commit reports how long after its grant the request left, so the
    /// limit's margin covers it (docs/outbound.md, *The vendor is the judge*).
    pub learn: bool,
}

impl GateConfig {
    /// Starting values: wait up to 60 s for quota, 3 retries, backoff 100 ms doubling to 5 s,
    /// 30 s when a vendor gives no readable `Retry-After`, at most 15 minutes (Google Ads'
    /// longest escalation), resumption jitter up to 250 ms, leases renewed within 1 s of expiry.
    pub fn conservative() -> GateConfig {
        GateConfig {
            wait_ms_max: 60_000,
            retries_max: 3,
            backoff_ms: 100,
            backoff_ms_max: 5_000,
            retry_after_ms_default: 30_000,
            retry_after_ms_max: 15 * 60 * 1_000,
            resume_jitter_ms_max: 250,
            lease_margin_ms: 1_000,
            learn: true,
        }
    }

    fn check(&self) -> Result<(), DispatchError> {
        if self.wait_ms_max == 0 {
            return Err(DispatchError::config("wait_ms_max", "must be at least 1"));
        }
        if self.retries_max > RETRIES_MAX_LIMIT {
            return Err(DispatchError::config(
                "retries_max",
                format!("must be at most {RETRIES_MAX_LIMIT}"),
            ));
        }
        if self.backoff_ms > self.backoff_ms_max {
            return Err(DispatchError::config(
                "backoff_ms",
                "must be at most backoff_ms_max",
            ));
        }
        if self.retry_after_ms_default == 0 || self.retry_after_ms_default > self.retry_after_ms_max
        {
            return Err(DispatchError::config(
                "retry_after_ms_default",
                "must be between 1 and retry_after_ms_max",
            ));
        }
        if self
            .retry_after_ms_max
            .saturating_add(self.resume_jitter_ms_max)
            > PAUSE_MS_MAX
        {
            return Err(DispatchError::config(
                "retry_after_ms_max",
                format!("with resume_jitter_ms_max, must be at most {PAUSE_MS_MAX} (a day)"),
            ));
        }
        Ok(())
    }
}

/// Counters of what the gate did, since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Attempts that left for the vendor.
    pub sent: u64,
    /// Answers classified as rate-limited.
    pub rate_limited: u64,
    /// Attempts retried (after a rate-limit answer or a transient failure).
    pub retried: u64,
    /// Grants refunded unsent because a pause began after they were granted.
    pub held_for_pause: u64,
    /// Grants refused unsent because their lease's fence was stale.
    pub refused_stale: u64,
    /// Lessons sent to the quota source (the vendor said something new).
    pub lessons: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    rate_limited: AtomicU64,
    retried: AtomicU64,
    held_for_pause: AtomicU64,
    refused_stale: AtomicU64,
    lessons: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    quota: Quota,
    classifier: Classifier,
    config: GateConfig,
    /// The end of the latest pause this process recorded or was told of, on its own clock.
    paused_until: Mutex<Option<Instant>>,
    /// The quotas last taught and when: a lesson goes only when it says something new.
    last_taught: Mutex<Option<(Vec<AdvisedQuota>, Instant)>>,
    counters: Counters,
}

/// One host's gate; cheap to clone, clones share the state.
#[derive(Clone, Debug)]
pub struct Gate {
    inner: Arc<Inner>,
}

/// Leave to send one attempt: holds the host's quota until the attempt is settled.
#[derive(Debug)]
pub struct Admission {
    permit: QuotaPermit,
    /// When the grant's answer came, and when the request left (`sending`).
    granted_at: Instant,
    sent_at: Option<Instant>,
}

impl Admission {
    /// The lease's fencing number, if the host has a concurrency limit.
    pub fn fence(&self) -> Option<u64> {
        self.permit.fence()
    }

    /// The request is leaving now: the time since the grant is what the commit reports.
    pub fn sending(&mut self) {
        self.sent_at.get_or_insert_with(Instant::now);
    }
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Hand the answer to the caller.
    Return,
    /// Try again (the backoff, if any, has been waited already).
    Retry,
}

fn random_up_to(max_ms: u64) -> Duration {
    Duration::from_millis(fastrand::u64(0..=max_ms))
}

impl Gate {
    pub fn new(
        quota: Quota,
        classifier: Classifier,
        config: GateConfig,
    ) -> Result<Gate, DispatchError> {
        config.check()?;
        Ok(Gate {
            inner: Arc::new(Inner {
                quota,
                classifier,
                config,
                paused_until: Mutex::new(None),
                last_taught: Mutex::new(None),
                counters: Counters::default(),
            }),
        })
    }

    pub fn config(&self) -> &GateConfig {
        &self.inner.config
    }

    pub fn stats(&self) -> GateStats {
        let counters = &self.inner.counters;
        GateStats {
            sent: counters.sent.load(Ordering::Relaxed),
            rate_limited: counters.rate_limited.load(Ordering::Relaxed),
            retried: counters.retried.load(Ordering::Relaxed),
            held_for_pause: counters.held_for_pause.load(Ordering::Relaxed),
            refused_stale: counters.refused_stale.load(Ordering::Relaxed),
            lessons: counters.lessons.load(Ordering::Relaxed),
        }
    }

    /// Time until the pause this process knows of ends, if one is in force.
    pub fn paused_for(&self) -> Option<Duration> {
        let until = *self.paused_until_guard();
        until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
    }

    fn paused_until_guard(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // The value is a plain timestamp, whole whatever panicked while it was held.
        match self.inner.paused_until.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn last_taught_guard(&self) -> std::sync::MutexGuard<'_, Option<(Vec<AdvisedQuota>, Instant)>> {
        // A plain value, whole whatever panicked while it was held.
        match self.inner.last_taught.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Remember a pause ending at `until`; pauses only extend.
    fn note_pause(&self, until: Instant) {
        let mut paused_until = self.paused_until_guard();
        if paused_until.is_none_or(|current| current < until) {
            *paused_until = Some(until);
        }
    }

    /// The classifier's verdict on an answer.
    pub fn classify<R: Classify + ?Sized>(&self, output: &R) -> Verdict {
        self.inner
            .classifier
            .classify(&output.answer(), SystemTime::now())
    }

    /// Wait for leave to send one attempt at `priority`: the host's quota, no pause in force,
    /// a current lease. Cancel-safe: dropping it holds nothing (a permit being settled is
    /// refunded or released by its guard).
    pub async fn admit(&self, priority: Priority) -> Result<Admission, DispatchError> {
        let config = &self.inner.config;
        let started = Instant::now();
        let deadline = started + Duration::from_millis(config.wait_ms_max);
        let timed_out = |paused: bool| DispatchError::WaitTimedOut {
            waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            paused,
        };
        loop {
            // A pause this process knows of: wait it out, plus this waiter's own jitter, before
            // asking, so that waiters do not all ask at the instant it ends.
            if let Some(left) = self.paused_for() {
                let resume_at = Instant::now() + left + random_up_to(config.resume_jitter_ms_max);
                if resume_at >= deadline {
                    tokio::time::sleep_until(deadline).await;
                    return Err(timed_out(true));
                }
                tokio::time::sleep_until(resume_at).await;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(timed_out(false));
            }
            match self.inner.quota.acquire(priority, deadline - now).await? {
                Acquired::Denied {
                    retry_after,
                    paused,
                } => {
                    if paused {
                        self.note_pause(Instant::now() + retry_after);
                    }
                    if Instant::now() + Duration::from_millis(1) >= deadline {
                        return Err(timed_out(paused));
                    }
                }
                Acquired::Granted(mut permit) => {
                    if self.paused_for().is_some() {
                        // Granted, but a pause began since (this process recorded it or was
                        // told of it): give the unit back and wait with everyone else.
                        self.inner
                            .counters
                            .held_for_pause
                            .fetch_add(1, Ordering::Relaxed);
                        if let Err(error) = permit.commit(0, None).await {
                            tracing::debug!(%error, "refund of a grant held for a pause failed; its unit stays used");
                        }
                        continue;
                    }
                    self.check_lease(&mut permit).await?;
                    let granted_at = permit.granted_at;
                    return Ok(Admission {
                        permit,
                        granted_at,
                        sent_at: None,
                    });
                }
            }
        }
    }

    /// Refuse a lease whose fence is stale. A lease with less than `lease_margin_ms` to live is
    /// renewed first; the store refuses to renew an expired lease (its slot may be another
    /// holder's, under a newer fence), and then the request is not sent.
    async fn check_lease(&self, permit: &mut QuotaPermit) -> Result<(), DispatchError> {
        let Some(expires_at) = permit.lease_expires_at() else {
            return Ok(());
        };
        let margin = Duration::from_millis(self.inner.config.lease_margin_ms);
        if Instant::now() + margin < expires_at {
            return Ok(());
        }
        match permit.renew().await {
            Ok(()) => Ok(()),
            Err(error) if error.is_transient() => Err(error),
            Err(_) => {
                self.inner
                    .counters
                    .refused_stale
                    .fetch_add(1, Ordering::Relaxed);
                Err(DispatchError::StaleLease {
                    fence: permit.fence().unwrap_or(0),
                })
            }
        }
    }

    /// Mark an admitted attempt as sent (for the statistics).
    fn count_sent(&self) {
        self.inner.counters.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// The pause for a rate-limit answer: the vendor's `Retry-After` (cut to
    /// `retry_after_ms_max`) or the default, plus the resumption jitter. `None` when the vendor
    /// asked for no wait (`Retry-After: 0`): no pause is invented.
    pub fn pause_for(&self, retry_after: Option<Duration>) -> Option<Duration> {
        let config = &self.inner.config;
        let asked = retry_after.unwrap_or(Duration::from_millis(config.retry_after_ms_default));
        let asked = asked.min(Duration::from_millis(config.retry_after_ms_max));
        if asked.is_zero() {
            return None;
        }
        Some(asked + random_up_to(config.resume_jitter_ms_max))
    }

    /// Settle an attempt whose answer got `verdict`; `attempt` counts from 0. A rate-limit
    /// answer pauses the host before the lease is released, so that a host with a concurrency
    /// limit of 1 never lets another request out before the pause is recorded.
    pub async fn settle(&self, admission: Admission, verdict: Verdict, attempt: u32) -> Settled {
        let config = &self.inner.config;
        let counters = &self.inner.counters;
        let spent = attempt >= config.retries_max;
        match verdict {
            Verdict::Done => {
                self.commit(admission).await;
                Settled::Return
            }
            Verdict::RateLimited { retry_after } => {
                counters.rate_limited.fetch_add(1, Ordering::Relaxed);
                if let Some(pause) = self.pause_for(retry_after) {
                    let asked_at = Instant::now();
                    // Locally first: this process's grants not yet sent are held at once.
                    self.note_pause(asked_at + pause);
                    match self.inner.quota.pause(pause).await {
                        Ok(left) => self.note_pause(Instant::now() + left),
                        Err(error) => {
                            tracing::warn!(%error, "could not pause the host in the quota store; other processes will learn of the pause from the vendor");
                        }
                    }
                }
                self.commit(admission).await;
                if spent {
                    return Settled::Return;
                }
                counters.retried.fetch_add(1, Ordering::Relaxed);
                Settled::Retry
            }
            Verdict::Retry => {
                self.commit(admission).await;
                if spent {
                    return Settled::Return;
                }
                counters.retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(self.backoff(attempt)).await;
                Settled::Retry
            }
        }
    }

    /// The wait before retry number `attempt + 1`: `backoff_ms * 2^attempt` capped at
    /// `backoff_ms_max`, drawn between half and all of it.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let config = &self.inner.config;
        let full = config
            .backoff_ms
            .saturating_mul(1u64.checked_shl(attempt.min(62)).unwrap_or(u64::MAX))
            .min(config.backoff_ms_max);
        let half = full / 2;
        Duration::from_millis(half + fastrand::u64(0..=full - half))
    }

    async fn commit(&self, admission: Admission) {
        let sent_after = admission
            .sent_at
            .filter(|_| self.inner.config.learn)
            .map(|sent| sent.saturating_duration_since(admission.granted_at));
        // The call happened (or may have): its unit stays used; a lease is released.
        if let Err(error) = admission.permit.commit(1, sent_after).await {
            tracing::debug!(%error, "commit failed; the unit stays used and a lease runs to its TTL");
        }
    }

    /// Run `attempt` under the gate until its answer is done or retries are spent. The answer
    /// reaches the caller as the attempt returned it.
    pub async fn call<R, F, Fut>(
        &self,
        priority: Priority,
        mut attempt: F,
    ) -> Result<R, DispatchError>
    where
        R: Classify,
        F: FnMut() -> Fut,
        Fut: Future<Output = R>,
    {
        let mut attempts = 0;
        loop {
            let mut admission = self.admit(priority).await?;
            self.count_sent();
            admission.sending();
            let output = attempt().await;
            let verdict = self.classify(&output);
            let lesson = self.lesson_of(&output.answer(), verdict);
            self.teach(lesson).await;
            match self.settle(admission, verdict, attempts).await {
                Settled::Return => return Ok(output),
                Settled::Retry => attempts += 1,
            }
        }
    }

    /// For callers that run the attempt themselves (the middleware): count it as sent.
    pub(crate) fn sending(&self, admission: &mut Admission) {
        self.count_sent();
        admission.sending();
    }

    /// What the vendor's answer teaches, if anything new: its advertised quotas (sent when
    /// they differ from the last ones sent, or a minute after), a `remaining` of 0 with its
    /// reset, or a rate-limit answer that advertised no quota.
    fn lesson_of(&self, answer: &Answer<'_>, verdict: Verdict) -> Option<Lesson> {
        if !self.inner.config.learn {
            return None;
        }
        let advice = match answer {
            Answer::Http { headers, .. } => read_advice(headers, SystemTime::now()),
            _ => None,
        };
        let rate_limited = matches!(verdict, Verdict::RateLimited { .. });
        let Some(advice) = advice else {
            return rate_limited.then(|| Lesson {
                source: "a rate-limit answer without quota headers".to_owned(),
                quotas: Vec::new(),
                remaining: None,
                reset: None,
                rate_limited: true,
            });
        };
        let exhausted = advice.remaining == Some(0) && advice.reset.is_some_and(|r| !r.is_zero());
        let new_quotas = {
            let last = self.last_taught_guard();
            last.as_ref().is_none_or(|(quotas, at)| {
                *quotas != advice.quotas || at.elapsed() >= RETEACH_AFTER
            })
        };
        let rate_limited = rate_limited && advice.quotas.is_empty();
        if !(exhausted || rate_limited || (new_quotas && !advice.quotas.is_empty())) {
            return None;
        }
        Some(Lesson {
            source: format!("{} headers", advice.family.as_str()),
            quotas: advice.quotas,
            remaining: advice.remaining,
            reset: advice.reset,
            rate_limited,
        })
    }

    /// Teach the quota source what the answer said (see `lesson_of`); a pause it puts in force
    /// holds this process's grants at once. A lesson that fails changes nothing for the call.
    pub(crate) async fn learn<R: Classify + ?Sized>(&self, output: &R, verdict: Verdict) {
        // Read before any await: the answer need not be shared between threads.
        let lesson = self.lesson_of(&output.answer(), verdict);
        self.teach(lesson).await;
    }

    async fn teach(&self, lesson: Option<Lesson>) {
        let Some(lesson) = lesson else {
            return;
        };
        self.inner.counters.lessons.fetch_add(1, Ordering::Relaxed);
        match self.inner.quota.learn(&lesson).await {
            Ok(paused) => {
                // Marked taught only once it is in force: a caller that read the same quotas
                // while this lesson was on its way teaches them too, and waits for it, rather
                // than asking for its next grant under the limit the vendor just refused.
                if !lesson.quotas.is_empty() {
                    let mut last = self.last_taught_guard();
                    *last = Some((lesson.quotas.clone(), Instant::now()));
                }
                if !paused.is_zero() {
                    self.note_pause(Instant::now() + paused);
                }
            }
            Err(error) => tracing::debug!(%error, "the vendor's lesson was not taken"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::HostLimits;
    use tollgate::{Limit, Limiter, Policy, Reserve};

    fn leased_gate(limiter: &Limiter, lease_ttl_ms: u64) -> Gate {
        let policy =
            Policy::concurrency(1, lease_ttl_ms * 1_000, Reserve::default()).expect("policy");
        limiter.set_limit(Limit::new("vendor-conn", policy, None).expect("limit"));
        let quota = Quota::limiter(
            limiter.clone(),
            HostLimits {
                rate: None,
                concurrency: Some("vendor-conn".into()),
            },
        )
        .expect("quota");
        let mut config = GateConfig::conservative();
        config.lease_margin_ms = 10;
        Gate::new(quota, Classifier::new(), config).expect("gate")
    }

    /// A lease that expired between its grant and the send (the holder stalled) is refused:
    /// its slot went to a newer holder, under a higher fence, and the request is not sent.
    #[tokio::test(start_paused = true)]
    async fn a_stale_fence_is_refused_before_sending() {
        let limiter = Limiter::in_memory();
        let gate = leased_gate(&limiter, 100);
        let Acquired::Granted(mut stalled) = gate
            .inner
            .quota
            .acquire(Priority::Normal, Duration::from_secs(1))
            .await
            .expect("acquire")
        else {
            panic!("the only lease is free")
        };
        let stale_fence = stalled.fence().expect("a lease has a fence");
        // The holder stalls past its TTL; the store lets the lease go and grants the slot anew.
        tokio::time::advance(Duration::from_millis(150)).await;
        let current = gate
            .admit(Priority::Normal)
            .await
            .expect("the slot is free again");
        assert!(
            current.fence().expect("fence") > stale_fence,
            "fences only grow"
        );
        let mut sent = 0;
        match gate.check_lease(&mut stalled).await {
            Err(DispatchError::StaleLease { fence }) => assert_eq!(fence, stale_fence),
            Ok(()) => sent += 1,
            Err(other) => panic!("unexpected {other}"),
        }
        assert_eq!(sent, 0, "the stale holder's request did not leave");
        assert_eq!(gate.stats().refused_stale, 1);
        // A fresh lease near its end is renewed, not refused.
        drop(stalled);
        gate.settle(current, Verdict::Done, 0).await;
        let Acquired::Granted(mut fresh) = gate
            .inner
            .quota
            .acquire(Priority::Normal, Duration::from_secs(1))
            .await
            .expect("acquire")
        else {
            panic!("free")
        };
        tokio::time::advance(Duration::from_millis(95)).await;
        gate.check_lease(&mut fresh).await.expect("renewed in time");
        tokio::time::advance(Duration::from_millis(50)).await;
        gate.check_lease(&mut fresh)
            .await
            .expect("the renewal extended it");
    }

    #[test]
    fn pauses_are_the_vendors_lower_bound_plus_positive_jitter_and_capped() {
        let limiter = Limiter::in_memory();
        let gate = leased_gate(&limiter, 1_000);
        let config = gate.config().clone();
        for _ in 0..200 {
            let pause = gate
                .pause_for(Some(Duration::from_secs(15)))
                .expect("a pause");
            assert!(
                pause >= Duration::from_secs(15),
                "never shorter than Retry-After"
            );
            assert!(
                pause
                    <= Duration::from_secs(15) + Duration::from_millis(config.resume_jitter_ms_max)
            );
            let default = gate.pause_for(None).expect("the default");
            assert!(default >= Duration::from_millis(config.retry_after_ms_default));
            let huge = gate
                .pause_for(Some(Duration::from_secs(u64::MAX)))
                .expect("capped");
            assert!(
                huge <= Duration::from_millis(
                    config.retry_after_ms_max + config.resume_jitter_ms_max
                )
            );
        }
        assert_eq!(
            gate.pause_for(Some(Duration::ZERO)),
            None,
            "no pause invented"
        );
        for attempt in 0..20 {
            let backoff = gate.backoff(attempt);
            let full = (config.backoff_ms << attempt.min(20)).min(config.backoff_ms_max);
            assert!(
                backoff >= Duration::from_millis(full / 2)
                    && backoff <= Duration::from_millis(full)
            );
        }
    }
}
