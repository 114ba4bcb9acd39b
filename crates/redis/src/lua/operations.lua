-- The operations on one counter but acquire (the twin of the core's Counter::commit, renew,
-- usage and debit, as the store asks them): commit (a refund, or a lease's release), renew,
-- usage and charge.
-- Each is called by T.decide with the call's numbers `a`, the values it read first (`values`:
-- the generation, the counter's state, then what the operation asked for) and the counter's
-- admission (`adm`). Their own numbers start at a[ARG_OWN].

-- commit: [ARG_OWN] seq, [ARG_OWN + 1] used. Reply: ok now born lost refunded released
function T.commit_op(KEYS, ARGV, a, now, gen, values, adm)
  local p = T.read_policy(a, 2, ARGV[1])
  local seq, used_units, channel = a[__ARG_OWN__], a[__ARG_OWN__ + 1], ARGV[2]
  local raw = values[2]
  local c = raw and T.decode(raw, KEYS, 2, now)
  if not c then
    -- Forgotten counters were idle: nothing they granted still counts. (One this script
    -- cannot read knows of no permit either.)
    if p.kind == __KIND_CONCURRENCY__ then
      local reply = T.head('ok', now, gen)
      reply[__REPLY_AT__], reply[__REPLY_AT__ + 1] = 0, 0
      return reply
    end
    return T.head('gone', now, gen)
  end
  if seq >= c.s then return T.head('unknown', now, gen) end
  local uncovered = T.cover(c, p, now, true, adm, gen, KEYS, 0)
  if uncovered then return T.uncovered(uncovered, now, gen) end
  T.normalise(c, p, now)
  if c.k == __BODY_LEASES__ then
    local released = T.leases_release(c, seq)
    T.save(c, p, now)
    if released > 0 then T.wake(channel, KEYS[2]) end
    local reply = T.head('ok', now, gen)
    reply[__REPLY_AT__], reply[__REPLY_AT__ + 1] = 0, released
    return reply
  end
  local index, units, at, live = T.reservations_find(c, seq)
  if not index then
    T.save(c, p, now)
    return T.head('gone', now, gen)
  end
  if used_units > units then
    T.save(c, p, now)
    local reply = T.head('used_above_cost', now, gen)
    reply[__REPLY_AT__] = units
    return reply
  end
  T.reservations_remove(c, now, live, index)
  local give_back = units - used_units
  local refunded = 0
  if c.k == __BODY_SLIDING__ then
    refunded = T.sliding_refund(c, p, now, at, give_back)
  elseif c.k == __BODY_FIXED__ then
    refunded = T.fixed_refund(c, p, at, give_back)
  elseif c.k == __BODY_GCRA__ then
    refunded = T.gcra_refund(c, p, seq, give_back)
  end
  T.save(c, p, now)
  if refunded > 0 then T.wake(channel, KEYS[2]) end
  local reply = T.head('ok', now, gen)
  reply[__REPLY_AT__], reply[__REPLY_AT__ + 1] = refunded, 0
  return reply
end

-- renew: [ARG_OWN] fence. Reply: ok now born lost expires_at
function T.renew_op(KEYS, ARGV, a, now, gen, values, adm)
  local p = T.read_policy(a, 2, ARGV[1])
  local fence = a[__ARG_OWN__]
  if p.kind ~= __KIND_CONCURRENCY__ then return T.head('wrong_kind', now, gen) end
  local raw = values[2]
  local c = raw and T.decode(raw, KEYS, 2, now)
  if not c then return T.head('lease_expired', now, gen) end
  if fence >= c.s then return T.head('unknown', now, gen) end
  local uncovered = T.cover(c, p, now, true, adm, gen, KEYS, 0)
  if uncovered then return T.uncovered(uncovered, now, gen) end
  T.normalise(c, p, now)
  local i = T.leases_find(c, fence)
  if i then
    local b = c.b
    b[i + 2] = now + p.ttl
    c.dirty = true
    T.save(c, p, now)
    local reply = T.head('ok', now, gen)
    reply[__REPLY_AT__] = b[i + 2]
    return reply
  end
  T.save(c, p, now)
  return T.head('lease_expired', now, gen)
end

-- usage, counting nothing: [ARG_OWN] where the limit's pause is (as for acquire; when kept
-- here, T.decide read it after the counter's state). Reply: ok now born lost used reset_after
-- paused_until held_until (a hold after a loss, as acquire tells `recovering` apart; 0 when
-- none). A counter is held as acquire would hold it; one not kept is not made.
function T.usage_op(KEYS, ARGV, a, now, gen, values, adm)
  local p = T.read_policy(a, 2, ARGV[1])
  local raw, limit_paused_until = values[2], -a[__ARG_OWN__]
  if a[__ARG_OWN__] >= 1 then limit_paused_until = tonumber(values[3]) or 0 end
  local c, hold_until = T.load(raw, KEYS, 2, now, gen, p)
  if hold_until then T.hold(c, now, hold_until) end
  if raw then
    local uncovered = T.cover(c, p, now, true, adm, gen, KEYS, 0)
    if uncovered then return T.uncovered(uncovered, now, gen) end
  end
  T.normalise(c, p, now)
  local reply = T.head('ok', now, gen)
  reply[__REPLY_AT__] = T.used(c, p, now)
  reply[__REPLY_AT__ + 1] = math.min(T.sub0(T.counted_until(c, p), now), p.memory)
  reply[__REPLY_AT__ + 2] = math.max(c.p, limit_paused_until)
  reply[__REPLY_AT__ + 3] = 0
  if c.p > now and c.p >= limit_paused_until
      and (c.p == gen.born + p.memory or c.p == gen.seen + p.memory) then
    reply[__REPLY_AT__ + 3] = c.p
  end
  -- Normalising may have dropped expired state: keep the store as small as the core's.
  if raw then T.save(c, p, now) end
  return reply
end

-- charge: [ARG_OWN] units. Reply: ok now born lost charged. Units spent beyond any grant
-- (T.debit), counted at now even past the limit, at most one capacity past it; a counter not
-- kept is made, held as acquire would hold it, and its key admitted in its limit's budget as a
-- grant's would be. A concurrency limit counts nothing and makes nothing.
function T.charge_op(KEYS, ARGV, a, now, gen, values, adm)
  local p = T.read_policy(a, 2, ARGV[1])
  local reply = T.head('ok', now, gen)
  reply[__REPLY_AT__] = 0
  if p.kind ~= __KIND_RATE__ then return reply end
  local c, hold_until = T.load(values[2], KEYS, 2, now, gen, p)
  if hold_until then T.hold(c, now, hold_until) end
  -- A GCRA debt can leave a backlog of two capacities, longer than a grant's span: the key is
  -- covered that far before anything is written.
  local reach
  if p.alg == __ALG_GCRA__ then reach = now + 2 * p.capacity * p.emission end
  local uncovered = T.cover(c, p, now, true, adm, gen, KEYS, 0, reach)
  if uncovered then return T.uncovered(uncovered, now, gen) end
  reply[__REPLY_AT__] = T.debit(c, p, now, a[__ARG_OWN__])
  T.save(c, p, now)
  return reply
end
