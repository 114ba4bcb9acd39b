-- Tollgate's decisions inside Redis: one script, one round trip per operation, on Redis's clock.
--
-- This is the decision core (crates/core/src/counter.rs) written again in Lua, because Redis can
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
-- The numbers this script shares with Rust (operations, a policy's kind and algorithm,
-- priorities, outcomes and reasons) are written once, in src/abi.rs: this text names each in
-- capitals between two pairs of underscores, and the store puts the number in before Redis
-- loads the script.
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

-- Every helper is a field of T, and constants are written as literals: the script's body runs
-- on every call, and a local function that captures other locals as upvalues costs far more to
-- create than one that captures T alone.
--   24          bytes of a record: 3 big-endian doubles ('>ddd'). Buckets (opened, stamp,
--               units), reservations (seq, units, at), leases (fence, slots, expires_at).
--   64          SLIDING_BUCKETS_MAX (the core's); 256 RESERVATIONS_TRACKED_MAX (the core's)
--   2592000000  the generation's expiry (30 days, ms), pushed back once a day (its `renew`): a
--               namespace idle longer starts over and waits one period, as after a loss
--   16          a log's expiry is pushed window / 16 past what it needs, so that a grant does
--               not PEXPIRE it every time; a log outlives its counter by at most that
--
-- The counter's value: 'X', the common header '>dddddddddd' (81 bytes with the 'X'), then the
-- body's header by kind, then for leases their records.
--   common: g the birth of the generation it was written in, p paused_until, s next_seq, k body
--     kind (0 empty, 1 sliding, 2 fixed, 3 gcra,
--     4 leases); the reservations log: ro, re its live bytes [ro, re), ra the oldest live one's
--     `at` (-1: not read yet), rl the newest one's `at`, rx the log key's expiry (us); a the
--     counter's cover (until when its limit's key budget counts it, T.cover; 0 none)
--   sliding '>dddddddddd': qu units of every bucket; the newest bucket kept here: lo opened,
--     ls stamp, lu units (0: no bucket at all); older (closed) buckets in the bucket log: qo, qe
--     its live bytes, fs, fu the oldest closed one's stamp and units (fs -1: not read yet), qx
--     its expiry, qw the shortest window any of its records' expiry was reckoned with (so a
--     longer window pushes qx by the difference)
--   fixed '>ddd': w window index, wu window_us, u used. gcra '>ddd': t tat, e emission_us,
--     l last_seq. leases '>d': nb, then nb records.
-- Every record a log holds stops counting before its key's expiry (rx, qx only grow while
-- records are appended), so a log whose expiry has passed holds nothing live.
--
-- A limit's key budget (src/tally.rs, the reference this follows): 'K', then '>dd' g the birth
-- of the generation it was written in and h until when it admits no new key of a request, then
-- '>dd' records (end, count) ascending by end: how many counters of its keys it counts until
-- each cover end. A counter of a key is never written to live past its cover (a); a write that
-- would first has the key admitted (T.cover), so a limit never keeps more counters of keys than
-- its budget.
local T = {}

function T.div_ceil(a, b)
  return math.floor((a + b - 1) / b)
end

function T.sub0(a, b)
  if a > b then return a - b end
  return 0
end

function T.ttl_ms(until_us, now)
  return T.div_ceil(until_us - now, 1000) + 1
end

-- A policy read before is known by its nine numbers' bytes in the packed argument (`packed`,
-- ARGV[1]): `T.policies` keeps at most 1024, from call to call in a function library. A policy
-- is never changed once read.
T.policies, T.policies_n = {}, 0

function T.read_policy(a, at, packed)
  local text = string.sub(packed, 8 * at - 7, 8 * at + 64)
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
  if T.policies_n >= 1024 then T.policies, T.policies_n = {}, 0 end
  T.policies[text] = p
  T.policies_n = T.policies_n + 1
  return p
end

function T.capacity_for(p, priority)
  if priority == __PRIORITY_HIGH__ then return p.capacity end
  if priority == __PRIORITY_NORMAL__ then return p.capacity - p.res_high end
  return p.capacity - p.res_high - p.res_normal
end

-- A counter of the three keys from KEYS[j]: `ck` its state, `rk`, `qk` its reservations and
-- bucket log keys. `dirty`: the header must be written back. Every field is made here, in one
-- table of the right size: a table that grows field by field is rebuilt as it grows. The
-- leases' records (`b`) are made by a counter of leases.
function T.empty(KEYS, j, now, born)
  return { ck = KEYS[j], rk = KEYS[j + 1], qk = KEYS[j + 2], g = born,
    p = 0, s = now, k = 0, ro = 0, re = 0, ra = -1, rl = 0, rx = 0, a = 0,
    qu = 0, lo = 0, ls = 0, lu = 0, qo = 0, qe = 0, fs = -1, fu = 0, qx = 0, qw = 0,
    w = 0, wu = 0, u = 0, t = 0, e = 0, l = 0, dirty = true }
end

