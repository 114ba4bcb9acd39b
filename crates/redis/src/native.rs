//! The Redis module (`tollgate-redis-module`) as the store sees it: the setting that chooses it
//! (`Module`), what its `TOLLGATE.VERSION` answer means at connect, and which calls it decides
//! natively (`route`: acquires waiting or not, commits, renewals, leaves of a waiter's place,
//! pauses, resumes, usage, charges, admissions of keys and begins of a namespace, each checked
//! by its own function, `native`, `native_commit`, `native_renew`, `native_leave`,
//! `native_pause` and the others), mirroring the module's refusals in one place. Everything the
//! module does not decide goes to the function library, as it always did.

use std::fmt;
use std::str::FromStr;

use redis::Value;

use crate::abi::{
    ALG_FIXED, ALG_GCRA, ALG_SLIDING, ARG_OWN, KIND_CONCURRENCY, KIND_RATE, OP_ACQUIRE, OP_ADMIT,
    OP_BATCH, OP_BEGIN, OP_CHARGE, OP_COMMIT, OP_LEAVE, OP_PAUSE, OP_RENEW, OP_RESUME, OP_USAGE,
};

/// Whether the store decides acquires with the Redis module.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Module {
    /// Ask Redis at connect: the module when it is loaded with this store's protocol version,
    /// the function library when it is not loaded; another version refuses to start.
    #[default]
    Auto,
    /// The module, for what it decides natively: refuse to start without it.
    On,
    /// The function library for everything, the module loaded or not.
    Off,
}

impl FromStr for Module {
    type Err = String;

    fn from_str(text: &str) -> Result<Module, String> {
        match text {
            "auto" => Ok(Module::Auto),
            "on" => Ok(Module::On),
            "off" => Ok(Module::Off),
            other => Err(format!("`{other}` is not one of auto, on, off")),
        }
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Module::Auto => "auto",
            Module::On => "on",
            Module::Off => "off",
        })
    }
}

/// What the module refuses, by the text after `not native: ` in its refusal, that the store
/// can tell from an acquire's packed numbers before sending it: such an acquire goes to the
/// library at once. `native` checks exactly these; a test holds this list to the module's.
pub const REFUSED_BEFORE_SENDING: &[&str] = &[
    "an operation other than an acquire or a batch of them",
    "a policy other than a concurrency limit or a GCRA, sliding or fixed window rate limit",
];

/// What the module refuses of a commit (`TOLLGATE.COMMIT`) that the store can tell from its
/// packed numbers: such a commit goes to the library at once. `native_commit` checks exactly
/// these; a test holds this list to the module's.
pub const COMMIT_REFUSED_BEFORE_SENDING: &[&str] = &[
    "an operation other than a commit",
    "a commit of other than a concurrency limit or a GCRA, sliding or fixed window rate limit",
];

/// What the module refuses of a waiter's leave (`TOLLGATE.LEAVE`) that the store can tell from
/// its packed numbers: such a leave goes to the library at once. `native_leave` checks exactly
/// these; a test holds this list to the module's.
pub const LEAVE_REFUSED_BEFORE_SENDING: &[&str] = &["an operation other than a leave"];
/// What the module refuses of a renewal (`TOLLGATE.RENEW`) that the store can tell from its
/// packed numbers: such a renewal goes to the library at once. `native_renew` checks exactly
/// these; a test holds this list to the module's.
pub const RENEW_REFUSED_BEFORE_SENDING: &[&str] = &["an operation other than a renew"];
/// What the module refuses of a pause, resume, usage, charge, admission of a key or begin of a
/// namespace (`TOLLGATE.PAUSE` and the others of its `operations.rs`) that the store can tell
/// from their packed numbers: such a call goes to the library at once. `native_pause` and
/// the others check exactly these; a test holds this list to the module's.
pub const OPERATIONS_REFUSED_BEFORE_SENDING: &[&str] = &[
    "an operation other than a pause",
    "an operation other than a resume",
    "an operation other than a usage",
    "an operation other than a charge",
    "an operation other than an admission of a key",
    "an operation other than a new namespace's begin",
    "a pause, resume or usage of a counter of other than a concurrency limit or a GCRA, sliding or fixed window rate limit",
    "a charge of a rate limit of other than GCRA, sliding or fixed window",
];

/// What the module refuses that only Redis can see (what the counter's keys hold), of an
/// acquire, a commit or a renewal: the store sends the call to the library after the refusal, one more
/// round trip, and counts it.
pub const REFUSED_IN_REDIS: &[&str] = &[
    "a counter of a kind not known",
    "a counter value shorter than its kind's",
];

