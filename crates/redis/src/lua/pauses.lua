-- Pauses and holds (the twin of the core's Counter::pause, resume and recovering, and of the
-- engine's MemoryStore::pause, resume and hold): a key's pause is its counter's; a limit-wide
-- pause is a key of its own (the limit's pause), read by every acquire and usage of the limit.
-- A hold is the store's own pause after a loss of state (loss.lua): a resume lifts a pause and
-- leaves a hold.

-- Hold a counter until `hold_until`: a pause it already had that ends later stays.
function T.hold(c, now, hold_until)
  if hold_until > now then
    c.p = math.max(c.p, hold_until)
    c.s = math.max(c.s, hold_until)
  end
  return c
end

-- pause: [ARG_OWN] duration_us, [ARG_OWN + 1] keyed (1: KEYS[2..4] are a counter's; 0: KEYS[2]
-- is a limit's pause). Reply: ok now born lost paused_until. A key's pause makes or keeps its
-- counter, so it counts in its limit's budget like a request's.
function T.pause_op(KEYS, ARGV, a, now, gen, values, adm)
  local p = T.read_policy(a, 2, ARGV[1])
  local until_us = now + a[__ARG_OWN__]
  if a[__ARG_OWN__ + 1] == 1 then
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
    reply[__REPLY_AT__] = c.p
    return reply
  end
  local current = tonumber(values[2]) or 0
  if current > until_us then until_us = current end
  redis.call('SET', KEYS[2], until_us, 'PX', T.ttl_ms(until_us, now))
  local reply = T.head('ok', now, gen)
  reply[__REPLY_AT__] = until_us
  return reply
end

-- resume: [ARG_OWN] keyed (as for pause). Reply: ok now born lost lifted (1 when a pause was
-- on). A hold after a loss of state (until the generation's birth plus the policy's memory) is
-- not a pause and stays; a counter not kept is not made.
function T.resume_op(KEYS, ARGV, a, now, gen, values, adm)
  local p = T.read_policy(a, 2, ARGV[1])
  local reply = T.head('ok', now, gen)
  reply[__REPLY_AT__] = 0
  if a[__ARG_OWN__] == 1 then
    if not values[2] then return reply end
    local c, hold_until = T.load(values[2], KEYS, 2, now, gen, p)
    if hold_until then T.hold(c, now, hold_until) end
    local keep = gen.born + p.memory
    if c.p > math.max(now, keep) then reply[__REPLY_AT__] = 1 end
    if c.p > keep then
      c.p = keep
      c.dirty = true
    end
    local uncovered = T.cover(c, p, now, false, adm, gen, KEYS, 0)
    if uncovered then return T.uncovered(uncovered, now, gen) end
    T.save(c, p, now)
    return reply
  end
  if (tonumber(values[2]) or 0) > now then reply[__REPLY_AT__] = 1 end
  redis.call('DEL', KEYS[2])
  return reply
end
