-- Tollgate's decisions inside Redis: one script, one round trip per operation, on Redis's clock.
--
-- This is the decision core (crates/core/src/counter/) written again in Lua, because Redis can
-- only run a decision atomically in a script. It must give the same answer as the core for every
-- operation; src/differential_tests.rs runs random operation sequences through both and compares.
-- All numbers are integers below 2^53 (microseconds, units), exact in Lua's doubles; floor(a / b)
-- is exact for such integers.
--
-- KEYS[1]           the generation (born, renew, owner): detects lost state (G6)
-- acquire: KEYS[3i-1 .. 3i+1]  counter i's state, its reservations and its closed buckets;
--                   after the counters, the limits' pauses and key budgets kept in this slot,
--                   and each counter's queue of waiters across the fleet
-- a batch of acquires: after KEYS[1], each acquire's keys but its generation, one acquire
--                   after another
-- leave a counter's queue: KEYS[2]  the counter's queue
-- commit, renew, pause or resume of a key: KEYS[2], [3], [4]  the counter's three keys, then
--                   its limit's key budget if in this slot
-- usage: KEYS[2], [3], [4] the counter's three keys, then its limit's key budget and its
--                   limit's pause if in this slot
-- pause or resume of a whole limit: KEYS[2]  the limit's pause
-- admit a key: KEYS[2]  the limit's key budget (its tally)
-- begin a new namespace: KEYS[1] only
-- KEYS[#KEYS]       when the call watches evictions (its operation code has 16 added): the
--                   slot's evictions record (T.evictions), after every other key
-- ARGV[1]           the numbers, packed as big-endian doubles (one argument rather than one per
--                   number: each argument costs a Lua string): [1] the operation (acquire,
--                   commit, renew, pause, usage, begin a new namespace, resume, admit a key,
--                   leave a queue, a batch of acquires;
--                   plus __OP_WATCH_EVICTIONS__ when the call watches evictions), then per
--                   operation (see each branch below)
-- Every number this script shares with Rust or gives a meaning (operations, a policy's kind and
-- algorithm, priorities, outcomes and reasons, the layout of its arguments, replies and values,
-- bounds and expiries) is written once, in src/abi.rs: this text names each in capitals between
-- two pairs of underscores, and the store puts the number in before Redis loads the script
-- (the script's first lines list them). A bare number here is 0, 1 or 2, or a field's place
-- in a record (`[at + 4]`); src/abi.rs's tests hold it so.
-- ARGV[2]           commit: the wake-up channel; leave a queue: the counter's key
-- Every reply (a batch's: one per acquire) is {status, now, born, lost, ...}: the status word,
-- the head (the generation's birth, and 1 when this call found the state lost), then the rest
-- per operation (see each branch below).
-- A policy is 9 numbers:
--   kind (rate or concurrency), limit, period_us, margin_us,
--   algorithm (sliding, fixed or gcra), burst, lease_ttl_us, reserve_high, reserve_normal
-- An admission is 4 numbers, after a counter's policy (T.cover): where its limit's key budget
--   is (0 a counter without a key, never admitted; x >= 1 at KEYS[x], this slot; -1 in another
--   slot, asked by the caller), the budget, what the caller brings from it (a cover end; -x:
--   held until x; 0 nothing), and 1 when the budget can be lost apart from its counters (a
--   cluster)
--
-- Cost model (measured in Redis 7.0 with a loop timed by TIME inside a script): every string that
-- enters Lua (a reply, a string.sub, a concatenation, an argument) costs about 2 ns a byte (a
-- 7.7 KB GET 14 us, a 1.5 KB string.sub 2 us), each redis.call about half a microsecond, and
-- each closure the body creates that captures locals of the chunk about 0.15 us. A table of
-- twenty fields, with the collection it later costs, costs about as much as a read
-- (docs/lab.md#the-floor): the body makes as few tables as it can, each at its full size at
-- once (one that grows is rebuilt as it grows). A decision reads and writes a small fixed
-- header and touches records one at a time; lists (sliding buckets, open reservations) live in
-- append-only keys beside it and are read whole only on the paths that need them (a denial's
-- retry time, a commit). A value in a format this script does not know (an older version's)
-- counts as lost state: that counter waits one period (G6).

-- The script is made of parts (src/lua/*.lua), joined in the order src/abi.rs lists them: this
-- one first (T and what every part uses), the entry points (entry.lua) last.
--
-- Every helper is a field of T, and constants are put in as literals: the script's body runs
-- on every call, and a local function that captures other locals as upvalues costs far more to
-- create than one that captures T alone.
local T = {}

function T.div_ceil(a, b)
  return math.floor((a + b - 1) / b)
end

function T.sub0(a, b)
  if a > b then return a - b end
  return 0
end

function T.ttl_ms(until_us, now)
  return T.div_ceil(until_us - now, __US_PER_MS__) + 1
end

-- A policy read before is known by its nine numbers' bytes in the packed argument (`packed`,
-- ARGV[1]): `T.policies` keeps at most CACHE_MAX, from call to call in a function library. A
-- policy is never changed once read.
T.policies, T.policies_n = {}, 0

function T.read_policy(a, at, packed)
  local text = string.sub(packed, __NUMBER_BYTES__ * (at - 1) + 1,
    __NUMBER_BYTES__ * (at - 1 + __POLICY_NUMBERS__))
  local known = T.policies[text]
  if known then return known end
  local p = {
    kind = a[at], limit = a[at + 1], period = a[at + 2], margin = a[at + 3], alg = a[at + 4],
    burst = a[at + 5], ttl = a[at + 6], res_high = a[at + 7], res_normal = a[at + 8],
  }
  p.window = p.period + p.margin
  if p.kind == __KIND_RATE__ then
    p.emission = T.div_ceil(p.window, p.limit)
    if p.alg == __ALG_GCRA__ then p.capacity = p.burst else p.capacity = p.limit end
    if p.alg == __ALG_GCRA__ then p.memory = p.emission * p.burst else p.memory = p.window end
  else
    p.capacity = p.limit
    p.memory = p.ttl
  end
  if T.policies_n >= __CACHE_MAX__ then T.policies, T.policies_n = {}, 0 end
  T.policies[text] = p
  T.policies_n = T.policies_n + 1
  return p
end

function T.capacity_for(p, priority)
  if priority == __PRIORITY_HIGH__ then return p.capacity end
  if priority == __PRIORITY_NORMAL__ then return p.capacity - p.res_high end
  return p.capacity - p.res_high - p.res_normal
end

-- The head of every reply (REPLY_HEAD numbers: status, now, born, lost); what an operation
-- answers follows it, from REPLY_AT.
function T.head(status, now, gen)
  return { status, now, gen.born, gen.lost }
end