/// The rate algorithms the module decides, of an acquire and of a commit alike.
const NATIVE_ALGORITHMS: &[u64] = &[ALG_SLIDING, ALG_FIXED, ALG_GCRA];

fn native_algorithm(alg: f64) -> bool {
    NATIVE_ALGORITHMS.iter().any(|&native| alg == native as f64)
}

/// Whether the module decides a policy of `kind` and `alg`: a concurrency limit (whatever its
/// algorithm number), or a rate limit of its algorithms.
fn native_policy(kind: Option<f64>, alg: Option<f64>) -> bool {
    kind == Some(KIND_CONCURRENCY as f64)
        || (kind == Some(KIND_RATE as f64) && alg.is_some_and(native_algorithm))
}

/// The start of the module's refusal, after Redis's `ERR`.
pub(crate) const NOT_NATIVE: &str = "tollgate: not native:";

/// Where an acquire's numbers are (0-based, in doubles): the head, then the first counter's
/// policy (kind first, algorithm fifth).
const AT_OPERATION: usize = 0;
const AT_COUNTERS: usize = 4;
/// The first counter's kind (its algorithm 4 after), and each counter's numbers (policy, pause,
/// admission, queue: 15) after the last's.
const AT_KIND: usize = 5;
const ALGORITHM_AFTER_KIND: usize = 4;
const PER_COUNTER: usize = 15;

/// The number at `index` (0-based) of packed big-endian doubles.
fn number_at(numbers: &[u8], index: usize) -> Option<f64> {
    numbers
        .get(index * 8..index * 8 + 8)
        .and_then(|bytes| bytes.try_into().ok())
        .map(f64::from_be_bytes)
}

/// Whether the module decides the acquire packed in `numbers` (as its own call would send
/// them, before any evictions flag): counters of concurrency limits or of rate limits (GCRA,
/// sliding or fixed window), the request waiting or not. The
/// checks of `REFUSED_BEFORE_SENDING`, in its order.
pub(crate) fn native(numbers: &[u8]) -> bool {
    let at = |index: usize| number_at(numbers, index);
    let Some(counters) = at(AT_COUNTERS)
        .filter(|n| *n >= 1.0 && n.fract() == 0.0 && *n <= (numbers.len() / 8) as f64)
        .map(|n| n as usize)
    else {
        return false;
    };
    at(AT_OPERATION) == Some(OP_ACQUIRE as f64)
        && (0..counters).all(|i| {
            let kind = AT_KIND + PER_COUNTER * i;
            native_policy(at(kind), at(kind + ALGORITHM_AFTER_KIND))
        })
}

/// Where a commit's numbers are (0-based, in doubles): the operation, then the policy.
const AT_COMMIT_KIND: usize = 1;
const AT_COMMIT_ALGORITHM: usize = AT_COMMIT_KIND + 4;

/// Whether the module decides the commit packed in `numbers` (as its own call would send
/// them, before any evictions flag): a reservation of a rate limit's counter (GCRA, sliding or
/// fixed window) or a concurrency limit's lease. The checks of
/// `COMMIT_REFUSED_BEFORE_SENDING`.
pub(crate) fn native_commit(numbers: &[u8]) -> bool {
    let at = |index: usize| number_at(numbers, index);
    at(AT_OPERATION) == Some(OP_COMMIT as f64) && counter_policy_native(numbers)
}

/// Whether the module decides the renewal packed in `numbers` (as its own call would send
/// them, before any evictions flag): any (a rate limit's is
/// answered `wrong_kind` there, as by the library). The checks of
/// `RENEW_REFUSED_BEFORE_SENDING`.
pub(crate) fn native_renew(numbers: &[u8]) -> bool {
    number_at(numbers, AT_OPERATION) == Some(OP_RENEW as f64)
}

/// Whether the module decides the leave packed in `numbers` (as its own call would send them,
/// before any evictions flag): a waiter giving up its place. The
/// check of `LEAVE_REFUSED_BEFORE_SENDING`.
pub(crate) fn native_leave(numbers: &[u8]) -> bool {
    number_at(numbers, AT_OPERATION) == Some(OP_LEAVE as f64)
}

/// Where a one-counter call's own numbers start (0-based, in doubles: `abi.rs`'s ARG_OWN is
/// 1-based): a pause's duration then whether it is a key's, a resume's whether it is a key's,
/// a usage's limit pause, a charge's units.
const AT_OWN: usize = ARG_OWN as usize - 1;

