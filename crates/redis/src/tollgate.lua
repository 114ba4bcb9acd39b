-- Tollgate's decisions inside Redis: one script, one round trip per operation, on Redis's clock.
--
-- This is the decision core (crates/core/src/counter.rs) written again in Lua, because Redis can
-- only run a decision atomically in a script. It must give the same answer as the core for every
-- operation; tests/differential.rs runs random operation sequences through both and compares.
-- All numbers are integers below 2^53 (microseconds, units), exact in Lua's doubles; floor(a / b)
-- is exact for such integers.
--
-- KEYS[1]           the generation hash {born, ver}: detects lost state (G6)
-- acquire: KEYS[3i-1], [3i], [3i+1]  counter i's state, its reservations, its limit's pause
-- commit, renew, pause of a key: KEYS[2], [3]  the counter's state and its reservations
-- pause of a whole limit: KEYS[2]  the limit's pause
-- ARGV[1]           operation: acquire | commit | renew | pause
-- ARGV[2]           the highest generation version this client has seen
-- ARGV[3]           the wake-up channel
-- Every reply is {status, now, ver, born, lost, ...}: the status word, the head, then the rest.
-- then per operation (see each function). A policy is 9 numbers:
--   kind (1 rate, 2 concurrency), limit, period_us, margin_us,
--   algorithm (1 sliding, 2 fixed, 3 gcra), burst, lease_ttl_us, reserve_high, reserve_normal

local SLIDING_BUCKETS_MAX = 64
local RESERVATIONS_TRACKED_MAX = 256
-- The generation hash outlives any counter; its expiry is pushed back every 1024 operations.
-- A namespace idle longer than this (or with fewer operations) starts over and waits one
-- period, as after a loss.
local GEN_TTL_MS = 30 * 24 * 3600 * 1000

local floor = math.floor

local function div_ceil(a, b)
  return floor((a + b - 1) / b)
end

local function sub0(a, b)
  if a > b then return a - b end
  return 0
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function read_policy(argv, at)
  local p = {
    kind = tonumber(argv[at]), limit = tonumber(argv[at + 1]),
    period = tonumber(argv[at + 2]), margin = tonumber(argv[at + 3]),
    alg = tonumber(argv[at + 4]), burst = tonumber(argv[at + 5]),
    ttl = tonumber(argv[at + 6]), res_high = tonumber(argv[at + 7]),
    res_normal = tonumber(argv[at + 8]),
  }
  p.window = p.period + p.margin
  if p.kind == 1 then
    p.emission = div_ceil(p.window, p.limit)
    if p.alg == 3 then p.capacity = p.burst else p.capacity = p.limit end
    if p.alg == 3 then p.memory = p.emission * p.burst else p.memory = p.window end
  else
    p.capacity = p.limit
    p.memory = p.ttl
  end
  return p
end

local function capacity_for(p, priority)
  if priority == 2 then return p.capacity end
  if priority == 1 then return p.capacity - p.res_high end
  return p.capacity - p.res_high - p.res_normal
end

-- Reservations live in a key of their own beside the counter: a string of 24-byte records
-- (seq, units, at as big-endian doubles, exact for integers below 2^53). A grant APPENDs one;
-- records that stop counting are dropped by moving the live offset `ro` (the dead prefix is cut
-- away once it is as long as the cap), so a decision never copies the open reservations. The
-- state keeps `ro`, the live count `rn` and the newest record's time `rl`.
local RECORD = 24

local function record(r, index)
  return struct.unpack('>ddd', r, (index - 1) * RECORD + 1)
end

local function first_reservation_at(c)
  local bytes = redis.call('GETRANGE', c.rk, c.ro, c.ro + RECORD - 1)
  return struct.unpack('>d', bytes, 17)
end

local function live_reservations(c)
  if c.rn == 0 then return '' end
  return redis.call('GETRANGE', c.rk, c.ro, c.ro + c.rn * RECORD - 1)
end

-- Sliding buckets are records too (opened, stamp, units), in field q, with their units' sum in
-- qu, so a decision touches only the first and last bucket unless it must look further.
local function bucket(q, index)
  return struct.unpack('>ddd', q, (index - 1) * RECORD + 1)
