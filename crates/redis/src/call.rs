//! One call of the script, encoded and decoded: a policy's numbers, the admission and pause
//! references, all packed as one argument (`Numbers`); the reply read back (`Reply`, `Head`,
//! a slot's outcomes), and what fail-open answers instead of a call.

use redis::Value;
use tollgate::Result;
use tollgate::store::{CounterOutcome, Decision};
use tollgate_core::{Algorithm, Denial, Grant, Kind, Policy, Priority};

use crate::abi::{
    self, ALG_FIXED, ALG_GCRA, ALG_SLIDING, KIND_CONCURRENCY, KIND_RATE, OUTCOME_ALLOWED,
    OUTCOME_GRANTED,
};
use crate::errors::failed;
use crate::plan;

/// The nine numbers the script reads for a policy.
pub(crate) fn policy_args(policy: &Policy) -> [u64; abi::POLICY_NUMBERS] {
    let reserve = policy.reserve();
    match policy.kind() {
        Kind::Rate(rate) => {
            let (algorithm, burst) = match rate.algorithm() {
                Algorithm::Sliding => (ALG_SLIDING, 0),
                Algorithm::Fixed => (ALG_FIXED, 0),
                Algorithm::Gcra { burst } => (ALG_GCRA, burst),
            };
            [
                KIND_RATE,
                rate.limit(),
                rate.period_us(),
                rate.margin_us(),
                algorithm,
                burst,
                0,
                reserve.high,
                reserve.normal,
            ]
        }
        Kind::Concurrency(concurrency) => [
            KIND_CONCURRENCY,
            concurrency.limit(),
            0,
            0,
            0,
            0,
            concurrency.lease_ttl_us(),
            reserve.high,
            reserve.normal,
        ],
    }
}

pub(crate) fn priority_arg(priority: Priority) -> u64 {
    abi::priority_code(priority)
}

/// The script's reply, read as a list of integers after its leading status word.
pub(crate) struct Reply {
    pub(crate) status: String,
    pub(crate) numbers: Vec<i64>,
}

pub(crate) fn parse_reply(value: Value) -> Result<Reply> {
    let Value::Array(items) = value else {
        return Err(failed(format!("unexpected script reply {value:?}")));
    };
    let mut items = items.into_iter();
    let status = match items.next() {
        Some(Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Some(Value::SimpleString(text)) => text,
        other => {
            return Err(failed(format!("unexpected script status {other:?}")));
        }
    };
    let numbers = items
        .map(|item| match item {
            Value::Int(number) => Ok(number),
            other => Err(failed(format!("unexpected script value {other:?}"))),
        })
        .collect::<Result<Vec<i64>>>()?;
    Ok(Reply { status, numbers })
}

pub(crate) fn u(number: i64) -> u64 {
    u64::try_from(number).unwrap_or(0)
}

/// The head every successful reply starts with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Head {
    pub(crate) now_us: u64,
    pub(crate) born_us: u64,
    pub(crate) lost: bool,
}

/// Where a counter's limit-wide pause is, for the script: at `KEYS[index]` (its key is in the
/// call's slot), or already read (its end, 0 for none), from another slot.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PauseRef {
    Key(usize),
    Read(u64),
}

impl PauseRef {
    pub(crate) fn arg(self) -> f64 {
        match self {
            PauseRef::Key(index) => index as f64,
            PauseRef::Read(until) => -(until as f64),
        }
    }
}

/// Where a counter's limit keeps its budget of keys, for the script (`T.read_admission`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum TallyRef {
    /// A counter without a key: never admitted.
    Unkeyed,
    /// At `KEYS[index]`, in the call's slot: the script admits the key itself.
    Key(usize),
    /// In another slot: the script answers `admit`, and the caller asks there (`admit_key`).
    Elsewhere,
}

/// What a caller brings to the script from a budget in another slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carried {
    Nothing,
    /// The key is counted until then.
    Cover(u64),
    /// The budget admits no new key until then (held after a loss).
    Held(u64),
}

/// A counter's admission, as the script reads it after its policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admission {
    pub(crate) tally: TallyRef,
    pub(crate) budget: u64,
    pub(crate) carried: Carried,
}