/// Of a one-counter call packed in `numbers`: whether the module decides its policy.
fn counter_policy_native(numbers: &[u8]) -> bool {
    native_policy(
        number_at(numbers, AT_COMMIT_KIND),
        number_at(numbers, AT_COMMIT_ALGORITHM),
    )
}

/// The checks of `OPERATIONS_REFUSED_BEFORE_SENDING` for each operation of the module's
/// `operations.rs`, of its numbers as its own call would send them (before any evictions flag):
/// a key's pause, resume or usage only of a counter of a policy
/// decided natively (a concurrency limit, or a rate limit of the module's algorithms).
fn native_pause(numbers: &[u8]) -> bool {
    let keyed = number_at(numbers, AT_OWN + 1) == Some(1.0);
    number_at(numbers, AT_OPERATION) == Some(OP_PAUSE as f64)
        && (!keyed || counter_policy_native(numbers))
}

fn native_resume(numbers: &[u8]) -> bool {
    let keyed = number_at(numbers, AT_OWN) == Some(1.0);
    number_at(numbers, AT_OPERATION) == Some(OP_RESUME as f64)
        && (!keyed || counter_policy_native(numbers))
}

fn native_usage(numbers: &[u8]) -> bool {
    number_at(numbers, AT_OPERATION) == Some(OP_USAGE as f64) && counter_policy_native(numbers)
}

/// A charge of a limit not a rate limit counts nothing, natively too.
fn native_charge(numbers: &[u8]) -> bool {
    let rate = number_at(numbers, AT_COMMIT_KIND) == Some(KIND_RATE as f64);
    number_at(numbers, AT_OPERATION) == Some(OP_CHARGE as f64)
        && (!rate || counter_policy_native(numbers))
}

fn native_admit(numbers: &[u8]) -> bool {
    number_at(numbers, AT_OPERATION) == Some(OP_ADMIT as f64)
}

fn native_begin(numbers: &[u8]) -> bool {
    number_at(numbers, AT_OPERATION) == Some(OP_BEGIN as f64)
}

/// An operation of the function library and the module's command that decides it: one
/// command per operation, each taking the library's keys and packed arguments unchanged
/// (`TOLLGATE.<OPERATION> numkeys key... packed [extra]`, as `FCALL <function> numkeys key...
/// packed [extra]`), so that Redis's own statistics count them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Native {
    /// An acquire, or a batch of them.
    Acquire,
    Commit,
    Renew,
    Pause,
    Usage,
    Begin,
    Resume,
    Admit,
    Leave,
    Charge,
}

impl Native {
    /// Every operation, in the order of its counts.
    pub(crate) const ALL: [Native; 10] = [
        Native::Acquire,
        Native::Commit,
        Native::Renew,
        Native::Pause,
        Native::Usage,
        Native::Begin,
        Native::Resume,
        Native::Admit,
        Native::Leave,
        Native::Charge,
    ];

    /// The module's command that decides it.
    pub(crate) fn command(self) -> &'static str {
        match self {
            Native::Acquire => "TOLLGATE.ACQUIRE",
            Native::Commit => "TOLLGATE.COMMIT",
            Native::Renew => "TOLLGATE.RENEW",
            Native::Pause => "TOLLGATE.PAUSE",
            Native::Usage => "TOLLGATE.USAGE",
            Native::Begin => "TOLLGATE.BEGIN",
            Native::Resume => "TOLLGATE.RESUME",
            Native::Admit => "TOLLGATE.ADMIT",
            Native::Leave => "TOLLGATE.LEAVE",
            Native::Charge => "TOLLGATE.CHARGE",
        }
    }

    /// The operation of the library's call packed in `numbers` (its code first, before any
    /// evictions flag).
    fn of(numbers: &[u8]) -> Option<Native> {
        let op = number_at(numbers, AT_OPERATION).filter(|op| *op >= 0.0 && op.fract() == 0.0)?;
        Some(match op as u64 {
            OP_ACQUIRE | OP_BATCH => Native::Acquire,
            OP_COMMIT => Native::Commit,
            OP_RENEW => Native::Renew,
            OP_PAUSE => Native::Pause,
            OP_USAGE => Native::Usage,
            OP_BEGIN => Native::Begin,
            OP_RESUME => Native::Resume,
            OP_ADMIT => Native::Admit,
            OP_LEAVE => Native::Leave,
            OP_CHARGE => Native::Charge,
            _ => return None,
        })
    }
}

