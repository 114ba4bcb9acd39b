//! The Redis module API, the few functions this module uses, declared by hand from Redis's
//! `redismodule.h` (no bindings generator): the load entry point, the API fetched by name
//! through the `RedisModule_GetApi` pointer Redis puts first in the load context (what
//! `RedisModule_Init`'s inline code does in C), and safe wrappers for the commands
//! (`Ctx`: calling Redis commands, replying). The only `unsafe` code of the crate is here.
#![allow(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, c_int, c_long, c_longlong, c_void};
use std::sync::OnceLock;

use crate::{Reply, Value};

const REDISMODULE_OK: c_int = 0;
const REDISMODULE_ERR: c_int = 1;
const REDISMODULE_APIVER_1: c_int = 1;

const REPLY_STRING: c_int = 0;
const REPLY_ERROR: c_int = 1;
const REPLY_INTEGER: c_int = 2;
const REPLY_ARRAY: c_int = 3;

/// Opaque Redis types.
#[repr(C)]
pub struct RedisModuleCtx {
    _private: [u8; 0],
}
#[repr(C)]
pub struct RedisModuleString {
    _private: [u8; 0],
}
#[repr(C)]
pub struct RedisModuleCallReply {
    _private: [u8; 0],
}
#[repr(C)]
pub struct RedisModuleKey {
    _private: [u8; 0],
}

const REDISMODULE_READ: c_int = 1;
const REDISMODULE_WRITE: c_int = 2;
const KEYTYPE_EMPTY: c_int = 0;
const KEYTYPE_STRING: c_int = 1;

/// `redismodule.h`'s `RedisModuleEvent`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct RedisModuleEvent {
    id: u64,
    dataver: u64,
}

/// `RedisModuleEvent_Loading`: Redis loads a data set (at start, on a full sync, on
/// `DEBUG RELOAD`); every subevent (start, end, failure) is a load.
const EVENT_LOADING: RedisModuleEvent = RedisModuleEvent { id: 3, dataver: 1 };

type EventCallback = unsafe extern "C" fn(*mut RedisModuleCtx, RedisModuleEvent, u64, *mut c_void);
type GetApiFn = unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int;
type CmdFunc =
    unsafe extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int;

/// The API functions used, as `redismodule.h` declares them.
struct Api {
    set_module_attribs: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, c_int, c_int),
    is_module_name_busy: Option<unsafe extern "C" fn(*const c_char) -> c_int>,
    create_command: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *const c_char,
        CmdFunc,
        *const c_char,
        c_int,
        c_int,
        c_int,
    ) -> c_int,
    auto_memory: unsafe extern "C" fn(*mut RedisModuleCtx),
    wrong_arity: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    reply_with_long_long: unsafe extern "C" fn(*mut RedisModuleCtx, c_longlong) -> c_int,
    reply_with_error: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char) -> c_int,
    reply_with_array: unsafe extern "C" fn(*mut RedisModuleCtx, c_long) -> c_int,
    reply_with_null: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    reply_with_string_buffer:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, usize) -> c_int,
    string_ptr_len: unsafe extern "C" fn(*const RedisModuleString, *mut usize) -> *const c_char,
    create_string:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, usize) -> *mut RedisModuleString,
    call: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *const c_char,
        *const c_char,
        ...
    ) -> *mut RedisModuleCallReply,
    call_reply_type: unsafe extern "C" fn(*mut RedisModuleCallReply) -> c_int,
    call_reply_string_ptr:
        unsafe extern "C" fn(*mut RedisModuleCallReply, *mut usize) -> *const c_char,
    call_reply_integer: unsafe extern "C" fn(*mut RedisModuleCallReply) -> c_longlong,
    call_reply_length: unsafe extern "C" fn(*mut RedisModuleCallReply) -> usize,
    call_reply_array_element:
        unsafe extern "C" fn(*mut RedisModuleCallReply, usize) -> *mut RedisModuleCallReply,
    /// The key API, for the reads and writes every decision makes (`Ctx::call`); without any
    /// of it, every command goes through `call`.
    keys: Option<KeyApi>,
    /// Absent before Redis 6.
    subscribe_to_server_event:
        Option<unsafe extern "C" fn(*mut RedisModuleCtx, RedisModuleEvent, EventCallback) -> c_int>,
}

