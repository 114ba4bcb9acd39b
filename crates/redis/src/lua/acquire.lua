-- An acquire: every counter of one request in this slot checked, then granted on all or none
-- (the twin of the engine's MemoryStore::acquire and of plan.rs's slot step), with the queue of
-- waiters across the fleet, the limits' pauses and the key budgets read in the same call.

-- acquire: [2] cost (the same on every counter; below 0: one cost per counter, after the
-- place's lifetime), [3] priority, [4] record reservations (1) or grant final (0), [5] n,
-- then per counter 15 numbers: its policy, where its limit's pause is (at KEYS[x] for x >= 1,
-- or -x its end as read by the caller: its key is in another slot), its admission, and where
-- its queue is (KEYS[x]); then the waiter's id (0: the request does not wait) and how long a
-- place it takes lives (us); then, with a cost below 0, n costs, one per counter in order
-- (a language model's requests, input and output tokens, taken all or none). Reply: ok now born lost, then per counter 5 numbers (outcome
-- granted: seq remaining reset_after lease_expires_at; allowed: _ remaining; denied:
-- retry_after remaining reason left); or cost now born lost i open; or admit now born lost, then
-- (i cover need) for each counter whose key the caller must have admitted in its budget's
-- slot, before anything is written; or keys now born lost i budget.
-- T.acquire decides one: its numbers from a[s] (its cost, [2] above), every key it names at
-- KEYS[x + shift] for the x it gives, its counters' at KEYS[shift + 3i - 1 ..]; `gen` already
-- read (by a batch), or nil: read here with the counters. `packed` is ARGV[1].
function T.acquire(KEYS, a, s, shift, now, gen, watch, packed)
  local cost, priority, record, n = a[s], a[s + 1], a[s + 2], a[s + 3]
  local after = s + __ACQUIRE_HEAD__ + n * __ACQUIRE_PER_COUNTER__
  local waiter, place_ttl = a[after], a[after + 1]
  if waiter == 0 then waiter = __NEWCOMER_ID__ end
  -- A cost per counter: read where needed, so that one cost for all (the common case) makes
  -- no table and reads nothing more.
  local costs
  if cost < 0 then costs = { unpack(a, after + 2, after + 1 + n) } end
  local policies, pauses, admissions, queues = {}, {}, {}, {}
  for i = 1, n do
    local at = s + __ACQUIRE_HEAD__ + (i - 1) * __ACQUIRE_PER_COUNTER__
    local p = T.read_policy(a, at, packed)
    local open = T.capacity_for(p, priority)
    if costs then cost = costs[i] end
    if cost < 1 or cost > open then
      gen = gen or T.generation(redis.call('GET', KEYS[1]), KEYS[1], now)
      local reply = T.head('cost', now, gen)
      reply[__REPLY_AT__], reply[__REPLY_AT__ + 1] = i, open
      return reply
    end
    policies[i] = p
    pauses[i] = a[at + __POLICY_NUMBERS__]
    if pauses[i] >= 1 then pauses[i] = pauses[i] + shift end
    admissions[i] = T.read_admission(a, at + __POLICY_NUMBERS__ + 1)
    if admissions[i].tally >= 1 then admissions[i].tally = admissions[i].tally + shift end
    queues[i] = a[at + (__POLICY_NUMBERS__ + 1 + __ADMISSION_NUMBERS__)] + shift
  end
  -- Every counter's header and queue, and the pauses kept here, in one read; with the
  -- generation (and the evictions record) unless a batch read them already.
  local names, first = {}, 0
  if not gen then
    names[1] = KEYS[1]
    first = 1
  end
  for i = 1, n do
    names[first + i] = KEYS[shift + __KEYS_PER_COUNTER__ * i - 1]
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
    local c, hold_until = T.load(values[first + i], KEYS,
      shift + __KEYS_PER_COUNTER__ * i - 1, now, gen, policies[i])
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
      reply[__REPLY_AT__], reply[__REPLY_AT__ + 1] = i, answer[2]
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
    if costs then cost = costs[i] end
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
    -- Held after a loss (T.load) rather than paused by someone: recovering, when the hold is
    -- what the request waits for (a debt charged past the limit can outlast it).
    if denial and denial[3] == __REASON_PAUSED__ and c.p >= limit_paused_until
        and now + denial[1] <= c.p
        and (c.p == gen.born + p.memory or c.p == gen.seen + p.memory) then
      denial[3] = __REASON_RECOVERING__
    end
    local at = __REPLY_HEAD__ + 1 + __OUTCOME_NUMBERS__ * (i - 1)
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
      local at = __REPLY_HEAD__ + 1 + __OUTCOME_NUMBERS__ * (i - 1)
      if costs then cost = costs[i] end
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
        -- The place records what it waits for on this counter: its own cost.
        if costs then cost = costs[i] end
        T.queue_stand(q, ranks[i], cost, now, place_ttl)
        changed = true
      elseif q and T.queue_leave(q, waiter) then
        changed = true
      end
      if changed then T.queue_write(KEYS[queues[i]], q, now) end
      if freed[i] then
        T.wake(T.wake_channel(KEYS[1]), KEYS[shift + __KEYS_PER_COUNTER__ * i - 1])
      end
    end
  end
  return reply
end