/// The module's command for the library's call packed in `numbers` (as its own call would send
/// them, before any evictions flag), when the module decides it natively; None: the library
/// decides it. An acquire alone or a batch goes through `native` (the batcher's path); every
/// other operation through here.
pub(crate) fn route(numbers: &[u8]) -> Option<Native> {
    let operation = Native::of(numbers)?;
    let decided = match operation {
        Native::Acquire => native(numbers),
        Native::Commit => native_commit(numbers),
        Native::Leave => native_leave(numbers),
        Native::Renew => native_renew(numbers),
        Native::Pause => native_pause(numbers),
        Native::Resume => native_resume(numbers),
        Native::Usage => native_usage(numbers),
        Native::Charge => native_charge(numbers),
        Native::Admit => native_admit(numbers),
        Native::Begin => native_begin(numbers),
    };
    decided.then_some(operation)
}

/// What `TOLLGATE.VERSION` answered (on a cluster, every master).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Loaded {
    /// Unknown command: the module is not loaded (or was lost with a restart).
    No,
    /// Loaded, speaking this protocol version (on a cluster, every master: the one that is not
    /// `expected` when one is not).
    Version(u64),
    /// A cluster whose masters have the module, but for those named.
    Partly { missing: Vec<String> },
}

/// Ask Redis whether the module is loaded, and its version: on a cluster, every master, since
/// an acquire goes to its counter's slot's master.
pub(crate) async fn probe(
    backend: &crate::backend::Backend,
    expected: u64,
) -> tollgate::Result<Loaded> {
    let answers = backend
        .query_masters(&redis::cmd("TOLLGATE.VERSION"))
        .await
        .map_err(crate::errors::store_error)?;
    let mut versions = Vec::new();
    let mut missing = Vec::new();
    for (node, answer) in answers {
        match answer {
            Ok(Value::Int(version)) => versions.push(u64::try_from(version).unwrap_or(0)),
            Ok(other) => {
                return Err(crate::errors::failed(format!(
                    "TOLLGATE.VERSION answered {other:?} on {node}, not a version"
                )));
            }
            Err(error) if unknown_command(&error) => missing.push(node),
            Err(error) => return Err(crate::errors::store_error(error)),
        }
    }
    Ok(match (versions.is_empty(), missing.is_empty()) {
        (true, _) => Loaded::No,
        (false, true) => Loaded::Version(
            versions
                .iter()
                .copied()
                .find(|version| *version != expected)
                .unwrap_or(expected),
        ),
        (false, false) => {
            missing.sort();
            Loaded::Partly { missing }
        }
    })
}

/// Redis does not know the command: the module is not loaded (or was lost with a restart).
pub(crate) fn unknown_command(error: &redis::RedisError) -> bool {
    error
        .to_string()
        .to_ascii_lowercase()
        .contains("unknown command")
}

/// The module refused the call: the library decides it.
pub(crate) fn refused(error: &redis::RedisError) -> bool {
    error.to_string().contains(NOT_NATIVE)
}

/// The module's reason in its refusal: what follows `not native: `.
pub(crate) fn reason(error: &redis::RedisError) -> String {
    let text = error.to_string();
    match text.find(NOT_NATIVE) {
        Some(at) => text[at + NOT_NATIVE.len()..].trim().to_owned(),
        None => text,
    }
}