/// Redis's key API, as `redismodule.h` declares it.
#[derive(Clone, Copy)]
struct KeyApi {
    open_key: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *mut RedisModuleString,
        c_int,
    ) -> *mut RedisModuleKey,
    close_key: unsafe extern "C" fn(*mut RedisModuleKey),
    key_type: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    string_dma: unsafe extern "C" fn(*mut RedisModuleKey, *mut usize, c_int) -> *mut c_char,
    string_set: unsafe extern "C" fn(*mut RedisModuleKey, *mut RedisModuleString) -> c_int,
    set_expire: unsafe extern "C" fn(*mut RedisModuleKey, c_longlong) -> c_int,
    get_abs_expire: unsafe extern "C" fn(*mut RedisModuleKey) -> c_longlong,
    replicate:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, *const c_char, ...) -> c_int,
    string_truncate: unsafe extern "C" fn(*mut RedisModuleKey, usize) -> c_int,
    delete_key: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
}

/// The argument a replicated command carries after its key.
#[derive(Clone, Copy)]
enum Arg<'a> {
    None,
    Bytes(&'a [u8]),
    Int(c_longlong),
}

/// The C library's `struct timeval`.
#[repr(C)]
struct Timeval {
    tv_sec: std::ffi::c_long,
    tv_usec: std::ffi::c_long,
}

unsafe extern "C" {
    /// What Redis's `TIME` reads.
    fn gettimeofday(tv: *mut Timeval, tz: *mut c_void) -> c_int;
}

static API: OnceLock<Api> = OnceLock::new();

/// One API function by name, or None when this Redis has none of that name.
///
/// # Safety
/// `get_api` is Redis's `RedisModule_GetApi`, and `T` the function pointer type `redismodule.h`
/// declares for `name`.
unsafe fn fetch<T: Copy>(get_api: GetApiFn, name: &std::ffi::CStr) -> Option<T> {
    let mut slot: *mut c_void = std::ptr::null_mut();
    // SAFETY: GetApi writes one pointer to the slot it is given, which is a `*mut c_void`.
    let found = unsafe { get_api(name.as_ptr(), (&raw mut slot).cast()) };
    if found != REDISMODULE_OK || slot.is_null() {
        return None;
    }
    // SAFETY: the caller names the type of the function `name` is; both are one pointer wide.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&slot) })
}

