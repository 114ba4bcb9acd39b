//! A Redis module deciding the Redis store's operations natively, on the same keys and the
//! same stored bytes as the store's Lua function library (`tollgate-redis`), so that a fleet
//! may use module and library on one Redis at once. It owns: the FFI to Redis's module API
//! (`ffi.rs`, the only `unsafe` code), `TOLLGATE.VERSION` (the protocol version, the one the
//! library declares), `TOLLGATE.ACQUIRE` (`acquire.rs`), an acquire or a batch of them, waiting
//! or not (the counters' queues of waiters across the fleet: `queue.rs`), `TOLLGATE.COMMIT`
//! (`commit.rs`), a commit, `TOLLGATE.RENEW` (`leases.rs`), a lease's renewal,
//! `TOLLGATE.LEAVE` (`queue.rs`), a waiter giving up its place, and `TOLLGATE.PAUSE`,
//! `.RESUME`, `.USAGE`, `.CHARGE`, `.ADMIT` and `.BEGIN` (`operations.rs`), each taking the
//! library's keys and packed arguments unchanged (`TOLLGATE.ACQUIRE numkeys key... packed`, as
//! `FCALL <function> numkeys key... packed`) and answering the library's reply, and
//! `TOLLGATE.IDENTITY` (`acquire.rs`), the identity of this Redis process that module and
//! library write the slots' generations under. Every operation may watch evictions as the
//! library's does (`evictions.rs`).
//!
//! The Redis store uses it where it is loaded with the same version (`tollgate_redis`'s
//! `native.rs`: `auto`, `on`, `off`), sending it the calls it decides natively.
//! What the module does not decide (a policy or a stored value of a kind it does not know) it
//! refuses with an error starting `ERR tollgate: not native:`, never deciding differently: the
//! store then calls the library.

mod acquire;
mod commit;
mod evictions;
mod ffi;
mod leases;
mod operations;
mod queue;

/// The version of the protocol (arguments, replies, stored values) this module speaks: the
/// function library's (`tollgate_redis::PROTOCOL_VERSION`), held equal by a test.
pub const PROTOCOL_VERSION: u64 = 1;

/// The module's own version, as `MODULE LIST` shows it.
const MODULE_VERSION: std::ffi::c_int = 1;

/// A value read from, or answered to, Redis.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Nil,
    Int(i64),
    Bytes(Vec<u8>),
    Array(Vec<Value>),
    Error(String),
}

/// What a command answers.
#[derive(Debug)]
pub(crate) enum Reply {
    Value(Value),
    WrongArity,
}

/// Redis as a command sees it: commands called, by their arguments; `write` when the call
/// writes (it is then replicated as itself).
pub(crate) trait Redis {
    fn call(&mut self, args: &[&[u8]], write: bool) -> Value;

    /// Redis's clock in microseconds, read as `TIME` reads it, when it can be read without a
    /// command; None to call `TIME`.
    fn time_us(&mut self) -> Option<f64> {
        None
    }
}

/// A command the module adds: its name, what runs it, its flags, and where its keys are
/// (first, last, step; 0 for none), as `RedisModule_CreateCommand` takes them.
pub(crate) struct Command {
    pub(crate) name: &'static std::ffi::CStr,
    pub(crate) run: fn(&mut ffi::Ctx, &[&[u8]]) -> Reply,
    pub(crate) flags: &'static std::ffi::CStr,
    pub(crate) keys: [std::ffi::c_int; 3],
}

/// Where the keys of a call taking the library's arguments are: after their count and before
/// the packed numbers (the last argument, -2 the one before it), so that a cluster routes it
/// and checks its slot as it does the `FCALL`'s.
const KEYS_BEFORE_NUMBERS: [std::ffi::c_int; 3] = [2, -2, 1];
/// The same, with one more argument after the packed numbers (a commit's wake-up channel).
const KEYS_BEFORE_NUMBERS_AND_ONE: [std::ffi::c_int; 3] = [2, -3, 1];

/// Every command the module adds. Each operation is a command of its own, so that Redis's
/// statistics count them apart; the store names them in `tollgate_redis`'s `native.rs`.
pub(crate) const COMMANDS: &[Command] = &[
    Command {
        name: c"tollgate.version",
        run: version,
        flags: c"readonly fast",
        keys: [0, 0, 0],
    },
    Command {
        name: c"tollgate.identity",
        run: |redis, args| acquire::identity_command(redis, args),
        flags: c"readonly fast",
        keys: [0, 0, 0],
    },
    Command {
        name: c"tollgate.acquire",
        run: |redis, args| acquire::decide(redis, args),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS,
    },
    Command {
        name: c"tollgate.commit",
        run: |redis, args| commit::decide(redis, args),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS_AND_ONE,
    },
    Command {
        name: c"tollgate.leave",
        run: |redis, args| queue::decide_leave(redis, args),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS_AND_ONE,
    },
    Command {
        name: c"tollgate.renew",
        run: |redis, args| operations::reply_of(leases::renew(redis, args)),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS,
    },
    Command {
        name: c"tollgate.pause",
        run: |redis, args| operations::reply_of(operations::pause(redis, args)),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS,
    },
    Command {
        name: c"tollgate.usage",
        run: |redis, args| operations::reply_of(operations::usage(redis, args)),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS,
    },
    Command {
        name: c"tollgate.begin",
        run: |redis, args| operations::reply_of(operations::begin(redis, args)),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS,
    },
    Command {
        name: c"tollgate.resume",
        run: |redis, args| operations::reply_of(operations::resume(redis, args)),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS,
    },
    Command {
        name: c"tollgate.admit",
        run: |redis, args| operations::reply_of(operations::admit_key(redis, args)),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS,
    },
    Command {
        name: c"tollgate.charge",
        run: |redis, args| operations::reply_of(operations::charge(redis, args)),
        flags: c"write deny-oom",
        keys: KEYS_BEFORE_NUMBERS,
    },
];

/// `TOLLGATE.VERSION`: the protocol version.
fn version(_redis: &mut ffi::Ctx, args: &[&[u8]]) -> Reply {
    if args.len() != 1 {
        return Reply::WrongArity;
    }
    Reply::Value(Value::Int(PROTOCOL_VERSION as i64))
}