end

-- Counter state: p paused_until, s next_seq, ro/rn/rl reservations (see above),
-- k body kind (0 empty, 1 sliding, 2 fixed, 3 gcra, 4 leases), q and qu sliding buckets,
-- b the leases {fence, slots, expires_at, ...}, and for fixed
-- w window index, wu window_us, u used; for gcra t tat, e emission_us, l last_seq.
local function fresh(now, hold_until)
  local c = { p = 0, s = now, ro = 0, rn = 0, rl = 0, k = 0, q = '', qu = 0, b = {}, w = 0, wu = 0, u = 0, t = 0, e = 0, l = 0 }
  if hold_until and hold_until > now then
    c.p = hold_until
    c.s = hold_until
  end
  return c
end

local function load(key, reservations_key, now, gen, p)
  local raw = redis.call('GET', key)
  local c
  if raw then
    c = cmsgpack.unpack(raw)
  else
    c = fresh(now, gen.born + p.memory)
    -- Records without their counter (the counter key was evicted) describe nothing now.
    redis.call('DEL', reservations_key)
  end
  c.rk = reservations_key
  return c
end

local function units_counted(c, now)
  if c.k == 1 then return c.qu
  elseif c.k == 2 then return c.u
  elseif c.k == 3 then return div_ceil(sub0(c.t, now), c.e)
  end
  return 0
end