/// Whether to use the module, for `setting` and what Redis answered; Err says why the store
/// must not start. `expected` is this store's protocol version.
pub(crate) fn choose(setting: Module, loaded: &Loaded, expected: u64) -> Result<bool, String> {
    match (setting, loaded) {
        (Module::Off, _) => Ok(false),
        (_, Loaded::Version(version)) if *version != expected => Err(format!(
            "the Redis module tollgate speaks protocol version {version}, this server speaks \
             version {expected}: load the module built with this server, or set \
             this setting to off"
        )),
        (_, Loaded::Version(_)) => Ok(true),
        (Module::On, Loaded::No) => Err(
            "on, but Redis does not know TOLLGATE.VERSION: the Redis module tollgate is not \
             loaded (see docs/deployment.md)"
                .to_owned(),
        ),
        (Module::On, Loaded::Partly { missing }) => Err(format!(
            "on, but the Redis module tollgate is not loaded on every master of the \
             cluster: not on {} (load it on every node, see docs/deployment.md)",
            missing.join(", ")
        )),
        (Module::Auto, Loaded::No | Loaded::Partly { .. }) => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_mismatch_names_both_versions() {
        let refusal = choose(Module::Auto, &Loaded::Version(7), 1).expect_err("refused");
        assert!(
            refusal.contains("version 7") && refusal.contains("version 1"),
            "{refusal}"
        );
        assert_eq!(choose(Module::Off, &Loaded::Version(7), 1), Ok(false));
        assert_eq!(choose(Module::Auto, &Loaded::No, 1), Ok(false));
        assert_eq!(choose(Module::Auto, &Loaded::Version(1), 1), Ok(true));
        assert!(choose(Module::On, &Loaded::No, 1).is_err());
    }

    #[test]
    fn a_cluster_uses_the_module_only_where_every_master_has_it() {
        let partly = Loaded::Partly {
            missing: vec!["127.0.0.1:7001".into()],
        };
        assert_eq!(choose(Module::Auto, &partly, 1), Ok(false));
        let refusal = choose(Module::On, &partly, 1).expect_err("refused");
        assert!(refusal.contains("127.0.0.1:7001"), "{refusal}");
    }

    /// The numbers of a call: big-endian doubles.
    fn packed(numbers: &[f64]) -> Vec<u8> {
        numbers.iter().flat_map(|n| n.to_be_bytes()).collect()
    }

    /// A one-counter call of `op` on a policy of `kind` and `alg`, with its `own` numbers.
    fn one_counter(op: u64, kind: u64, alg: u64, own: &[f64]) -> Vec<u8> {
        let mut numbers = vec![op as f64, kind as f64, 5.0, 1e6, 0.0, alg as f64, 5.0];
        numbers.extend([0.0; 3]);
        numbers.extend([5.0, 100.0, 0.0, 0.0]);
        numbers.extend(own);
        packed(&numbers)
    }

    #[test]
    fn pauses_usage_charges_admissions_and_begins_go_to_the_module_as_it_decides_them() {
        use crate::abi::KIND_CONCURRENCY;
        let (rate, lease) = ((KIND_RATE, ALG_GCRA), (KIND_CONCURRENCY, 0));
        let cases = [
            // A key's pause, resume and usage: of a counter of a policy the module decides.
            (
                one_counter(OP_PAUSE, rate.0, rate.1, &[1e6, 1.0]),
                Some(Native::Pause),
            ),
            (
                one_counter(OP_PAUSE, lease.0, lease.1, &[1e6, 1.0]),
                Some(Native::Pause),
            ),
            (one_counter(OP_PAUSE, rate.0, 0, &[1e6, 1.0]), None),
            (
                one_counter(OP_RESUME, rate.0, rate.1, &[1.0]),
                Some(Native::Resume),
            ),
            (
                one_counter(OP_RESUME, lease.0, lease.1, &[1.0]),
                Some(Native::Resume),
            ),
            (one_counter(OP_RESUME, rate.0, 0, &[1.0]), None),
            (
                one_counter(OP_USAGE, rate.0, rate.1, &[5.0]),
                Some(Native::Usage),
            ),
            (
                one_counter(OP_USAGE, lease.0, lease.1, &[5.0]),
                Some(Native::Usage),
            ),
            (one_counter(OP_USAGE, rate.0, 0, &[5.0]), None),
            // A whole limit's pause and resume, of any limit.
            (
                one_counter(OP_PAUSE, lease.0, lease.1, &[1e6, 0.0]),
                Some(Native::Pause),
            ),
            (
                one_counter(OP_RESUME, lease.0, lease.1, &[0.0]),
                Some(Native::Resume),
            ),
            // A charge: of a concurrency limit too (it counts nothing).
            (
                one_counter(OP_CHARGE, rate.0, ALG_SLIDING, &[3.0]),
                Some(Native::Charge),
            ),
            (
                one_counter(OP_CHARGE, lease.0, lease.1, &[3.0]),
                Some(Native::Charge),
            ),
            (one_counter(OP_CHARGE, rate.0, 0, &[3.0]), None),
            (
                one_counter(OP_ADMIT, rate.0, rate.1, &[1.0]),
                Some(Native::Admit),
            ),
            (packed(&[OP_BEGIN as f64]), Some(Native::Begin)),
        ];
        for (packed, native) in cases {
            let numbers: Vec<f64> = (0..packed.len() / 8)
                .filter_map(|i| number_at(&packed, i))
                .collect();
            assert_eq!(route(&packed), native, "{numbers:?}");
        }
    }

    #[test]
    fn the_setting_reads_its_three_words() {
        for mode in [Module::Auto, Module::On, Module::Off] {
            assert_eq!(mode.to_string().parse::<Module>(), Ok(mode));
        }
        assert!(
            "yes"
                .parse::<Module>()
                .expect_err("not a setting")
                .contains("auto, on, off")
        );
    }
}