/// `RedisModule_Init`'s work: every function fetched, the module named.
///
/// # Safety
/// `ctx` is the context Redis passes to `RedisModule_OnLoad`.
unsafe fn init(ctx: *mut RedisModuleCtx) -> Option<()> {
    // SAFETY: Redis's module context begins with the `RedisModule_GetApi` pointer (this is how
    // `RedisModule_Init` in redismodule.h finds it).
    let get_api: GetApiFn = unsafe { *(ctx as *const GetApiFn) };
    macro_rules! get {
        ($name:literal) => {
            // SAFETY: the field's type is the function's type in redismodule.h.
            unsafe { fetch(get_api, $name)? }
        };
    }
    let api = Api {
        set_module_attribs: get!(c"RedisModule_SetModuleAttribs"),
        // SAFETY: as `get!`; an older Redis lacks it, which the C init allows too.
        is_module_name_busy: unsafe { fetch(get_api, c"RedisModule_IsModuleNameBusy") },
        create_command: get!(c"RedisModule_CreateCommand"),
        auto_memory: get!(c"RedisModule_AutoMemory"),
        wrong_arity: get!(c"RedisModule_WrongArity"),
        reply_with_long_long: get!(c"RedisModule_ReplyWithLongLong"),
        reply_with_error: get!(c"RedisModule_ReplyWithError"),
        reply_with_array: get!(c"RedisModule_ReplyWithArray"),
        reply_with_null: get!(c"RedisModule_ReplyWithNull"),
        reply_with_string_buffer: get!(c"RedisModule_ReplyWithStringBuffer"),
        string_ptr_len: get!(c"RedisModule_StringPtrLen"),
        create_string: get!(c"RedisModule_CreateString"),
        call: get!(c"RedisModule_Call"),
        call_reply_type: get!(c"RedisModule_CallReplyType"),
        call_reply_string_ptr: get!(c"RedisModule_CallReplyStringPtr"),
        call_reply_integer: get!(c"RedisModule_CallReplyInteger"),
        call_reply_length: get!(c"RedisModule_CallReplyLength"),
        call_reply_array_element: get!(c"RedisModule_CallReplyArrayElement"),
        // SAFETY: each the type `redismodule.h` declares for it.
        keys: unsafe {
            (|| {
                Some(KeyApi {
                    open_key: fetch(get_api, c"RedisModule_OpenKey")?,
                    close_key: fetch(get_api, c"RedisModule_CloseKey")?,
                    key_type: fetch(get_api, c"RedisModule_KeyType")?,
                    string_dma: fetch(get_api, c"RedisModule_StringDMA")?,
                    string_set: fetch(get_api, c"RedisModule_StringSet")?,
                    set_expire: fetch(get_api, c"RedisModule_SetExpire")?,
                    get_abs_expire: fetch(get_api, c"RedisModule_GetAbsExpire")?,
                    replicate: fetch(get_api, c"RedisModule_Replicate")?,
                    string_truncate: fetch(get_api, c"RedisModule_StringTruncate")?,
                    delete_key: fetch(get_api, c"RedisModule_DeleteKey")?,
                })
            })()
        },
        // SAFETY: the type `redismodule.h` declares for it.
        subscribe_to_server_event: unsafe { fetch(get_api, c"RedisModule_SubscribeToServerEvent") },
    };
    if let Some(busy) = api.is_module_name_busy {
        // SAFETY: a NUL-terminated name.
        if unsafe { busy(c"tollgate".as_ptr()) } != 0 {
            return None;
        }
    }
    // SAFETY: `ctx` is the load context; the name is NUL-terminated and static.
    unsafe {
        (api.set_module_attribs)(
            ctx,
            c"tollgate".as_ptr(),
            crate::MODULE_VERSION,
            REDISMODULE_APIVER_1,
        )
    };
    let api = API.get_or_init(|| api);
    for command in crate::COMMANDS {
        let [first, last, step] = command.keys;
        // SAFETY: the load context, NUL-terminated static strings, a command function of the
        // declared type.
        let created = unsafe {
            (api.create_command)(
                ctx,
                command.name.as_ptr(),
                dispatch,
                command.flags.as_ptr(),
                first,
                last,
                step,
            )
        };
        if created != REDISMODULE_OK {
            return None;
        }
    }
    let keeping = api.subscribe_to_server_event.is_some_and(|subscribe| {
        // SAFETY: the load context, the event by value, a callback of the declared type.
        unsafe { subscribe(ctx, EVENT_LOADING, loading) == REDISMODULE_OK }
    });
    crate::acquire::module_loaded(keeping);
    Some(())
}

/// Redis loads a data set: the identity kept is forgotten (`acquire.rs`).
unsafe extern "C" fn loading(
    _ctx: *mut RedisModuleCtx,
    _event: RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    crate::acquire::loaded();
}

/// The entry point Redis calls on `MODULE LOAD` / `--loadmodule`.
///
/// # Safety
/// Called by Redis with its load context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut RedisModuleCtx,
    _argv: *mut *mut RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: Redis calls this with its load context.
    match unsafe { init(ctx) } {
        Some(()) => REDISMODULE_OK,
        None => REDISMODULE_ERR,
    }
}

/// A command's context: what a command may do, safely.
pub(crate) struct Ctx {
    ctx: *mut RedisModuleCtx,
    api: &'static Api,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ctx")
    }
}

impl Ctx {
    fn reply_value(&self, value: &Value) {
        match value {
            // SAFETY: `self.ctx` is the live context of the command being run.
            Value::Int(n) => unsafe {
                (self.api.reply_with_long_long)(self.ctx, *n);
            },
            // SAFETY: the live context; the buffer with its length (Redis copies it).
            Value::Bytes(bytes) => unsafe {
                (self.api.reply_with_string_buffer)(self.ctx, bytes.as_ptr().cast(), bytes.len());
            },
            Value::Array(items) => {
                // SAFETY: the live context; exactly `len` replies follow.
                unsafe { (self.api.reply_with_array)(self.ctx, items.len() as c_long) };
                for item in items {
                    self.reply_value(item);
                }
            }
            // SAFETY: the live context.
            Value::Nil => unsafe {
                (self.api.reply_with_null)(self.ctx);
            },
            Value::Error(text) => {
                let text = std::ffi::CString::new(text.replace('\0', " "))
                    .unwrap_or_else(|_| std::ffi::CString::from(c"ERR tollgate"));
                // SAFETY: the live context; a NUL-terminated text.
                unsafe { (self.api.reply_with_error)(self.ctx, text.as_ptr()) };
            }
        }
    }

