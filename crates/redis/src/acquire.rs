//! Acquire: a request's counters decided all or nothing, one call per slot in the order
//! `plan` gives, with what a denial leaves granted rolled back.

use tollgate::store::{Costs, CounterOutcome, Decision, Take, WaiterId};
use tollgate::{Error, Result};
use tollgate_core::Priority;

use crate::abi::OP_ACQUIRE as ACQUIRE;
use crate::call::{
    Numbers, PauseRef, SlotAnswer, fail_open_decision, policy_args, priority_arg, rebase,
    slot_answer, u,
};
use crate::errors::{failed, not_admitted, too_many_keys};
use crate::operations::ADMISSION_ATTEMPTS_MAX;
use crate::plan;
use crate::store::RedisStore;

impl RedisStore {
    /// `record`: whether grants record their reservations (the request is refundable);
    /// `costs`: the units asked of each take.
    pub(crate) async fn acquire_remote(
        &self,
        takes: &[Take<'_>],
        costs: Costs<'_>,
        priority: Priority,
        record: bool,
        waiter: Option<WaiterId>,
    ) -> Result<Decision> {
        if takes.len() > tollgate::COUNTERS_PER_REQUEST_MAX {
            return Err(Error::InvalidRequest {
                field: "limits",
                reason: format!(
                    "at most {} limits per request",
                    tollgate::COUNTERS_PER_REQUEST_MAX
                ),
            });
        }
        match self
            .acquire_slots(takes, costs, priority, record, waiter)
            .await
        {
            Err(error) if self.config.fail_open && error.fails_open() => {
                tracing::warn!(%error, "Redis unreachable; granting without counting (fail_open)");
                Ok(fail_open_decision(takes.len()))
            }
            answer => answer,
        }
    }

    async fn acquire_slots(
        &self,
        takes: &[Take<'_>],
        costs: Costs<'_>,
        priority: Priority,
        record: bool,
        waiter: Option<WaiterId>,
    ) -> Result<Decision> {
        // One Redis: every counter in one call, whatever its slot.
        let slots: Vec<u16> = if self.is_cluster() {
            takes
                .iter()
                .map(|take| self.keys.counter_slot(take.counter))
                .collect()
        } else {
            vec![0; takes.len()]
        };
        let groups = plan::groups(&slots);
        if groups.len() > 1 {
            // Refused before any slot is asked, so no part is granted only to be rolled back.
            for (index, take) in takes.iter().enumerate() {
                let open = take.policy.capacity_for(priority);
                let cost = costs.of(index);
                if cost == 0 || cost > open {
                    return Err(Error::Cost {
                        limit: take.counter.limit.to_owned(),
                        source: tollgate_core::CostError {
                            cost,
                            capacity: open,
                        },
                    });
                }
            }
        }
        let mut outcomes: Vec<Option<CounterOutcome>> = vec![None; takes.len()];
        let mut base_now = None;
        let mut progress = plan::Progress::default();
        let mut answer = None;
        loop {
            match progress.step(groups.len(), answer) {
                plan::Step::Ask(index) => {
                    let group = &groups[index];
                    let record = plan::records(index, groups.len(), record);
                    let slot_answer = self
                        .acquire_slot(takes, group, costs, priority, record, waiter)
                        .await;
                    let slot_answer = match slot_answer {
                        Ok(slot_answer) => slot_answer,
                        Err(error) => {
                            self.roll_back(takes, &groups[..index], &outcomes).await;
                            return Err(error);
                        }
                    };
                    let base = *base_now.get_or_insert(slot_answer.now_us);
                    let mut denied = false;
                    for (&take, outcome) in group.takes.iter().zip(slot_answer.outcomes) {
                        denied |= matches!(outcome, CounterOutcome::Denied(_));
                        outcomes[take] = Some(rebase(outcome, slot_answer.now_us, base));
                    }
                    answer = Some(denied);
                }
                plan::Step::Granted => break,
                plan::Step::RollBack(granted) => {
                    let granted: Vec<plan::Group> =
                        granted.iter().map(|&index| groups[index].clone()).collect();
                    let unasked = outcomes.iter().enumerate().filter(|(_, o)| o.is_none());
                    let unasked: Vec<usize> = unasked.map(|(index, _)| index).collect();
                    let (_, remaining) = futures_util::future::join(
                        self.roll_back(takes, &granted, &outcomes),
                        futures_util::future::join_all(
                            unasked
                                .iter()
                                .map(|&index| self.remaining(&takes[index], priority)),
                        ),
                    )
                    .await;
                    // What was granted and given back was allowed, with its units back; what
                    // was never asked is allowed with what its counter has left.
                    for (index, remaining) in unasked.into_iter().zip(remaining) {
                        outcomes[index] = Some(CounterOutcome::Allowed { remaining });
                    }
                    for (index, outcome) in outcomes.iter_mut().enumerate() {
                        if let Some(CounterOutcome::Granted(grant)) = *outcome {
                            *outcome = Some(CounterOutcome::Allowed {
                                remaining: grant.remaining.saturating_add(costs.of(index)),
                            });
                        }
                    }
                    break;
                }
            }
        }
        Ok(Decision::new(
            base_now.unwrap_or(0),
            outcomes
                .into_iter()
                .map(|outcome| outcome.unwrap_or(CounterOutcome::Allowed { remaining: 0 })),
        ))
    }

    /// One slot's call: its counters decided all or nothing. A new key, or a key whose cover
    /// runs out, whose limit's budget is in another slot is admitted there first (the script
    /// asks before it writes anything), and the call made again with the answers.
    async fn acquire_slot(
        &self,
        takes: &[Take<'_>],
        group: &plan::Group,
        costs: Costs<'_>,
        priority: Priority,
        record: bool,
        waiter: Option<WaiterId>,
    ) -> Result<SlotAnswer> {
        let mut keys = Vec::with_capacity(1 + group.takes.len() * 6);
        keys.push(self.keys.generation(group.slot));
        for &index in &group.takes {
            // The counter's own slot: on one Redis, every counter is in the one group.
            let counter = takes[index].counter;
            keys.extend(
                self.keys
                    .counter_keys(self.keys.counter_slot(counter), counter),
            );
        }
        let mut pauses = Vec::with_capacity(group.takes.len());
        let mut admissions = Vec::with_capacity(group.takes.len());
        for &index in &group.takes {
            let take = takes[index];
            let pause =
                if !self.is_cluster() || self.keys.pause_slot(take.counter.limit) == group.slot {
                    keys.push(self.keys.limit_pause(take.counter.limit));
                    PauseRef::Key(keys.len())
                } else {
                    PauseRef::Read(self.read_pause(take.counter.limit).await?)
                };
            pauses.push(pause);
            admissions.push(self.admission(take, group.slot, &mut keys));
        }
        let mut queues = Vec::with_capacity(group.takes.len());
        for &index in &group.takes {
            let counter = takes[index].counter;
            keys.push(
                self.keys
                    .counter_queue(self.keys.counter_slot(counter), counter),
            );
            queues.push(keys.len() as u64);
        }
        // One cost for the group's counters, or (below 0) one each after the rest.
        let same = group_cost(costs, group);
        for _ in 0..ADMISSION_ATTEMPTS_MAX {
            let mut numbers = Numbers::new(ACQUIRE);
            numbers
                .push_f64(same.map_or(-1.0, |cost| cost as f64))
                .extend(&[
                    priority_arg(priority),
                    u64::from(record),
                    group.takes.len() as u64,
                ]);
            for (position, &index) in group.takes.iter().enumerate() {
                numbers
                    .extend(&policy_args(takes[index].policy))
                    .push_f64(pauses[position].arg())
                    .admission(&admissions[position], self.is_cluster())
                    .extend(&[queues[position]]);
            }
            numbers.extend(&[waiter.map_or(0, WaiterId::get), self.place_ttl_us]);
            if same.is_none() {
                for &index in &group.takes {
                    numbers.push(costs.of(index));
                }
            }
            // Alone when nothing is in flight on the slot, else with what arrived meanwhile.
            let (head, reply) = self
                .caller
                .acquire(group.slot, keys.clone(), numbers.0)
                .await?;
            // The counter a reply names (1-based, in the group), as its place in the request.
            let take_at = |number: Option<&i64>| {
                let position = usize::try_from(number.copied().unwrap_or(1))
                    .unwrap_or(1)
                    .saturating_sub(1);
                group
                    .takes
                    .get(position)
                    .map(|&index| (position, takes[index]))
            };
            match reply.status.as_str() {
                "ok" => return slot_answer(head, &reply, group),
                "cost" => {
                    let named = take_at(reply.numbers.get(3));
                    let limit = named.map_or("", |(_, take)| take.counter.limit);
                    let cost = named.map_or(0, |(position, _)| costs.of(group.takes[position]));
                    return Err(Error::Cost {
                        limit: limit.to_owned(),
                        source: tollgate_core::CostError {
                            cost,
                            capacity: u(reply.numbers.get(4).copied().unwrap_or(0)),
                        },
                    });
                }
                "keys" => {
                    let limit =
                        take_at(reply.numbers.get(3)).map_or("", |(_, take)| take.counter.limit);
                    return Err(too_many_keys(
                        limit,
                        u(reply.numbers.get(4).copied().unwrap_or(0)),
                    ));
                }
                "admit" => {
                    let asks: Vec<(usize, Take<'_>, u64, u64)> = reply.numbers[3..]
                        .chunks(3)
                        .filter_map(|ask| {
                            let (position, take) = take_at(ask.first())?;
                            Some((position, take, u(*ask.get(1)?), u(*ask.get(2)?)))
                        })
                        .collect();
                    let answers = futures_util::future::join_all(
                        asks.iter()
                            .map(|&(_, take, cover, need)| self.admit_key(take, cover, need, true)),
                    )
                    .await;
                    for (&(position, ..), answer) in asks.iter().zip(answers) {
                        admissions[position].carried = answer?;
                    }
                }
                other => return Err(failed(format!("unexpected script status {other}"))),
            }
        }
        let limit = group
            .takes
            .first()
            .map_or("", |&index| takes[index].counter.limit);
        Err(not_admitted(limit))
    }

    /// What `take`'s counter has left at `priority`, read without taking anything (0 when Redis
    /// does not answer): for the counters of a denied cross-slot request that were not asked.
    async fn remaining(&self, take: &Take<'_>, priority: Priority) -> u64 {
        match self.usage_remote(*take).await {
            Ok(usage) => take
                .policy
                .capacity_for(priority)
                .saturating_sub(usage.used),
            Err(_) => 0,
        }
    }

    /// Give back what `groups` granted (a commit of nothing on each), all at once. A rollback
    /// that fails leaves its units counted until they expire: fewer grants, never more.
    async fn roll_back(
        &self,
        takes: &[Take<'_>],
        groups: &[plan::Group],
        outcomes: &[Option<CounterOutcome>],
    ) {
        let rollbacks = groups
            .iter()
            .flat_map(|group| &group.takes)
            .filter_map(|&index| match outcomes[index] {
                Some(CounterOutcome::Granted(grant)) => Some((takes[index], grant.seq)),
                _ => None,
            });
        let answers = futures_util::future::join_all(
            rollbacks
                .map(|(take, seq)| async move { (take, self.commit_at(take, seq, 0).await.1) }),
        )
        .await;
        for (take, answer) in answers {
            if let Err(error) = answer {
                tracing::warn!(
                    limit = take.counter.limit,
                    %error,
                    "a cross-slot grant could not be rolled back; its units stay counted until they expire"
                );
            }
        }
    }
}

/// The one cost of every take of `group`, when they are all the same (always, for a request
/// with one cost): what the script reads as the acquire's cost.
fn group_cost(costs: Costs<'_>, group: &plan::Group) -> Option<u64> {
    match costs {
        Costs::Same(cost) => Some(cost),
        Costs::Each(_) => {
            let (&first, rest) = group.takes.split_first()?;
            let cost = costs.of(first);
            rest.iter()
                .all(|&index| costs.of(index) == cost)
                .then_some(cost)
        }
    }
}