local function normalise(c, p, now)
  if p.kind == 1 then
    local window = p.window
    while c.rn > 0 and first_reservation_at(c) + window <= now do
      c.ro = c.ro + RECORD
      c.rn = c.rn - 1
    end
    local used_before = units_counted(c, now)
    if p.alg == 1 and c.k == 1 then
      local q = c.q
      local count = #q / RECORD
      local drop = 0
      while drop < count do
        local _, stamp, units = bucket(q, drop + 1)
        if stamp + window > now then break end
        c.qu = c.qu - units
        drop = drop + 1
      end
      if drop > 0 then c.q = string.sub(q, drop * RECORD + 1) end
    elseif p.alg == 2 and c.k == 2 and c.wu == window then
      local current = floor(now / window)
      if c.w < current then
        c.w = current
        c.u = 0
      end
    elseif p.alg == 3 and c.k == 3 and c.e == p.emission then
      -- nothing expires in a TAT
    else
      c.b = {}
      c.q = ''
      c.qu = 0
      if p.alg == 1 then
        c.k = 1
        if used_before > 0 then
          c.q = struct.pack('>ddd', now, now, used_before)
          c.qu = used_before
        end
      elseif p.alg == 2 then
        c.k = 2
        c.w = floor(now / window)
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
    -- Every record is dead: keep the offset at the end of the string, so save deletes it.
    c.ro = c.ro + c.rn * RECORD
    c.rn = 0
    if c.k == 4 then
      local kept = {}
      for i = 1, #c.b, 3 do
        if c.b[i + 2] > now then
          kept[#kept + 1] = c.b[i]
          kept[#kept + 1] = c.b[i + 1]
          kept[#kept + 1] = c.b[i + 2]
        end
      end
      c.b = kept
    else
      c.k = 4
      c.b = {}
      c.q = ''
      c.qu = 0
    end
  end
end

local function used(c, p, now)
  if c.k == 1 then return c.qu
  elseif c.k == 2 then return c.u
  elseif c.k == 3 then return div_ceil(sub0(c.t, now), p.emission)
  elseif c.k == 4 then
    local sum = 0
    for i = 2, #c.b, 3 do sum = sum + c.b[i] end
    return sum
  end
  return 0
end

local function wait_for_room(c, p, now, cost, open)
  local in_use = used(c, p, now)
  if in_use + cost <= open then return 0 end
  local excess = in_use + cost - open
  if c.k == 1 then
    local freed = 0
    for i = 1, #c.q / RECORD do
      local _, stamp, units = bucket(c.q, i)
      freed = freed + units
      if freed >= excess then return sub0(stamp + p.window, now) end
    end
  elseif c.k == 2 then
    return sub0((c.w + 1) * p.window, now)
  elseif c.k == 3 then
    return sub0(sub0(c.t, (open - cost) * p.emission), now)
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
      if freed >= excess then return sub0(e[1], now) end
    end
  end
  return 0
end

local function counted_until(c, p)
  if c.k == 1 then
    if #c.q == 0 then return 0 end
    local _, stamp = bucket(c.q, #c.q / RECORD)
    return stamp + p.window
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

local function idle_at(c, p)
  local idle = math.max(c.p, c.s)
  if p.kind == 1 and c.rn > 0 then idle = math.max(idle, c.rl + p.window) end
  return math.max(idle, counted_until(c, p))
end

local function reset_after(c, p, now)
  return math.min(sub0(counted_until(c, p), now), p.memory)
end

-- Returns nil when allowed, or {retry_after, remaining, reason (0 capacity, 1 paused)}.
local function check(c, p, now, cost, priority, limit_paused_until)
  local open = capacity_for(p, priority)
  normalise(c, p, now)
  local room_after = wait_for_room(c, p, now, cost, open)
  local pause_until = math.max(c.p, limit_paused_until)
  local pause_after = sub0(pause_until, now)
  if room_after == 0 and pause_after == 0 then return nil end
  local reason = 0
  if pause_after > 0 then reason = 1 end
  return { math.max(room_after, pause_after), sub0(open, used(c, p, now)), reason }
end

local function grant(c, p, now, cost, priority)
  local open = capacity_for(p, priority)
  local seq = math.max(c.s, now)
  c.s = seq + 1
  local lease_expires_at = 0
  local reserved_at = now
  if c.k == 1 then
    local span = 0
    if p.limit > SLIDING_BUCKETS_MAX then span = floor(p.window / SLIDING_BUCKETS_MAX) end
    local n = #c.q / RECORD
    local at = now
    local opened, stamp, units
    if n > 0 then
      opened, stamp, units = bucket(c.q, n)
      at = math.max(stamp, now)
    end
    reserved_at = at
    if n > 0 and at - opened <= span and (span > 0 or at == stamp) then
      c.q = string.sub(c.q, 1, (n - 1) * RECORD) .. struct.pack('>ddd', opened, at, units + cost)
    else
      c.q = c.q .. struct.pack('>ddd', at, at, cost)
    end
    c.qu = c.qu + cost
  elseif c.k == 2 then
    c.u = c.u + cost
  elseif c.k == 3 then
    c.t = math.max(c.t, now) + cost * p.emission
    c.l = seq
  elseif c.k == 4 then
    lease_expires_at = now + p.ttl
    local n = #c.b
    c.b[n + 1] = seq
    c.b[n + 2] = cost
    c.b[n + 3] = lease_expires_at
  end
  if p.kind == 1 then
    if c.rn == 0 and c.ro > 0 then
      redis.call('DEL', c.rk)
      c.ro = 0
    end
    if c.rn >= RESERVATIONS_TRACKED_MAX then
      c.ro = c.ro + RECORD
      c.rn = c.rn - 1
    end
    redis.call('APPEND', c.rk, struct.pack('>ddd', seq, cost, reserved_at))
    c.rn = c.rn + 1
    c.rl = reserved_at
    if c.ro >= RESERVATIONS_TRACKED_MAX * RECORD then
      redis.call('SET', c.rk, live_reservations(c))
      c.ro = 0
    end
  end
  return { seq, sub0(open, used(c, p, now)), reset_after(c, p, now), lease_expires_at }
end

local function save(key, c, p, now)
  local idle = idle_at(c, p)
  local reservations_key = c.rk
  c.rk = nil
  if c.rn == 0 and c.ro > 0 then
    redis.call('DEL', reservations_key)
    c.ro = 0
  end
  if idle <= now then
    redis.call('DEL', key, reservations_key)
  else
    local ttl = div_ceil(idle - now, 1000) + 1
    redis.call('SET', key, cmsgpack.pack(c), 'PX', ttl)
    if c.rn > 0 then redis.call('PEXPIRE', reservations_key, ttl) end
  end
  c.rk = reservations_key
end

-- The generation: {born, ver}. A missing hash, or a version below what this client has seen,
-- means Redis lost state (restart without persistence, flush, failover to a stale replica):
-- start a new generation born now, so every counter created before born + memory waits (G6).
local function generation(key, now, seen)
  -- ver before this call is ver - 1; below what the client saw means a stale replica.
  local ver = redis.call('HINCRBY', key, 'ver', 1)
  local born = tonumber(redis.call('HGET', key, 'born'))
  local lost = 0
  if born == nil or ver <= seen then
    born = now
    ver = seen + 1
    lost = 1
    redis.call('HSET', key, 'born', born, 'ver', ver)
    redis.call('PEXPIRE', key, GEN_TTL_MS)
  elseif ver % 1024 == 0 then
    -- Keep the expiry ahead without a write on every call.
    redis.call('PEXPIRE', key, GEN_TTL_MS)
  end
  return { born = born, ver = ver, lost = lost }
end

local function limit_paused_until(key, now)
  local value = redis.call('GET', key)
  if value then return tonumber(value) end
  return 0
end

local function wake(channel, counter_key)
  redis.call('PUBLISH', channel, counter_key)
end

local op, seen, channel = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local now = now_us()
local gen = generation(KEYS[1], now, seen)
local head = { now, gen.ver, gen.born, gen.lost }

if op == 'acquire' then
  -- ARGV: 4 cost, 5 priority (0 low, 1 normal, 2 high), 6 n, then n policies
  local cost, priority, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local counters, policies, outcomes = {}, {}, {}
  local all_allowed = true
  for i = 1, n do
    local p = read_policy(ARGV, 7 + (i - 1) * 9)
    local open = capacity_for(p, priority)
    if cost < 1 or cost > open then
      return { 'cost', head[1], head[2], head[3], head[4], i, open }
    end
    local c = load(KEYS[3 * i - 1], KEYS[3 * i], now, gen, p)
    local denial = check(c, p, now, cost, priority, limit_paused_until(KEYS[3 * i + 1], now))
    counters[i], policies[i] = c, p
    if denial then
      all_allowed = false
      outcomes[i] = { 2, denial[1], denial[2], denial[3], 0 }
    else
      outcomes[i] = { 1, 0, sub0(open, used(c, p, now)), 0, 0 }
    end
  end
  if all_allowed then
    for i = 1, n do
      local g = grant(counters[i], policies[i], now, cost, priority)
      outcomes[i] = { 0, g[1], g[2], g[3], g[4] }
      save(KEYS[3 * i - 1], counters[i], policies[i], now)
    end
  else
    -- Normalising may have dropped expired state; keep the store as small as the core's.
    for i = 1, n do save(KEYS[3 * i - 1], counters[i], policies[i], now) end
  end
  local reply = { 'ok', head[1], head[2], head[3], head[4] }
  for i = 1, n do
    for j = 1, 5 do reply[#reply + 1] = outcomes[i][j] end
  end
  return reply
end

if op == 'commit' then
  -- ARGV: 4..12 policy, 13 seq, 14 used. Reply: ok now ver born lost refunded released
  local p = read_policy(ARGV, 4)
  local seq, used_units = tonumber(ARGV[13]), tonumber(ARGV[14])
  local raw = redis.call('GET', KEYS[2])
  if not raw then
    -- Forgotten counters were idle: nothing they granted still counts.
    if p.kind == 2 then return { 'ok', head[1], head[2], head[3], head[4], 0, 0 } end
    return { 'gone', head[1], head[2], head[3], head[4] }
  end
  local c = cmsgpack.unpack(raw)
  c.rk = KEYS[3]
  if seq >= c.s then return { 'unknown', head[1], head[2], head[3], head[4] } end
  normalise(c, p, now)
  if c.k == 4 then
    local released = 0
    for i = 1, #c.b, 3 do
      if c.b[i] == seq then
        released = c.b[i + 1]
        -- swap_remove: the last lease moves into this place
        local n = #c.b
        c.b[i], c.b[i + 1], c.b[i + 2] = c.b[n - 2], c.b[n - 1], c.b[n]
        c.b[n], c.b[n - 1], c.b[n - 2] = nil, nil, nil
        break
      end
    end
    save(KEYS[2], c, p, now)
    if released > 0 then wake(channel, KEYS[2]) end
    return { 'ok', head[1], head[2], head[3], head[4], 0, released }
  end
  local index = nil
  local units, at
  local live = live_reservations(c)
  for i = 1, c.rn do
    local record_seq, record_units, record_at_us = record(live, i)
    if record_seq == seq then
      index, units, at = i, record_units, record_at_us
      break
    end
  end
  if not index then
    save(KEYS[2], c, p, now)
    return { 'gone', head[1], head[2], head[3], head[4] }
  end
  if used_units > units then return { 'used_above_cost', head[1], head[2], head[3], head[4], units } end
  live = string.sub(live, 1, (index - 1) * RECORD) .. string.sub(live, index * RECORD + 1)
  c.rn = c.rn - 1
  c.ro = 0
  if c.rn > 0 then
    redis.call('SET', c.rk, live)
    local _, _, newest_at = record(live, c.rn)
    c.rl = newest_at
  else
    redis.call('DEL', c.rk)
  end
  local give_back = units - used_units
  local refunded = 0
  if c.k == 1 then
    -- The bucket that holds the reservation: the last one opened at or before it.
    for i = #c.q / RECORD, 1, -1 do
      local opened, stamp, units = bucket(c.q, i)
      if opened <= at then
        if stamp >= at then
          refunded = math.min(give_back, units)
          local before = string.sub(c.q, 1, (i - 1) * RECORD)
          local after = string.sub(c.q, i * RECORD + 1)
          if units - refunded > 0 then
            c.q = before .. struct.pack('>ddd', opened, stamp, units - refunded) .. after
          else
            c.q = before .. after
          end
          c.qu = c.qu - refunded
        end
        break
      end
    end
  elseif c.k == 2 then
    if floor(at / p.window) == c.w then
      refunded = math.min(give_back, c.u)
      c.u = c.u - refunded
    end
  elseif c.k == 3 then
    if c.l == seq then
      c.t = sub0(c.t, give_back * p.emission)
      refunded = give_back
    end
  end
  save(KEYS[2], c, p, now)
  if refunded > 0 then wake(channel, KEYS[2]) end
  return { 'ok', head[1], head[2], head[3], head[4], refunded, 0 }
end

if op == 'renew' then
  -- ARGV: 4..12 policy, 13 fence. Reply: ok now ver born lost expires_at
  local p = read_policy(ARGV, 4)
  local fence = tonumber(ARGV[13])
  if p.kind ~= 2 then return { 'wrong_kind', head[1], head[2], head[3], head[4] } end
  local raw = redis.call('GET', KEYS[2])
  if not raw then return { 'lease_expired', head[1], head[2], head[3], head[4] } end
  local c = cmsgpack.unpack(raw)
  c.rk = KEYS[3]
  if fence >= c.s then return { 'unknown', head[1], head[2], head[3], head[4] } end
  normalise(c, p, now)
  for i = 1, #c.b, 3 do
    if c.b[i] == fence then
      c.b[i + 2] = now + p.ttl
      save(KEYS[2], c, p, now)
      return { 'ok', head[1], head[2], head[3], head[4], c.b[i + 2] }
    end
  end
  save(KEYS[2], c, p, now)
  return { 'lease_expired', head[1], head[2], head[3], head[4] }
end

if op == 'pause' then
  -- ARGV: 4..12 policy, 13 duration_us, 14 keyed (1: KEYS[2] is a counter; 0: a limit pause)
  -- Reply: ok now ver born lost paused_until
  local p = read_policy(ARGV, 4)
  local until_us = now + tonumber(ARGV[13])
  if tonumber(ARGV[14]) == 1 then
    local c = load(KEYS[2], KEYS[3], now, gen, p)
    c.p = math.max(c.p, until_us)
    save(KEYS[2], c, p, now)
    return { 'ok', head[1], head[2], head[3], head[4], c.p }
  end
  local current = limit_paused_until(KEYS[2], now)
  if current > until_us then until_us = current end
  redis.call('SET', KEYS[2], until_us, 'PX', div_ceil(until_us - now, 1000) + 1)
  return { 'ok', head[1], head[2], head[3], head[4], until_us }
end

return redis.error_reply('tollgate: unknown operation ' .. tostring(op))