    /// A string or error reply's bytes, copied.
    fn reply_bytes(&self, reply: *mut RedisModuleCallReply) -> Vec<u8> {
        let mut len = 0usize;
        // SAFETY: `reply` is a live string or error reply of this command.
        let ptr = unsafe { (self.api.call_reply_string_ptr)(reply, &mut len) };
        if ptr.is_null() {
            return Vec::new();
        }
        // SAFETY: Redis's pointer to `len` bytes, alive with the reply, copied at once.
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }.to_vec()
    }

    /// A call's reply as a value: strings and integers as they are, errors as Error, a nil
    /// (and any other type) as None.
    fn read_reply(&self, reply: *mut RedisModuleCallReply) -> Option<Value> {
        if reply.is_null() {
            return None;
        }
        // SAFETY: `reply` is a live reply of this command (auto memory frees it when the
        // command returns), as is every element read below.
        let kind = unsafe { (self.api.call_reply_type)(reply) };
        match kind {
            REPLY_STRING => Some(Value::Bytes(self.reply_bytes(reply))),
            REPLY_ERROR => Some(Value::Error(
                String::from_utf8_lossy(&self.reply_bytes(reply)).into_owned(),
            )),
            // SAFETY: an integer reply, live.
            REPLY_INTEGER => Some(Value::Int(unsafe { (self.api.call_reply_integer)(reply) })),
            REPLY_ARRAY => {
                // SAFETY: an array reply, live.
                let len = unsafe { (self.api.call_reply_length)(reply) };
                let items = (0..len)
                    .map(|i| {
                        // SAFETY: an index below the array's length.
                        let element = unsafe { (self.api.call_reply_array_element)(reply, i) };
                        self.read_reply(element).unwrap_or(Value::Nil)
                    })
                    .collect();
                Some(Value::Array(items))
            }
            _ => None,
        }
    }
}

impl Ctx {
    fn string(&self, bytes: &[u8]) -> *mut RedisModuleString {
        // SAFETY: the live context; the buffer with its length (Redis copies it).
        unsafe { (self.api.create_string)(self.ctx, bytes.as_ptr().cast(), bytes.len()) }
    }