-- nil when `raw` is not a counter this script wrote (another format, or damaged).
function T.decode(raw, KEYS, j, now)
  if string.byte(raw, 1) ~= 88 or #raw < 81 then return nil end -- 'X'
  local c = T.empty(KEYS, j, now, 0)
  c.dirty = false
  local k, at
  c.g, c.p, c.s, k, c.ro, c.re, c.ra, c.rl, c.rx, c.a, at = struct.unpack('>dddddddddd', raw, 2)
  c.k = k
  if k == 1 then
    c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw, at =
      struct.unpack('>dddddddddd', raw, at)
  elseif k == 2 then
    c.w, c.wu, c.u, at = struct.unpack('>ddd', raw, at)
  elseif k == 3 then
    c.t, c.e, c.l, at = struct.unpack('>ddd', raw, at)
  elseif k == 4 then
    local nb
    nb, at = struct.unpack('>d', raw, at)
    if #raw ~= at - 1 + nb * 24 then return nil end
    local b = {}
    c.b = b
    for _ = 1, nb do
      local fence, slots, expires_at
      fence, slots, expires_at, at = struct.unpack('>ddd', raw, at)
      b[#b + 1] = fence
      b[#b + 1] = slots
      b[#b + 1] = expires_at
    end
  elseif k ~= 0 then
    return nil
  end
  if at ~= #raw + 1 then return nil end
  return c
end

-- One pack for the common kinds ('X' is byte 88).
function T.encode(c)
  local k = c.k
  if k == 1 then
    return struct.pack('>Bdddddddddddddddddddd', 88, c.g, c.p, c.s, k, c.ro, c.re, c.ra, c.rl,
      c.rx, c.a, c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw)
  elseif k == 2 then
    return struct.pack('>Bddddddddddddd', 88, c.g, c.p, c.s, k, c.ro, c.re, c.ra, c.rl, c.rx,
      c.a, c.w, c.wu, c.u)
  elseif k == 3 then
    return struct.pack('>Bddddddddddddd', 88, c.g, c.p, c.s, k, c.ro, c.re, c.ra, c.rl, c.rx,
      c.a, c.t, c.e, c.l)
  end
  local common = struct.pack('>Bdddddddddd', 88, c.g, c.p, c.s, k, c.ro, c.re, c.ra, c.rl, c.rx,
    c.a)
  if k == 4 then
    local b = c.b
    local parts = { common, struct.pack('>d', #b / 3) }
    for i = 1, #b, 3 do parts[#parts + 1] = struct.pack('>ddd', b[i], b[i + 1], b[i + 2]) end
    return table.concat(parts)
  end
  return common
end

-- The counter in `raw` (a GET's answer), or a new one, and until when it must be held. A new
-- counter, one this script cannot read, or one written before the generation began (kept by a
-- replica that may have missed its last writes) counts as lost state: it grants nothing until
-- whatever it may have counted is over. A counter missing after an eviction was seen
-- (gen.seen, T.evictions) may be an evicted one: it is held the same way, from then.
function T.load(raw, KEYS, j, now, gen, p)
  if raw then
    local c = T.decode(raw, KEYS, j, now)
    if c and c.g == gen.born then return c end
    if c then
      c.g = gen.born
      c.dirty = true
      return c, gen.born + p.memory
    end
    return T.empty(KEYS, j, now, gen.born), now + p.memory
  end
  return T.empty(KEYS, j, now, gen.born), math.max(gen.born, gen.seen) + p.memory
end

-- Hold a counter until `hold_until`: a pause it already had that ends later stays.
function T.hold(c, now, hold_until)
  if hold_until > now then
    c.p = math.max(c.p, hold_until)
    c.s = math.max(c.s, hold_until)
  end
  return c
end

-- Append a record to a log, keeping its key's expiry at least `until_us` (pushed `slack`
-- further). Returns the new live range and expiry. A key that is not what the counter says
-- (expired, evicted, or left by an older counter of the same name) starts over with the record.
function T.log_append(key, lo, hi, expiry, record, until_us, slack, now)
  local length = redis.call('APPEND', key, record)
  if length ~= hi + 24 then
    redis.call('SET', key, record, 'PX', T.ttl_ms(until_us + slack, now))
    return 0, 24, until_us + slack, true
  end
  if hi == 0 or expiry < until_us then
    expiry = until_us + slack
    redis.call('PEXPIRE', key, T.ttl_ms(expiry, now))
  end
  return lo, length, expiry, false
end

-- Replace a log's live records with `records` (moved to the start of the key).
function T.log_rewrite(key, records, expiry, now)
  if #records == 0 or expiry <= now then
    redis.call('DEL', key)
    return 0, 0, 0
  end
  redis.call('SET', key, records, 'PX', T.ttl_ms(expiry, now))
  return 0, #records, expiry
end

function T.log_read(key, lo, hi)
  if hi <= lo then return '' end
  return redis.call('GETRANGE', key, lo, hi - 1)
end

-- Closed buckets whose log was lost before they expired (eviction): they are kept as one
-- bucket that counts their units until the log would have expired, which is at least as long
-- as any of them counted.
function T.repair_buckets(c, p, now)
  local units = c.qu - c.lu
  local stamp = c.qx - p.window
  local record = struct.pack('>ddd', stamp, stamp, units)
  redis.call('SET', c.qk, record, 'PX', T.ttl_ms(c.qx, now))
  c.qo, c.qe, c.fs, c.fu = 0, 24, stamp, units
  c.dirty = true
  return record
end

-- The closed buckets' records, read whole (a denial's retry time, a refund).
function T.closed_buckets(c, p, now)
  local records = T.log_read(c.qk, c.qo, c.qe)
  if #records ~= c.qe - c.qo then return T.repair_buckets(c, p, now) end
  return records
end

function T.units_counted(c, now)
  if c.k == 1 then return c.qu
  elseif c.k == 2 then return c.u
  elseif c.k == 3 then return T.div_ceil(T.sub0(c.t, now), c.e)
  end
  return 0
end

function T.clear_reservations(c)
  if c.re > c.ro then c.dirty = true end
  c.ro, c.re, c.ra = c.re, c.re, -1
end

function T.clear_closed(c)
  if c.qe > c.qo then c.dirty = true end
  c.qu = c.lu
  c.qo, c.qe, c.fs, c.fu = c.qe, c.qe, -1, 0
end

function T.normalise(c, p, now)
  if p.kind == __KIND_RATE__ then
    local window = p.window
    if c.re > c.ro and now >= c.rx then T.clear_reservations(c) end
    while c.re > c.ro do
      local at = c.ra
      if at < 0 then
        local bytes = redis.call('GETRANGE', c.rk, c.ro + 16, c.ro + 23)
        if #bytes ~= 8 then
          -- The log is gone (evicted): its reservations can no longer be committed.
          T.clear_reservations(c)
          break
        end
        at = struct.unpack('>d', bytes)
        c.ra = at
        c.dirty = true
      end
      if at + window > now then break end
      c.ro = c.ro + 24
      c.ra = -1
      c.dirty = true
    end
    if p.alg == __ALG_SLIDING__ and c.k == 1 then
      if c.qe > c.qo and p.window > c.qw and now < c.qx then
        -- The limit's window grew: the closed buckets count longer, so must their log.
        c.qx = c.qx + p.window - c.qw
        c.qw = p.window
        redis.call('PEXPIRE', c.qk, T.ttl_ms(c.qx, now))
        c.dirty = true
      end
      if c.qe > c.qo and now >= c.qx then T.clear_closed(c) end
      while c.qe > c.qo do
        if c.fs < 0 then
          local bytes = redis.call('GETRANGE', c.qk, c.qo + 8, c.qo + 23)
          if #bytes ~= 16 then
            T.repair_buckets(c, p, now)
          else
            c.fs, c.fu = struct.unpack('>dd', bytes)
          end
          c.dirty = true
        end
        if c.fs + window > now then break end
        c.qu = c.qu - c.fu
        c.qo = c.qo + 24
        c.fs, c.fu = -1, 0
        c.dirty = true
      end
      if c.lu > 0 and c.qe == c.qo and c.ls + window <= now then
        c.qu, c.lo, c.ls, c.lu = 0, 0, 0, 0
        c.dirty = true
      end
    elseif p.alg == __ALG_FIXED__ and c.k == 2 and c.wu == window then
      local current = math.floor(now / window)
      if c.w < current then
        c.w = current
        c.u = 0
        c.dirty = true
      end
    elseif p.alg == __ALG_GCRA__ and c.k == 3 and c.e == p.emission then
      -- nothing expires in a TAT
    else
      local used_before = T.units_counted(c, now)
      c.dirty = true
      c.b = {}
      if c.qe > 0 then redis.call('DEL', c.qk) end
      c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw = 0, 0, 0, 0, 0, 0, -1, 0, 0, 0
      if p.alg == __ALG_SLIDING__ then
        c.k = 1
        if used_before > 0 then
          c.lo, c.ls, c.lu, c.qu = now, now, used_before, used_before
        end
      elseif p.alg == __ALG_FIXED__ then
        c.k = 2
        c.w = math.floor(now / window)
        c.wu = window
        c.u = used_before
      else
        c.k = 3
        c.t = now + used_before * p.emission
        c.e = p.emission
        c.l = 0
      end
    end
  else
    T.clear_reservations(c)
    if c.k == 4 then
      local b, kept = c.b, {}
      for i = 1, #b, 3 do
        if b[i + 2] > now then
          kept[#kept + 1] = b[i]
          kept[#kept + 1] = b[i + 1]
          kept[#kept + 1] = b[i + 2]
        end
      end
      if #kept < #b then
        c.b = kept
        c.dirty = true
      end
    else
      if c.qe > 0 then redis.call('DEL', c.qk) end
      c.k = 4
      c.b = {}
      c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw = 0, 0, 0, 0, 0, 0, -1, 0, 0, 0
      c.dirty = true
    end
  end
end

function T.used(c, p, now)
  if c.k == 1 then return c.qu
  elseif c.k == 2 then return c.u
  elseif c.k == 3 then return T.div_ceil(T.sub0(c.t, now), p.emission)
  elseif c.k == 4 then
    local sum = 0
    for i = 2, #c.b, 3 do sum = sum + c.b[i] end
    return sum
  end
  return 0
end

function T.wait_for_room(c, p, now, cost, open)
  local in_use = T.used(c, p, now)
  if in_use + cost <= open then return 0 end
  local excess = in_use + cost - open
  if c.k == 1 then
    local freed = 0
    local records = T.closed_buckets(c, p, now)
    for at = 9, #records, 24 do
      local stamp, units = struct.unpack('>dd', records, at)
      freed = freed + units
      if freed >= excess then return T.sub0(stamp + p.window, now) end
    end
    return T.sub0(c.ls + p.window, now)
  elseif c.k == 2 then
    return T.sub0((c.w + 1) * p.window, now)
  elseif c.k == 3 then
    return T.sub0(T.sub0(c.t, (open - cost) * p.emission), now)
  elseif c.k == 4 then
    local expiries = {}
    for i = 1, #c.b, 3 do expiries[#expiries + 1] = { c.b[i + 2], c.b[i + 1] } end
    table.sort(expiries, function(x, y)
      if x[1] ~= y[1] then return x[1] < y[1] end
      return x[2] < y[2]
    end)
    local freed = 0
    for _, e in ipairs(expiries) do
      freed = freed + e[2]
      if freed >= excess then return T.sub0(e[1], now) end
    end
  end
  return 0
end

function T.counted_until(c, p)
  if c.k == 1 then
    if c.lu == 0 then return 0 end
    return c.ls + p.window
  elseif c.k == 2 then
    if c.u == 0 then return 0 end
    return (c.w + 1) * c.wu
  elseif c.k == 3 then return c.t
  elseif c.k == 4 then
    local latest = 0
    for i = 3, #c.b, 3 do if c.b[i] > latest then latest = c.b[i] end end
    return latest
  end
  return 0
end

function T.idle_at(c, p)
  local idle = math.max(c.p, c.s, c.keep or 0)
  if p.kind == __KIND_RATE__ and c.re > c.ro then idle = math.max(idle, c.rl + p.window) end
  return math.max(idle, T.counted_until(c, p))
end

-- Returns nil when allowed, or {retry_after, remaining, reason (capacity or paused; the caller
-- tells a hold after a loss apart, recovering), left (capacity: the units left to every
-- priority, as the core's Denial.left; else 0)}.
function T.check(c, p, now, cost, priority, limit_paused_until)
  local open = T.capacity_for(p, priority)
  T.normalise(c, p, now)
  local room_after = T.wait_for_room(c, p, now, cost, open)
  local pause_after = T.sub0(math.max(c.p, limit_paused_until), now)
  if room_after == 0 and pause_after == 0 then return nil end
  local used = T.used(c, p, now)
  if pause_after > 0 then
    return { math.max(room_after, pause_after), T.sub0(open, used), __REASON_PAUSED__, 0 }
  end
  return { room_after, T.sub0(open, used), __REASON_CAPACITY__, T.sub0(p.capacity, used) }
end

-- `record` 0: a final grant (the core's grant_final), whose permit is never committed: no
-- reservation is recorded, so the grant touches neither the reservations log nor its cap.
function T.grant(c, p, now, cost, priority, record)
  local open = T.capacity_for(p, priority)
  local seq = math.max(c.s, now)
  c.s = seq + 1
  c.dirty = true
  local lease_expires_at = 0
  local reserved_at = now
  local slack = math.floor(p.window / 16)
  if c.k == 1 then
    local span = 0
    if p.limit > 64 then span = math.floor(p.window / 64) end
    local at = now
    if c.lu > 0 then at = math.max(c.ls, now) end
    reserved_at = at
    -- lo <= ls <= at: with a span of 0 a grant joins the newest bucket only at its instant.
    if c.lu > 0 and at - c.lo <= span then
      c.ls = at
      c.lu = c.lu + cost
    else
      if c.lu > 0 then
        -- The newest bucket is closed: it moves to the log.
        local first = c.qe == c.qo
        local lost_units, lost_until = c.qu - c.lu, c.qx
        local record = struct.pack('>ddd', c.lo, c.ls, c.lu)
        local restarted
        c.qo, c.qe, c.qx, restarted = T.log_append(c.qk, c.qo, c.qe, c.qx, record,
          c.ls + p.window, slack, now)
        if first or restarted then c.fs, c.fu = c.ls, c.lu end
        if first or restarted then
          c.qw = p.window
        else
          c.qw = math.min(c.qw, p.window)
        end
        if restarted and not first then
          -- The log was lost (evicted) with live buckets: count them as one until it would
          -- have expired, which is at least as long as any of them counted.
          local stamp = lost_until - p.window
          c.qx = math.max(c.qx, lost_until)
          redis.call('SET', c.qk, struct.pack('>ddd', stamp, stamp, lost_units) .. record, 'PX',
            T.ttl_ms(c.qx, now))
          c.qo, c.qe, c.fs, c.fu = 0, 2 * 24, stamp, lost_units
        end
      end
      c.lo, c.ls, c.lu = at, at, cost
    end
    c.qu = c.qu + cost
  elseif c.k == 2 then
    c.u = c.u + cost
  elseif c.k == 3 then
    c.t = math.max(c.t, now) + cost * p.emission
    c.l = seq
  elseif c.k == 4 then
    lease_expires_at = now + p.ttl
    local b = c.b
    local n = #b
    b[n + 1] = seq
    b[n + 2] = cost
    b[n + 3] = lease_expires_at
  end
  if p.kind == __KIND_RATE__ and record == 1 then
    if c.re - c.ro >= 256 * 24 then
      -- The oldest is forgotten (its units stay counted), as in the core.
      c.ro = c.ro + 24
      c.ra = -1
    end
    local first = c.re == c.ro
    local restarted
    c.ro, c.re, c.rx, restarted = T.log_append(c.rk, c.ro, c.re, c.rx,
      struct.pack('>ddd', seq, cost, reserved_at), reserved_at + p.window, slack, now)
    if first or restarted then c.ra = reserved_at end
    c.rl = reserved_at
  end
  return seq, T.sub0(open, T.used(c, p, now)),
    math.min(T.sub0(T.counted_until(c, p), now), p.memory), lease_expires_at
end

-- Write the counter back with its expiry (when it goes idle), or delete it if it already is.
-- Nothing is written when nothing changed: its expiry is still right. Logs whose dead prefix
-- has grown to a full log are moved back to the start of their key.
function T.save(c, p, now)
  if not c.dirty then return end
  local idle = T.idle_at(c, p)
  if idle <= now then
    redis.call('DEL', c.ck, c.rk, c.qk)
    return
  end
  if c.re == c.ro then
    if c.re > 0 then
      redis.call('DEL', c.rk)
      c.ro, c.re, c.rx, c.ra = 0, 0, 0, -1
    end
  elseif c.ro >= 256 * 24 then
    c.ro, c.re, c.rx = T.log_rewrite(c.rk, T.log_read(c.rk, c.ro, c.re), c.rx, now)
  end
  if c.k == 1 then
    if c.qe == c.qo then
      if c.qe > 0 then
        redis.call('DEL', c.qk)
        c.qo, c.qe, c.qx, c.fs, c.fu = 0, 0, 0, -1, 0
      end
    elseif c.qo >= 64 * 24 then
      c.qo, c.qe, c.qx = T.log_rewrite(c.qk, T.closed_buckets(c, p, now), c.qx, now)
    end
  end
  redis.call('SET', c.ck, T.encode(c), 'PX', T.ttl_ms(idle, now))
end

-- The longest one write can make a counter of `p` live, its logs included (tally.rs span_us).
function T.span(p)
  return math.max(p.window, p.memory) + math.floor(p.window / 16) + 2000
end

-- Until when counter `c` may live once written: its idle time, its logs' slack and the rounding
-- of an expiry to milliseconds; `from_now`: the operation may also make it count from now (a
-- grant, a renewal, or normalising it into another kind after its limit changed).
function T.need(c, p, now, from_now)
  local need = T.idle_at(c, p) + math.floor(p.window / 16) + 2000
  if from_now then need = math.max(need, now + T.span(p)) end
  return need
end

-- The cover given at `now` to a counter that must live until `need` (tally.rs cover_end).
function T.cover_end(now, need, span)
  local target = math.max(need, now + 2 * span)
  local grid = T.div_ceil(span, 2)
  while target - now > 8 * grid do grid = grid * 2 end
  return T.div_ceil(target, grid) * grid
end

-- Ask a limit's key budget, `raw` as read from `key` (tally.rs Tally::admit), for a counter
-- whose cover is `old` (alive past now: the key moves, never refused) to live until `need`.
-- Returns 'ok' and the cover's end; 'keys' and the budget (a new key, the budget full); or
-- 'held' and its end (a new key of a request, `honour_hold` 1, while the budget may have lost
-- counts of counters alive: found missing or written in an older generation, when it can be
-- lost apart from them (`apart` 1, a cluster) or after an eviction). A refusal writes nothing.
function T.admit(key, raw, now, gen, p, old, need, budget, apart, honour_hold)
  local span = T.span(p)
  local g, h
  local ends, counts, counted = {}, {}, 0
  if raw and string.sub(raw, 1, 1) == 'K' and #raw >= 17 and (#raw - 17) % 16 == 0 then
    g, h = struct.unpack('>dd', raw, 2)
    for at = 18, #raw, 16 do
      local e, n = struct.unpack('>dd', raw, at)
      if e > now then
        ends[#ends + 1] = e
        counts[#counts + 1] = n
        counted = counted + n
      end
    end
  end
  local lost_at = 0
  if apart == 1 then lost_at = gen.born end
  if g == nil then
    h = math.max(lost_at, gen.seen) + 3 * span
  elseif g ~= gen.born then
    h = math.max(h, lost_at + 3 * span)
  end
  if old > now then
    for i = 1, #ends do
      if ends[i] == old then
        counts[i] = counts[i] - 1
        break
      end
    end
  else
    if honour_hold == 1 and h > now then return 'held', h end
    if counted >= budget then return 'keys', budget end
  end
  local e = T.cover_end(now, need, span)
  local parts, placed = { 'K', struct.pack('>dd', gen.born, h) }, false
  for i = 1, #ends do
    if not placed and e <= ends[i] then
      placed = true
      if e == ends[i] then
        counts[i] = counts[i] + 1
      else
        parts[#parts + 1] = struct.pack('>dd', e, 1)
      end
    end
    if counts[i] > 0 then parts[#parts + 1] = struct.pack('>dd', ends[i], counts[i]) end
  end
  if not placed then parts[#parts + 1] = struct.pack('>dd', e, 1) end
  redis.call('SET', key, table.concat(parts), 'PX',
    T.ttl_ms(math.max(h, e, ends[#ends] or 0), now))
  return 'ok', e
end

function T.read_admission(a, at)
  return { tally = a[at], budget = a[at + 1], carried = a[at + 2], apart = a[at + 3] }
end

-- Counter `c`, of a key, about to be written by an operation (`from_now` as for T.need):
-- if it would live past its cover, its key is admitted first, with the cover end the caller
-- brings or by asking its limit's budget here (`adm`, T.read_admission). Called before the
-- operation writes anything. Returns nil to go on (`c` now covered, and kept a span, so that a
-- retry finds it admitted), or {'admit', cover, need} (the budget is in another slot: the caller
-- asks it, then calls again), {'keys', budget} or {'held', until}.
function T.cover(c, p, now, from_now, adm, gen, KEYS, honour_hold)
  if adm.tally == 0 then return nil end
  local need = T.need(c, p, now, from_now)
  if need <= c.a then return nil end
  local status, value = 'ok', adm.carried
  if adm.carried < 0 then
    status, value = 'held', -adm.carried
  elseif adm.carried < need then
    if adm.tally < 0 then return { 'admit', c.a, need } end
    local key = KEYS[adm.tally]
    status, value = T.admit(key, redis.call('GET', key), now, gen, p, c.a, need, adm.budget,
      adm.apart, honour_hold)
  end
  if status ~= 'ok' then return { status, value } end
  c.a = value
  c.keep = math.min(now + T.span(p), value - 2000)
  c.dirty = true
  return nil
end

-- The reply to a one-counter operation that T.cover stopped: its answer, for counter 1.
function T.uncovered(answer, now, gen)
  local reply = T.head(answer[1], now, gen)
  reply[5], reply[6], reply[7] = 1, answer[2], answer[3]
  return reply
end

-- Which Redis master runs this script: its cluster node id (empty outside a cluster), its run
-- id, which every start of a Redis process draws anew, and its replication id, which it draws
-- anew whenever it becomes a master. Asked once per script engine, which is made again when the
-- library is loaded (a start, a full sync). A master demoted and promoted again without a full
-- sync keeps its old identity, and rightly: it then holds all its new master held.
function T.identity()
  if not T.me then
    local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
    local term = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''
    local node = redis.pcall('CLUSTER', 'MYID')
    if type(node) ~= 'string' then node = '' end
    T.me = node .. '/' .. run_id .. ':' .. term
  end
  return T.me
end

-- The generation: born, renew (doubles) then the owner's identity, in one string read with the
-- call's other keys (`raw`) and written only when it changes: a missing generation (restart
-- without persistence, flush), or one written by another Redis master (a failover, a restart,
-- a slot moved here) means state may be lost: a new generation starts, born now, and every
-- counter not written since (T.load) waits out whatever it may have counted (G6). A reshard
-- loses nothing, but nothing the script can see tells it from a failover to a stale copy.
-- A generation read before is known by its text (`T.generations`, kept by a function library
-- from call to call, at most 1024 of them): read again, it is neither unpacked nor compared.
T.generations, T.generations_n = {}, 0

function T.generation(raw, key, now)
  local me = T.identity()
  local born, renew
  local known = raw and T.generations[raw]
  if known then
    born, renew = known[1], known[2]
  elseif raw and #raw > 16 and string.sub(raw, 17) == me then
    born, renew = struct.unpack('>dd', raw)
    if T.generations_n >= 1024 then T.generations, T.generations_n = {}, 0 end
    T.generations[raw] = { born, renew }
    T.generations_n = T.generations_n + 1
  end
  -- Missing, or written by another master: lost.
  local gen = { born = born, lost = 0, seen = 0 }
  if born == nil then
    gen.lost = 1
    gen.born = now
    renew = 0
  end
  if renew <= now then
    -- Keep the expiry ahead with one write a day.
    redis.call('SET', key, struct.pack('>dd', gen.born, now + 86400000000) .. me, 'PX', 2592000000)
  end
  return gen
end

-- Evictions, for a call that watches them (Redis may evict: its policy is not noeviction).
-- Nothing tells an evicted counter from one that expired idle, so Redis's own count of evicted
-- keys (INFO stats, the node's) is kept per slot, in `key`, with when it was last seen to move
-- (`seen`): a counter found missing is held until `seen` plus what it may have counted
-- (T.load), every counter evicted since having moved the count. Eviction runs before a command,
-- never inside this script, so a count read here covers every key missing here. A record
-- that is missing (never watched here, or itself evicted) is taken as an eviction seen now,
-- unless the node never evicted anything. Kept with one write a day, as the generation is.
-- A few microseconds a call (INFO's text), paid only by a store that watches.
function T.evictions(gen, raw, key, now)
  local count = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')) or -1
  local seen_count, seen, renew
  if raw and #raw == 24 then seen_count, seen, renew = struct.unpack('>ddd', raw) end
  if seen_count == nil then
    seen = now
    if count == 0 then seen = 0 end
    renew = 0
  elseif seen_count ~= count then
    seen = now
    renew = 0
  end
  if renew <= now then
    redis.call('SET', key, struct.pack('>ddd', count, seen, now + 86400000000), 'PX', 2592000000)
  end
  gen.seen = seen
end

-- One counter's queue across the fleet (crates/redis-protocol/src/queue.rs, the reference this
-- follows; the differential tests compare them, and its bounds are put in from there):
-- places of waiting requests, PLACE_BYTES (40) each,
-- '>ddddd' (priority, arrival, id, cost, expires), in rank order: higher priority first, then
-- earlier arrival, then lower id. A request is granted only if its counter has room for its
-- cost plus the costs of every live place ahead of it. A request that does not wait has id
-- NEWCOMER_ID (2^53), after every id a process draws. At most PLACES_MAX (32): a full queue keeps
-- its best. Read only when its key exists: a counter nobody waits for pays one key in the MGET.
function T.queue_read(raw, now)
  local q, expired = {}, false
  if not raw then return q, false end
  for at = 1, #raw - __PLACE_BYTES__ + 1, __PLACE_BYTES__ do
    local pr, ar, id, cost, ex = struct.unpack('>ddddd', raw, at)
    if ex > now then q[#q + 1] = { pr, ar, id, cost, ex } else expired = true end
  end
  return q, expired
end

function T.before(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[3] < b[3]
end

-- The rank of a request of `priority` and `id` ({priority, arrival, id}), and the units the
-- places ahead of it ask for.
function T.queue_rank(q, now, priority, id)
  local rank = { priority, now, id }
  for _, place in ipairs(q) do
    if place[3] == id then rank[2] = place[2] end
  end
  local ahead = 0
  for _, place in ipairs(q) do
    if place[3] ~= id and T.before(place, rank) then ahead = ahead + place[4] end
  end
  return rank, ahead
end

-- Without the place of `id`; whether it had one.
function T.queue_leave(q, id)
  for i, place in ipairs(q) do
    if place[3] == id then
      table.remove(q, i)
      return true
    end
  end
  return false
end

-- The place of a denied waiting request, taken or renewed until now + ttl.
function T.queue_stand(q, rank, cost, now, ttl)
  T.queue_leave(q, rank[3])
  local place = { rank[1], rank[2], rank[3], cost, now + ttl }
  local at = #q + 1
  for i, other in ipairs(q) do
    if T.before(place, other) then
      at = i
      break
    end
  end
  if at > __PLACES_MAX__ then return end
  table.insert(q, at, place)
  if #q > __PLACES_MAX__ then q[#q] = nil end
end

function T.queue_write(key, q, now)
  if #q == 0 then
    redis.call('DEL', key)
    return
  end
  local parts, last = {}, 0
  for i, place in ipairs(q) do
    parts[i] = struct.pack('>ddddd', place[1], place[2], place[3], place[4], place[5])
    if place[5] > last then last = place[5] end
  end
  redis.call('SET', key, table.concat(parts), 'PX', T.ttl_ms(last, now))
end

-- The namespace's wake channel, from the generation's key (`tg:{<tag>}:<namespace>:gen`): for
-- the rare calls that free a place without being told the channel.
function T.wake_channel(generation_key)
  return 'tg:' .. string.match(generation_key, '}:([^:]*):gen$') .. ':wake'
end

function T.head(status, now, gen)
  return { status, now, gen.born, gen.lost }
end

function T.wake(channel, counter_key)
  redis.call('PUBLISH', channel, counter_key)
end

-- acquire: [2] cost, [3] priority, [4] record reservations (1) or grant final (0), [5] n,
-- then per counter 15 numbers: its policy, where its limit's pause is (at KEYS[x] for x >= 1,
-- or -x its end as read by the caller: its key is in another slot), its admission, and where
-- its queue is (KEYS[x]); then the waiter's id (0: the request does not wait) and how long a
-- place it takes lives (us). Reply: ok now born lost, then per counter 5 numbers (outcome
-- granted: seq remaining reset_after lease_expires_at; allowed: _ remaining; denied:
-- retry_after remaining reason left); or cost now born lost i open; or admit now born lost, then
-- (i cover need) for each counter whose key the caller must have admitted in its budget's
-- slot, before anything is written; or keys now born lost i budget.
-- T.acquire decides one: its numbers from a[s] (its cost, [2] above), every key it names at
-- KEYS[x + shift] for the x it gives, its counters' at KEYS[shift + 3i - 1 ..]; `gen` already
-- read (by a batch), or nil: read here with the counters. `packed` is ARGV[1].
function T.acquire(KEYS, a, s, shift, now, gen, watch, packed)
  local cost, priority, record, n = a[s], a[s + 1], a[s + 2], a[s + 3]
  local waiter, place_ttl = a[s + 4 + n * 15], a[s + 5 + n * 15]
  if waiter == 0 then waiter = __NEWCOMER_ID__ end
  local policies, pauses, admissions, queues = {}, {}, {}, {}
  for i = 1, n do
    local at = s + 4 + (i - 1) * 15
    local p = T.read_policy(a, at, packed)
    local open = T.capacity_for(p, priority)
    if cost < 1 or cost > open then
      gen = gen or T.generation(redis.call('GET', KEYS[1]), KEYS[1], now)
      local reply = T.head('cost', now, gen)
      reply[5], reply[6] = i, open
      return reply
    end
    policies[i] = p
    pauses[i] = a[at + 9]
    if pauses[i] >= 1 then pauses[i] = pauses[i] + shift end
    admissions[i] = T.read_admission(a, at + 10)
    if admissions[i].tally >= 1 then admissions[i].tally = admissions[i].tally + shift end
    queues[i] = a[at + 14] + shift
  end
  -- Every counter's header and queue, and the pauses kept here, in one read; with the
  -- generation (and the evictions record) unless a batch read them already.
  local names, first = {}, 0
  if not gen then
    names[1] = KEYS[1]
    first = 1
  end
  for i = 1, n do
    names[first + i] = KEYS[shift + 3 * i - 1]
  end
  for i = 1, n do
    names[first + n + i] = KEYS[queues[i]]
  end
  for i = 1, n do
    if pauses[i] >= 1 then
      names[#names + 1] = KEYS[pauses[i]]
      pauses[i] = #names
    end
  end
  local watching = watch and first == 1
  if watching then names[#names + 1] = KEYS[#KEYS] end
  local values = redis.call('MGET', unpack(names))
  if first == 1 then gen = T.generation(values[1], KEYS[1], now) end
  if watching then T.evictions(gen, values[#names], KEYS[#KEYS], now) end
  local counters = {}
  for i = 1, n do
    local c, hold_until = T.load(values[first + i], KEYS, shift + 3 * i - 1, now, gen,
      policies[i])
    if hold_until then T.hold(c, now, hold_until) end
    counters[i] = c
  end
  -- Keys to admit in another slot's budget: asked of the caller before anything is written.
  local ask
  for i = 1, n do
    local adm, c = admissions[i], counters[i]
    if adm.tally < 0 and adm.carried >= 0 then
      local need = T.need(c, policies[i], now, true)
      if need > c.a and adm.carried < need then
        ask = ask or T.head('admit', now, gen)
        ask[#ask + 1], ask[#ask + 2], ask[#ask + 3] = i, c.a, need
      end
    end
  end
  if ask then return ask end
  -- Made only when needed: most decisions hold nothing and find no queue.
  local held
  for i = 1, n do
    local answer = T.cover(counters[i], policies[i], now, true, admissions[i], gen, KEYS, 1)
    if answer and answer[1] == 'keys' then
      local reply = T.head('keys', now, gen)
      reply[5], reply[6] = i, answer[2]
      return reply
    end
    -- Held after a loss of its budget: recovering, and not written past its cover.
    if answer then
      held = held or {}
      held[i] = answer[2]
    end
  end
  -- The reply, each counter's five numbers written in place.
  local reply = T.head('ok', now, gen)
  local all_allowed = true
  local places, ranks, freed
  for i = 1, n do
    local p, c = policies[i], counters[i]
    local open = T.capacity_for(p, priority)
    local limit_paused_until = -pauses[i]
    if pauses[i] >= 1 then limit_paused_until = tonumber(values[pauses[i]]) or 0 end
    local denial
    if held and held[i] then
      denial = { T.sub0(held[i], now), 0, __REASON_RECOVERING__ }
    else
      denial = T.check(c, p, now, cost, priority, limit_paused_until)
    end
    local raw_queue = values[first + n + i]
    if raw_queue then
      local q, expired = T.queue_read(raw_queue, now)
      local rank, ahead = T.queue_rank(q, now, priority, waiter)
      places, ranks, freed = places or {}, ranks or {}, freed or {}
      places[i], ranks[i], freed[i] = q, rank, expired
      -- Room for itself is not enough: also for every place ahead, or it waits behind them.
      if not denial and ahead > 0 then
        local room
        if cost + ahead > open then
          room = T.wait_for_room(c, p, now, open, open)
        else
          room = T.wait_for_room(c, p, now, cost + ahead, open)
        end
        if room > 0 or cost + ahead > open then
          -- No sooner than those ahead can take it: at least 10 ms when the room is there.
          if room == 0 then room = __QUEUED_RETRY_MIN_US__ end
          denial = { room, T.sub0(open, T.used(c, p, now)), __REASON_QUEUED__ }
        end
      end
    end
    -- Held after a loss (T.load) rather than paused by someone: recovering.
    if denial and denial[3] == __REASON_PAUSED__ and c.p >= limit_paused_until
        and (c.p == gen.born + p.memory or c.p == gen.seen + p.memory) then
      denial[3] = __REASON_RECOVERING__
    end
    local at = 5 * i
    if denial then
      all_allowed = false
      -- A denial no longer for capacity (queued, recovering) carries nothing left.
      local left = 0
      if denial[3] == __REASON_CAPACITY__ then left = denial[4] or 0 end
      reply[at], reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] =
        __OUTCOME_DENIED__, denial[1], denial[2], denial[3], left
    else
      reply[at], reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] =
        __OUTCOME_ALLOWED__, 0, T.sub0(open, T.used(c, p, now)), 0, 0
    end
  end
  if all_allowed then
    for i = 1, n do
      local at = 5 * i
      reply[at] = __OUTCOME_GRANTED__
      reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] =
        T.grant(counters[i], policies[i], now, cost, priority, record)
    end
  end
  -- Denied: normalising may have dropped expired state; keep the store as small as the core's.
  for i = 1, n do
    if not (held and held[i]) then T.save(counters[i], policies[i], now) end
  end
  -- A waiting request denied takes (or renews) its place; granted, it leaves. Places that
  -- expired are dropped, and whoever they held back is woken.
  if waiter < __NEWCOMER_ID__ and not all_allowed then
    places, ranks, freed = places or {}, ranks or {}, freed or {}
  end
  if places then
    for i = 1, n do
      local q, changed = places[i], freed[i]
      if waiter < __NEWCOMER_ID__ and not all_allowed then
        q = q or {}
        ranks[i] = ranks[i] or { priority, now, waiter }
        T.queue_stand(q, ranks[i], cost, now, place_ttl)
        changed = true
      elseif q and T.queue_leave(q, waiter) then
        changed = true
      end
      if changed then T.queue_write(KEYS[queues[i]], q, now) end
      if freed[i] then T.wake(T.wake_channel(KEYS[1]), KEYS[shift + 3 * i - 1]) end
    end
  end
  return reply
end

-- The unpacking format of each count of numbers up to 256, made once.
T.formats = {}

function T.format(count)
  local format = T.formats[count]
  if not format then
    format = '>' .. string.rep('d', count)
    T.formats[count] = format
  end
  return format
end

-- The numbers packed in `packed` (ARGV[1]). A batch's may be thousands: a C function returns
-- its results on Lua's bounded stack, so they are unpacked 256 at a time.
function T.numbers(packed)
  local count = #packed / 8
  if count <= 256 then return { struct.unpack(T.format(count), packed) } end
  local a = {}
  for at = 0, count - 1, 256 do
    local chunk = { struct.unpack(T.format(math.min(256, count - at)), packed, at * 8 + 1) }
    for i = 1, #chunk - 1 do a[at + i] = chunk[i] end
  end
  return a
end

-- One operation: KEYS and ARGV as in the header.
function T.decide(KEYS, ARGV)
  local a = T.numbers(ARGV[1])
  local op = a[1]
  local watch = op >= __OP_WATCH_EVICTIONS__
  if watch then op = op - __OP_WATCH_EVICTIONS__ end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  if op == __OP_BEGIN__ then
    -- begin a new namespace: a generation born at time zero, owned here, unless one exists.
    local set = redis.call('SET', KEYS[1], struct.pack('>dd', 0, now + 86400000000) .. T.identity(),
      'NX', 'PX', 2592000000)
    if set and watch then
      -- Nothing of a new namespace was evicted: its evictions record starts at the count now.
      local count = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')) or -1
      redis.call('SET', KEYS[#KEYS], struct.pack('>ddd', count, 0, now + 86400000000), 'PX',
        2592000000)
    end
    if set then return 1 end
    return 0
  end

  if op == __OP_ACQUIRE__ then return T.acquire(KEYS, a, 2, 0, now, nil, watch, ARGV[1]) end

  if op == __OP_BATCH__ then
    -- a batch of acquires on one slot, decided in order, each all or nothing, at one `now`: [2]
    -- how many, then per acquire: how far its keys are shifted (its own KEYS[x] is
    -- KEYS[x + shift]; KEYS[1], the generation, is shared), how many numbers it has, then its
    -- numbers as an acquire's from its cost. The generation (and the evictions record) is read
    -- once. Reply: one acquire's reply per acquire, in order.
    local names = { KEYS[1] }
    if watch then names[2] = KEYS[#KEYS] end
    local values = redis.call('MGET', unpack(names))
    local gen = T.generation(values[1], KEYS[1], now)
    if watch then T.evictions(gen, values[2], KEYS[#KEYS], now) end
    local replies, at = {}, 3
    for d = 1, a[2] do
      replies[d] = T.acquire(KEYS, a, at + 2, a[at], now, gen, false, ARGV[1])
      at = at + 2 + a[at + 1]
    end
    return replies
  end

  -- The generation and the one key every other operation reads first (a counter's state, or a
  -- limit's pause), with the limit's pause for usage when it is kept here, in one read.
  local names = { KEYS[1], KEYS[2] }
  if op == __OP_USAGE__ and a[15] >= 1 then names[3] = KEYS[a[15]] end
  if watch then names[#names + 1] = KEYS[#KEYS] end
  local values = redis.call('MGET', unpack(names))
  local gen = T.generation(values[1], KEYS[1], now)
  if watch then T.evictions(gen, values[#names], KEYS[#KEYS], now) end
  if op == __OP_LEAVE__ then
    -- a waiting request gives up its place: [2] its id; KEYS[2] the counter's queue, ARGV[2]
    -- the counter's key (the wake-up's message). Reply: ok now born lost
    local q, expired = T.queue_read(values[2], now)
    if T.queue_leave(q, a[2]) or expired then
      T.queue_write(KEYS[2], q, now)
      T.wake(T.wake_channel(KEYS[1]), ARGV[2])
    end
    return T.head('ok', now, gen)
  end

  if op == __OP_ADMIT__ then
    -- admit a key: [2..10] policy, [11] budget, [12] the counter's cover, [13] until when it
    -- must live, [14] honour a hold, [15] apart (as in an admission). Reply: ok now born lost
    -- cover_end, keys now born lost budget, or held now born lost until
    local p = T.read_policy(a, 2, ARGV[1])
    local status, value = T.admit(KEYS[2], values[2], now, gen, p, a[12], a[13], a[11], a[15],
      a[14])
    local reply = T.head(status, now, gen)
    reply[5] = value
    return reply
  end

  -- Every other operation is on one counter: [2..10] its policy, [11..14] its admission, then
  -- its own numbers from [15]. Each may answer admit or keys for counter 1, as acquire does.
  local adm = T.read_admission(a, 11)

  if op == __OP_COMMIT__ then
    -- commit: [15] seq, [16] used. Reply: ok now born lost refunded released
    local p = T.read_policy(a, 2, ARGV[1])
    local seq, used_units, channel = a[15], a[16], ARGV[2]
    local raw = values[2]
    local c = raw and T.decode(raw, KEYS, 2, now)
    if not c then
      -- Forgotten counters were idle: nothing they granted still counts. (One this script
      -- cannot read knows of no permit either.)
      if p.kind == __KIND_CONCURRENCY__ then
        local reply = T.head('ok', now, gen)
        reply[5], reply[6] = 0, 0
        return reply
      end
      return T.head('gone', now, gen)
    end
    if seq >= c.s then return T.head('unknown', now, gen) end
    local uncovered = T.cover(c, p, now, true, adm, gen, KEYS, 0)
    if uncovered then return T.uncovered(uncovered, now, gen) end
    T.normalise(c, p, now)
    if c.k == 4 then
      local released = 0
      local b = c.b
      for i = 1, #b, 3 do
        if b[i] == seq then
          released = b[i + 1]
          -- swap_remove: the last lease moves into this place
          local n = #b
          b[i], b[i + 1], b[i + 2] = b[n - 2], b[n - 1], b[n]
          b[n], b[n - 1], b[n - 2] = nil, nil, nil
          c.dirty = true
          break
        end
      end
      T.save(c, p, now)
      if released > 0 then T.wake(channel, KEYS[2]) end
      local reply = T.head('ok', now, gen)
      reply[5], reply[6] = 0, released
      return reply
    end
    -- Reservations are in seq order: binary search, as the core does.
    local live = T.log_read(c.rk, c.ro, c.re)
    if #live ~= c.re - c.ro then
      T.clear_reservations(c)
      live = ''
    end
    local lo, hi = 1, #live / 24
    local index, units, at
    while lo <= hi do
      local mid = math.floor((lo + hi) / 2)
      local record_seq, record_units, record_at = struct.unpack('>ddd', live, (mid - 1) * 24 + 1)
      if record_seq == seq then
        index, units, at = mid, record_units, record_at
        break
      elseif record_seq < seq then
        lo = mid + 1
      else
        hi = mid - 1
      end
    end
    if not index then
      T.save(c, p, now)
      return T.head('gone', now, gen)
    end
    if used_units > units then
      T.save(c, p, now)
      local reply = T.head('used_above_cost', now, gen)
      reply[5] = units
      return reply
    end
    local count = #live / 24
    if index == 1 then
      c.ro = c.ro + 24
      if count > 1 then c.ra = struct.unpack('>d', live, 24 + 17) else c.ra = -1 end
    else
      live = string.sub(live, 1, (index - 1) * 24) .. string.sub(live, index * 24 + 1)
      c.ro, c.re, c.rx = T.log_rewrite(c.rk, live, c.rx, now)
      c.ra = struct.unpack('>d', live, 17)
      if index == count then c.rl = struct.unpack('>d', live, #live - 7) end
    end
    c.dirty = true
    local give_back = units - used_units
    local refunded = 0
    if c.k == 1 then
      -- The bucket that holds the reservation: the last one opened at or before it.
      if c.lu > 0 and c.lo <= at then
        if c.ls >= at then
          refunded = math.min(give_back, c.lu)
          c.lu = c.lu - refunded
          c.qu = c.qu - refunded
          if c.lu == 0 then
            -- The newest bucket is gone: the newest closed one takes its place.
            local records = T.closed_buckets(c, p, now)
            if #records > 0 then
              c.lo, c.ls, c.lu = struct.unpack('>ddd', records, #records - 24 + 1)
              records = string.sub(records, 1, #records - 24)
              c.qo, c.qe, c.qx = T.log_rewrite(c.qk, records, c.qx, now)
              if #records == 0 then c.fs, c.fu = -1, 0 end
            else
              c.lo, c.ls = 0, 0
            end
          end
        end
      elseif c.qe > c.qo then
        local records = T.closed_buckets(c, p, now)
        for i = #records / 24, 1, -1 do
          local opened, stamp, bucket_units = struct.unpack('>ddd', records, (i - 1) * 24 + 1)
          if opened <= at then
            if stamp >= at then
              refunded = math.min(give_back, bucket_units)
              c.qu = c.qu - refunded
              if bucket_units - refunded > 0 then
                redis.call('SETRANGE', c.qk, c.qo + (i - 1) * 24 + 16,
                  struct.pack('>d', bucket_units - refunded))
                if i == 1 then c.fu = bucket_units - refunded end
              else
                records = string.sub(records, 1, (i - 1) * 24) .. string.sub(records, i * 24 + 1)
                c.qo, c.qe, c.qx = T.log_rewrite(c.qk, records, c.qx, now)
                if i == 1 then c.fs, c.fu = -1, 0 end
              end
            end
            break
          end
        end
      end
    elseif c.k == 2 then
      if math.floor(at / p.window) == c.w then
        refunded = math.min(give_back, c.u)
        c.u = c.u - refunded
      end
    elseif c.k == 3 then
      if c.l == seq then
        c.t = T.sub0(c.t, give_back * p.emission)
        refunded = give_back
      end
    end
    T.save(c, p, now)
    if refunded > 0 then T.wake(channel, KEYS[2]) end
    local reply = T.head('ok', now, gen)
    reply[5], reply[6] = refunded, 0
    return reply
  end

  if op == __OP_RENEW__ then
    -- renew: [15] fence. Reply: ok now born lost expires_at
    local p = T.read_policy(a, 2, ARGV[1])
    local fence = a[15]
    if p.kind ~= __KIND_CONCURRENCY__ then return T.head('wrong_kind', now, gen) end
    local raw = values[2]
    local c = raw and T.decode(raw, KEYS, 2, now)
    if not c then return T.head('lease_expired', now, gen) end
    if fence >= c.s then return T.head('unknown', now, gen) end
    local uncovered = T.cover(c, p, now, true, adm, gen, KEYS, 0)
    if uncovered then return T.uncovered(uncovered, now, gen) end
    T.normalise(c, p, now)
    local b = c.b
    for i = 1, #b, 3 do
      if b[i] == fence then
        b[i + 2] = now + p.ttl
        c.dirty = true
        T.save(c, p, now)
        local reply = T.head('ok', now, gen)
        reply[5] = b[i + 2]
        return reply
      end
    end
    T.save(c, p, now)
    return T.head('lease_expired', now, gen)
  end

  if op == __OP_PAUSE__ then
    -- pause: [15] duration_us, [16] keyed (1: KEYS[2..4] are a counter's; 0: KEYS[2] is a
    -- limit's pause). Reply: ok now born lost paused_until. A key's pause makes or keeps its
    -- counter, so it counts in its limit's budget like a request's.
    local p = T.read_policy(a, 2, ARGV[1])
    local until_us = now + a[15]
    if a[16] == 1 then
      local c, hold_until = T.load(values[2], KEYS, 2, now, gen, p)
      if hold_until then T.hold(c, now, hold_until) end
      if until_us > c.p then
        c.p = until_us
        c.dirty = true
      end
      local uncovered = T.cover(c, p, now, false, adm, gen, KEYS, 0)
      if uncovered then return T.uncovered(uncovered, now, gen) end
      T.save(c, p, now)
      local reply = T.head('ok', now, gen)
      reply[5] = c.p
      return reply
    end
    local current = tonumber(values[2]) or 0
    if current > until_us then until_us = current end
    redis.call('SET', KEYS[2], until_us, 'PX', T.ttl_ms(until_us, now))
    local reply = T.head('ok', now, gen)
    reply[5] = until_us
    return reply
  end

  if op == __OP_RESUME__ then
    -- resume: [15] keyed (as for pause). Reply: ok now born lost lifted (1 when a pause was
    -- on). A hold after a loss of state (until the generation's birth plus the policy's
    -- memory) is not a pause and stays; a counter not kept is not made.
    local p = T.read_policy(a, 2, ARGV[1])
    local reply = T.head('ok', now, gen)
    reply[5] = 0
    if a[15] == 1 then
      if not values[2] then return reply end
      local c, hold_until = T.load(values[2], KEYS, 2, now, gen, p)
      if hold_until then T.hold(c, now, hold_until) end
      local keep = gen.born + p.memory
      if c.p > math.max(now, keep) then reply[5] = 1 end
      if c.p > keep then
        c.p = keep
        c.dirty = true
      end
      local uncovered = T.cover(c, p, now, false, adm, gen, KEYS, 0)
      if uncovered then return T.uncovered(uncovered, now, gen) end
      T.save(c, p, now)
      return reply
    end
    if (tonumber(values[2]) or 0) > now then reply[5] = 1 end
    redis.call('DEL', KEYS[2])
    return reply
  end

  if op == __OP_USAGE__ then
    -- usage, counting nothing: [15] where the limit's pause is (as for acquire). Reply: ok now
    -- born lost used reset_after paused_until held_until (a hold after a loss, as acquire
    -- tells `recovering` apart; 0 when none). A counter is held as acquire would hold it; one
    -- not kept is not made.
    local p = T.read_policy(a, 2, ARGV[1])
    local raw, limit_paused_until = values[2], -a[15]
    if a[15] >= 1 then limit_paused_until = tonumber(values[3]) or 0 end
    local c, hold_until = T.load(raw, KEYS, 2, now, gen, p)
    if hold_until then T.hold(c, now, hold_until) end
    if raw then
      local uncovered = T.cover(c, p, now, true, adm, gen, KEYS, 0)
      if uncovered then return T.uncovered(uncovered, now, gen) end
    end
    T.normalise(c, p, now)
    local reply = T.head('ok', now, gen)
    reply[5] = T.used(c, p, now)
    reply[6] = math.min(T.sub0(T.counted_until(c, p), now), p.memory)
    reply[7] = math.max(c.p, limit_paused_until)
    reply[8] = 0
    if c.p > now and c.p >= limit_paused_until
        and (c.p == gen.born + p.memory or c.p == gen.seen + p.memory) then
      reply[8] = c.p
    end
    -- Normalising may have dropped expired state: keep the store as small as the core's.
    if raw then T.save(c, p, now) end
    return reply
  end

  return redis.error_reply('tollgate: unknown operation ' .. tostring(op))
end

-- Loaded as a function library (FUNCTION LOAD, Redis 7 and later; the client names the function
-- after the script's hash), the helpers above are made once rather than on every call, which
-- is a measurable share of a decision's cost. Run by EVALSHA (older Redis), the chunk runs,
-- and decides, on every call.
if redis.register_function then
  redis.register_function('__TOLLGATE_FUNCTION__', function(keys, args)
    return T.decide(keys, args)
  end)
else
  return T.decide(KEYS, ARGV)
end
