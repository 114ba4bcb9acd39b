-- One counter's decisions, dispatched on its body's kind (the twin of the core's
-- counter/mod.rs): normalising it to its policy (and carrying units across a change of
-- algorithm), what it uses, how long until there is room, check, grant, and writing it back.
-- Each algorithm's arithmetic is in its own part (sliding.lua, fixed.lua, gcra.lua,
-- leases.lua, reservations.lua); a read of one field or two (a fixed window's count, a GCRA
-- backlog) stays here, where a call would cost more than the read.

function T.units_counted(c, now)
  if c.k == __BODY_SLIDING__ then return c.qu
  elseif c.k == __BODY_FIXED__ then return c.u
  elseif c.k == __BODY_GCRA__ then return T.div_ceil(T.sub0(c.t, now), c.e)
  end
  return 0
end

function T.normalise(c, p, now)
  if p.kind == __KIND_RATE__ then
    local window = p.window
    if c.re > c.ro then T.reservations_expire(c, p, now) end
    if p.alg == __ALG_SLIDING__ and c.k == __BODY_SLIDING__ then
      T.sliding_expire(c, p, now)
    elseif p.alg == __ALG_FIXED__ and c.k == __BODY_FIXED__ and c.wu == window then
      T.fixed_roll(c, now, window)
    elseif p.alg == __ALG_GCRA__ and c.k == __BODY_GCRA__ and c.e == p.emission then
      -- nothing expires in a TAT
    else
      local used_before = T.units_counted(c, now)
      c.dirty = true
      c.b = {}
      if c.qe > 0 then redis.call('DEL', c.qk) end
      c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw = 0, 0, 0, 0, 0, 0, -1, 0, 0, 0
      if p.alg == __ALG_SLIDING__ then
        T.sliding_carried(c, now, used_before)
      elseif p.alg == __ALG_FIXED__ then
        T.fixed_carried(c, now, window, used_before)
      else
        T.gcra_carried(c, p, now, used_before)
      end
    end
  else
    T.clear_reservations(c)
    if c.k == __BODY_LEASES__ then
      T.leases_expire(c, now)
    else
      if c.qe > 0 then redis.call('DEL', c.qk) end
      c.k = __BODY_LEASES__
      c.b = {}
      c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw = 0, 0, 0, 0, 0, 0, -1, 0, 0, 0
      c.dirty = true
    end
  end
end

function T.used(c, p, now)
  if c.k == __BODY_SLIDING__ then return c.qu
  elseif c.k == __BODY_FIXED__ then return c.u
  elseif c.k == __BODY_GCRA__ then return T.div_ceil(T.sub0(c.t, now), p.emission)
  elseif c.k == __BODY_LEASES__ then return T.leases_used(c)
  end
  return 0
end

function T.wait_for_room(c, p, now, cost, open)
  local in_use = T.used(c, p, now)
  if in_use + cost <= open then return 0 end
  local excess = in_use + cost - open
  if c.k == __BODY_SLIDING__ then
    return T.sliding_wait_for_room(c, p, now, excess)
  elseif c.k == __BODY_FIXED__ then
    return T.fixed_wait_for_room(c, p, now)
  elseif c.k == __BODY_GCRA__ then
    return T.gcra_wait_for_room(c, p, now, cost, open)
  elseif c.k == __BODY_LEASES__ then
    return T.leases_wait_for_room(c, now, excess)
  end
  return 0
end

function T.counted_until(c, p)
  if c.k == __BODY_SLIDING__ then
    if c.lu == 0 then return 0 end
    return c.ls + p.window
  elseif c.k == __BODY_FIXED__ then
    if c.u == 0 then return 0 end
    return (c.w + 1) * c.wu
  elseif c.k == __BODY_GCRA__ then return c.t
  elseif c.k == __BODY_LEASES__ then return T.leases_counted_until(c)
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
  local slack = math.floor(p.window / __LOG_SLACK_PER_WINDOW__)
  if c.k == __BODY_SLIDING__ then
    reserved_at = T.sliding_grant(c, p, now, cost, slack)
  elseif c.k == __BODY_FIXED__ then
    c.u = c.u + cost
  elseif c.k == __BODY_GCRA__ then
    -- gcra_admit's step: the backlog grows by the cost's emission intervals.
    c.t = math.max(c.t, now) + cost * p.emission
    c.l = seq
  elseif c.k == __BODY_LEASES__ then
    lease_expires_at = now + p.ttl
    T.leases_grant(c, seq, cost, lease_expires_at)
  end
  if p.kind == __KIND_RATE__ and record == 1 then
    T.reservations_record(c, p, now, seq, cost, reserved_at, slack)
  end
  return seq, T.sub0(open, T.used(c, p, now)),
    math.min(T.sub0(T.counted_until(c, p), now), p.memory), lease_expires_at
end

-- Count `units` spent at `now` beyond anything granted, even past the limit (what a vendor
-- counted over a reservation), at most one capacity past it; returns the units counted.
-- Pauses stay as they are; leases count nothing.
function T.debit(c, p, now, units)
  if p.kind ~= __KIND_RATE__ then return 0 end
  T.normalise(c, p, now)
  units = math.min(units, T.sub0(2 * p.capacity, T.used(c, p, now)))
  if units <= 0 then return 0 end
  c.dirty = true
  if c.k == __BODY_SLIDING__ then
    T.sliding_grant(c, p, now, units, math.floor(p.window / __LOG_SLACK_PER_WINDOW__))
  elseif c.k == __BODY_FIXED__ then
    c.u = c.u + units
  elseif c.k == __BODY_GCRA__ then
    c.t = math.max(c.t, now) + units * p.emission
  end
  return units
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
  elseif c.ro >= __RESERVATIONS_TRACKED_MAX__ * __RECORD_BYTES__ then
    c.ro, c.re, c.rx = T.log_rewrite(c.rk, T.log_read(c.rk, c.ro, c.re), c.rx, now)
  end
  if c.k == __BODY_SLIDING__ then
    if c.qe == c.qo then
      if c.qe > 0 then
        redis.call('DEL', c.qk)
        c.qo, c.qe, c.qx, c.fs, c.fu = 0, 0, 0, -1, 0
      end
    elseif c.qo >= __SLIDING_BUCKETS_MAX__ * __RECORD_BYTES__ then
      c.qo, c.qe, c.qx = T.log_rewrite(c.qk, T.closed_buckets(c, p, now), c.qx, now)
    end
  end
  redis.call('SET', c.ck, T.encode(c), 'PX', T.ttl_ms(idle, now))
end