    /// A string key's value (Nil when there is none), read in place; None for a key of
    /// another type, which `call` answers as Redis does.
    fn read(&self, keys: &KeyApi, name: &[u8]) -> Option<Value> {
        // SAFETY: the live context and a key name made in it; the key is closed below, and its
        // value copied while it is open (the pointer lives until the key is closed).
        unsafe {
            let key = (keys.open_key)(self.ctx, self.string(name), REDISMODULE_READ);
            if key.is_null() {
                return Some(Value::Nil);
            }
            let value = match (keys.key_type)(key) {
                KEYTYPE_EMPTY => Some(Value::Nil),
                KEYTYPE_STRING => {
                    let mut len = 0usize;
                    let ptr = (keys.string_dma)(key, &mut len, REDISMODULE_READ);
                    Some(Value::Bytes(if ptr.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec()
                    }))
                }
                _ => None,
            };
            (keys.close_key)(key);
            value
        }
    }

    /// `SET name value PX ms` through the key API: the value and its expiry written, then
    /// replicated as the write Redis propagates for that command (`SET ... PXAT` its absolute
    /// expiry). None when the key holds another type, for `call` to run the command.
    fn set_px(&self, keys: &KeyApi, name: &[u8], value: &[u8], ms: &[u8]) -> Option<Value> {
        let ms: c_longlong = std::str::from_utf8(ms)
            .ok()?
            .parse()
            .ok()
            .filter(|ms| *ms > 0)?;
        // SAFETY: the live context, strings made in it; the key is closed before returning;
        // the replicated command's format "bbcl" takes (pointer, length) twice, a C string and
        // a long long, which are passed in that order.
        unsafe {
            let key = (keys.open_key)(
                self.ctx,
                self.string(name),
                REDISMODULE_READ | REDISMODULE_WRITE,
            );
            if key.is_null() {
                return None;
            }
            let kind = (keys.key_type)(key);
            if kind != KEYTYPE_EMPTY && kind != KEYTYPE_STRING {
                (keys.close_key)(key);
                return None;
            }
            let set = (keys.string_set)(key, self.string(value)) == REDISMODULE_OK
                && (keys.set_expire)(key, ms) == REDISMODULE_OK;
            let at = (keys.get_abs_expire)(key);
            (keys.close_key)(key);
            if !set || at < 0 {
                return Some(Value::Error("ERR tollgate: SET through the key API".into()));
            }
            (keys.replicate)(
                self.ctx,
                c"SET".as_ptr(),
                c"bbcl".as_ptr(),
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
                c"PXAT".as_ptr(),
                at,
            );
        }
        Some(Value::Bytes(b"OK".to_vec()))
    }

    /// `name` opened for writing, with its type; None (the key closed) when it holds another
    /// type than a string, for `call` to run the command and answer as Redis does.
    ///
    /// # Safety
    /// The key returned must be closed before the command returns.
    unsafe fn open_string(
        &self,
        keys: &KeyApi,
        name: &[u8],
    ) -> Option<(*mut RedisModuleKey, bool)> {
        // SAFETY: the live context and a key name made in it.
        unsafe {
            let key = (keys.open_key)(
                self.ctx,
                self.string(name),
                REDISMODULE_READ | REDISMODULE_WRITE,
            );
            if key.is_null() {
                return None;
            }
            match (keys.key_type)(key) {
                KEYTYPE_EMPTY => Some((key, false)),
                KEYTYPE_STRING => Some((key, true)),
                _ => {
                    (keys.close_key)(key);
                    None
                }
            }
        }
    }

    /// Replicate `command name` with one more argument as Redis would propagate the command
    /// the module ran: a buffer (`b`) or a long long (`l`).
    fn replicate(&self, keys: &KeyApi, command: &std::ffi::CStr, name: &[u8], arg: Arg<'_>) {
        // SAFETY: the live context; each format takes, in order, what is passed after it:
        // (pointer, length) for "b", a long long for "l".
        unsafe {
            match arg {
                Arg::None => (keys.replicate)(
                    self.ctx,
                    command.as_ptr(),
                    c"b".as_ptr(),
                    name.as_ptr(),
                    name.len(),
                ),
                Arg::Bytes(bytes) => (keys.replicate)(
                    self.ctx,
                    command.as_ptr(),
                    c"bb".as_ptr(),
                    name.as_ptr(),
                    name.len(),
                    bytes.as_ptr(),
                    bytes.len(),
                ),
                Arg::Int(n) => (keys.replicate)(
                    self.ctx,
                    command.as_ptr(),
                    c"bl".as_ptr(),
                    name.as_ptr(),
                    name.len(),
                    n,
                ),
            };
        }
    }

    /// `APPEND name value`: the new length.
    fn append(&self, keys: &KeyApi, name: &[u8], value: &[u8]) -> Option<Value> {
        // SAFETY: the key is closed before returning; the value is written within the length
        // the key was grown to, through the pointer Redis gives for it.
        let length = unsafe {
            let (key, existing) = self.open_string(keys, name)?;
            let length = if existing {
                let mut len = 0usize;
                (keys.string_dma)(key, &mut len, REDISMODULE_READ);
                let grown = len + value.len();
                if (keys.string_truncate)(key, grown) != REDISMODULE_OK {
                    (keys.close_key)(key);
                    return Some(Value::Error(
                        "ERR tollgate: APPEND through the key API".into(),
                    ));
                }
                let ptr = (keys.string_dma)(key, &mut len, REDISMODULE_WRITE);
                if ptr.is_null() || len != grown {
                    (keys.close_key)(key);
                    return Some(Value::Error(
                        "ERR tollgate: APPEND through the key API".into(),
                    ));
                }
                std::ptr::copy_nonoverlapping(
                    value.as_ptr(),
                    ptr.cast::<u8>().add(grown - value.len()),
                    value.len(),
                );
                grown
            } else {
                (keys.string_set)(key, self.string(value));
                value.len()
            };
            (keys.close_key)(key);
            length
        };
        self.replicate(keys, c"APPEND", name, Arg::Bytes(value));
        Some(Value::Int(i64::try_from(length).unwrap_or(i64::MAX)))
    }

    /// `PEXPIRE name ms` (ms above 0): 1 when the key exists, replicated as `PEXPIREAT`.
    fn pexpire(&self, keys: &KeyApi, name: &[u8], ms: &[u8]) -> Option<Value> {
        let ms: c_longlong = std::str::from_utf8(ms)
            .ok()?
            .parse()
            .ok()
            .filter(|ms| *ms > 0)?;
        // SAFETY: the key is closed before returning.
        let at = unsafe {
            let key = (keys.open_key)(
                self.ctx,
                self.string(name),
                REDISMODULE_READ | REDISMODULE_WRITE,
            );
            if key.is_null() {
                return Some(Value::Int(0));
            }
            if (keys.key_type)(key) == KEYTYPE_EMPTY {
                (keys.close_key)(key);
                return Some(Value::Int(0));
            }
            let set = (keys.set_expire)(key, ms) == REDISMODULE_OK;
            let at = (keys.get_abs_expire)(key);
            (keys.close_key)(key);
            if !set || at < 0 {
                return Some(Value::Error(
                    "ERR tollgate: PEXPIRE through the key API".into(),
                ));
            }
            at
        };
        self.replicate(keys, c"PEXPIREAT", name, Arg::Int(at));
        Some(Value::Int(1))
    }

    /// `DEL name...`: how many existed, each replicated as its own `DEL`.
    fn del(&self, keys: &KeyApi, names: &[&[u8]]) -> Option<Value> {
        let mut deleted = 0;
        for name in names {
            // SAFETY: the key is closed before the next.
            let existed = unsafe {
                let key = (keys.open_key)(
                    self.ctx,
                    self.string(name),
                    REDISMODULE_READ | REDISMODULE_WRITE,
                );
                if key.is_null() {
                    continue;
                }
                let existed = (keys.key_type)(key) != KEYTYPE_EMPTY
                    && (keys.delete_key)(key) == REDISMODULE_OK;
                (keys.close_key)(key);
                existed
            };
            if existed {
                deleted += 1;
                self.replicate(keys, c"DEL", name, Arg::None);
            }
        }
        Some(Value::Int(deleted))
    }

    /// `GETRANGE name from to` (both at least 0): the bytes from `from` to `to`, inclusive.
    fn getrange(&self, keys: &KeyApi, name: &[u8], from: &[u8], to: &[u8]) -> Option<Value> {
        let number =
            |text: &[u8]| -> Option<usize> { std::str::from_utf8(text).ok()?.parse().ok() };
        let (from, to) = (number(from)?, number(to)?);
        match self.read(keys, name)? {
            Value::Bytes(bytes) if from < bytes.len() && from <= to => {
                Some(Value::Bytes(bytes[from..=to.min(bytes.len() - 1)].to_vec()))
            }
            Value::Bytes(_) | Value::Nil => Some(Value::Bytes(Vec::new())),
            other => Some(other),
        }
    }

    /// The reads and writes every decision makes, through the key API rather than as commands
    /// called (each of which costs Redis a client's setup, a command lookup, and a reply
    /// written then parsed): `GET`, `MGET`, `SET ... PX`, `APPEND`, `PEXPIRE`, `DEL` and
    /// `GETRANGE`, answered as those commands answer, their writes replicated as Redis
    /// propagates those commands. None for anything else, which `call` runs as a command.
    fn fast(&self, args: &[&[u8]]) -> Option<Value> {
        let keys = self.api.keys.as_ref()?;
        match args {
            [name, key] if name.eq_ignore_ascii_case(b"GET") => self.read(keys, key),
            [name, rest @ ..] if name.eq_ignore_ascii_case(b"MGET") && !rest.is_empty() => rest
                .iter()
                .map(|key| self.read(keys, key))
                .collect::<Option<Vec<Value>>>()
                .map(Value::Array),
            [name, key, value, px, ms]
                if name.eq_ignore_ascii_case(b"SET") && px.eq_ignore_ascii_case(b"PX") =>
            {
                self.set_px(keys, key, value, ms)
            }
            [name, key, value] if name.eq_ignore_ascii_case(b"APPEND") => {
                self.append(keys, key, value)
            }
            [name, key, ms] if name.eq_ignore_ascii_case(b"PEXPIRE") => self.pexpire(keys, key, ms),
            [name, rest @ ..] if name.eq_ignore_ascii_case(b"DEL") && !rest.is_empty() => {
                self.del(keys, rest)
            }
            [name, key, from, to] if name.eq_ignore_ascii_case(b"GETRANGE") => {
                self.getrange(keys, key, from, to)
            }
            _ => None,
        }
    }
}