/// The numbers of a call, packed as one argument of big-endian doubles: one Lua string to make
/// instead of one per number. Every number the script reads is an integer below 2^53, exact as
/// a double (a pause read elsewhere travels negated).
#[derive(Default)]
pub(crate) struct Numbers(pub(crate) Vec<u8>);

impl Numbers {
    pub(crate) fn new(operation: u64) -> Numbers {
        let mut numbers = Numbers(Vec::with_capacity(128));
        numbers.push(operation);
        numbers
    }

    pub(crate) fn push(&mut self, number: u64) -> &mut Numbers {
        self.push_f64(number as f64)
    }

    pub(crate) fn push_f64(&mut self, number: f64) -> &mut Numbers {
        self.0.extend_from_slice(&number.to_be_bytes());
        self
    }

    pub(crate) fn extend(&mut self, numbers: &[u64]) -> &mut Numbers {
        for &number in numbers {
            self.push(number);
        }
        self
    }

    /// A counter's admission: its four numbers (`apart`: on a cluster).
    pub(crate) fn admission(&mut self, admission: &Admission, apart: bool) -> &mut Numbers {
        let tally = match admission.tally {
            TallyRef::Unkeyed => 0.0,
            TallyRef::Key(index) => index as f64,
            TallyRef::Elsewhere => -1.0,
        };
        let carried = match admission.carried {
            Carried::Nothing => 0.0,
            Carried::Cover(end) => end as f64,
            Carried::Held(until) => -(until as f64),
        };
        self.push_f64(tally)
            .push(admission.budget)
            .push_f64(carried)
            .push(u64::from(apart))
    }
}

/// What one slot's call answered for its counters.
pub(crate) struct SlotAnswer {
    pub(crate) now_us: u64,
    pub(crate) outcomes: Vec<CounterOutcome>,
}

/// A slot's `ok` reply: one outcome for each counter of `group`.
pub(crate) fn slot_answer(head: Head, reply: &Reply, group: &plan::Group) -> Result<SlotAnswer> {
    let numbers = &reply.numbers[3..];
    if numbers.len() != group.takes.len() * abi::OUTCOME_NUMBERS {
        return Err(failed("script reply of the wrong length"));
    }
    let outcomes = numbers
        .chunks(abi::OUTCOME_NUMBERS)
        .map(|outcome| match u(outcome[0]) {
            OUTCOME_GRANTED => CounterOutcome::Granted(Grant {
                seq: u(outcome[1]),
                remaining: u(outcome[2]),
                reset_after_us: u(outcome[3]),
                lease_expires_at: (outcome[4] > 0).then(|| u(outcome[4])),
            }),
            OUTCOME_ALLOWED => CounterOutcome::Allowed {
                remaining: u(outcome[2]),
            },
            // OUTCOME_DENIED, or a code this version does not know: nothing was granted.
            _ => CounterOutcome::Denied(Denial {
                retry_after_us: u(outcome[1]),
                remaining: u(outcome[2]),
                reason: abi::reason(u(outcome[3])),
                left: u(outcome[4]),
            }),
        })
        .collect();
    Ok(SlotAnswer {
        now_us: head.now_us,
        outcomes,
    })
}

/// `outcome`, decided at `now_us` on its slot's clock, with its lease expiry moved to the
/// request's base clock (the first slot's): each node has its own clock, and a lease is as
/// long as its node says.
pub(crate) fn rebase(outcome: CounterOutcome, now_us: u64, base_us: u64) -> CounterOutcome {
    match outcome {
        CounterOutcome::Granted(mut grant) => {
            grant.lease_expires_at = grant
                .lease_expires_at
                .map(|at| base_us.saturating_add(at.saturating_sub(now_us)));
            CounterOutcome::Granted(grant)
        }
        other => other,
    }
}

/// A grant on every counter that counts nothing: what fail-open answers while Redis is down.
pub(crate) fn fail_open_decision(counters: usize) -> Decision {
    let grant = Grant {
        seq: 0,
        remaining: 0,
        reset_after_us: 0,
        lease_expires_at: None,
    };
    Decision::new(0, (0..counters).map(|_| CounterOutcome::Granted(grant)))
}