impl crate::Redis for Ctx {
    fn time_us(&mut self) -> Option<f64> {
        let mut tv = Timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        // SAFETY: a timeval to fill; no time zone asked.
        if unsafe { gettimeofday(&mut tv, std::ptr::null_mut()) } != 0 {
            return None;
        }
        Some(tv.tv_sec as f64 * 1e6 + tv.tv_usec as f64)
    }

    fn call(&mut self, args: &[&[u8]], write: bool) -> Value {
        if let Some(value) = self.fast(args) {
            return value;
        }
        let Some((name, rest)) = args.split_first() else {
            return Value::Error("ERR tollgate: empty command".into());
        };
        let Ok(name) = std::ffi::CString::new(*name) else {
            return Value::Error("ERR tollgate: command name".into());
        };
        let mut strings: Vec<*mut RedisModuleString> = rest
            .iter()
            // SAFETY: the live context; each buffer with its length (Redis copies it).
            .map(|arg| unsafe {
                (self.api.create_string)(self.ctx, arg.as_ptr().cast(), arg.len())
            })
            .collect();
        // "!": the call's writes are replicated (to replicas and the AOF) as themselves, so
        // a replica replays what was decided, not the decision. "v": the arguments as an
        // array of strings and its length. "E": an error is a reply, not a null.
        let format = if write { c"!vE" } else { c"vE" };
        // SAFETY: the live context; the format's "v" takes the strings' array and its count,
        // which are passed, in that order; the strings live until the command returns.
        let reply = unsafe {
            (self.api.call)(
                self.ctx,
                name.as_ptr(),
                format.as_ptr(),
                strings.as_mut_ptr(),
                strings.len(),
            )
        };
        self.read_reply(reply).unwrap_or(Value::Nil)
    }
}

/// The arguments of a command, as bytes.
fn arguments<'a>(api: &Api, argv: *mut *mut RedisModuleString, argc: c_int) -> Vec<&'a [u8]> {
    (0..usize::try_from(argc).unwrap_or(0))
        .map(|i| {
            let mut len = 0usize;
            // SAFETY: Redis passes `argc` live strings in `argv`, alive while the command runs
            // (the slices do not outlive it: they are dropped before the command returns).
            unsafe {
                let ptr = (api.string_ptr_len)(*argv.add(i), &mut len);
                std::slice::from_raw_parts(ptr.cast::<u8>(), len)
            }
        })
        .collect()
}

/// Runs a command: its context made safe, its reply sent.
///
/// # Safety
/// Called from a command function with Redis's arguments.
unsafe fn run(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    let Some(api) = API.get() else {
        return REDISMODULE_ERR;
    };
    // SAFETY: the command's live context: every string and reply made from here on is freed
    // when the command returns.
    unsafe { (api.auto_memory)(ctx) };
    let args = arguments(api, argv, argc);
    let mut redis = Ctx { ctx, api };
    // Redis calls a command by the name it was registered with, in any case.
    let Some(command) = args.first().and_then(|name| {
        crate::COMMANDS
            .iter()
            .find(|command| command.name.to_bytes().eq_ignore_ascii_case(name))
    }) else {
        return REDISMODULE_ERR;
    };
    let command = command.run;
    // A panic must not unwind into Redis (it would stop the server): it is answered as an
    // error, and nothing after it is written.
    let answered =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| command(&mut redis, &args)))
            .unwrap_or_else(|_| {
                Reply::Value(Value::Error(
                    "ERR tollgate: the module failed deciding this call".into(),
                ))
            });
    match answered {
        Reply::Value(value) => redis.reply_value(&value),
        Reply::WrongArity => {
            // SAFETY: the live context.
            unsafe { (api.wrong_arity)(ctx) };
        }
    }
    REDISMODULE_OK
}

/// Every command's entry point: the command named by its first argument, as registered.
unsafe extern "C" fn dispatch(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: Redis runs this command with its arguments.
    unsafe { run(ctx, argv, argc) }
}
