-- Keys of a limit counted per key (the twin of src/tally.rs, which the Rust side of the store
-- and its tests follow): a counter's cover, the limit's key budget that gives it, and admitting
-- a key.
--
-- A limit's key budget (src/tally.rs, the reference this follows): 'K', then '>dd' g the birth
-- of the generation it was written in and h until when it admits no new key of a request, then
-- '>dd' records (end, count) ascending by end: how many counters of its keys it counts until
-- each cover end. A counter of a key is never written to live past its cover (a); a write that
-- would first has the key admitted (T.cover), so a limit never keeps more counters of keys than
-- its budget.

-- The longest one write can make a counter of `p` live, its logs included (tally.rs span_us).
function T.span(p)
  return math.max(p.window, p.memory) + math.floor(p.window / __LOG_SLACK_PER_WINDOW__)
    + __EXPIRY_SLACK_US__
end

-- Until when counter `c` may live once written: its idle time, its logs' slack and the rounding
-- of an expiry to milliseconds; `from_now`: the operation may also make it count from now (a
-- grant, a renewal, or normalising it into another kind after its limit changed); `reach`, if
-- given: the operation may make it count until then (a charge's debt, past a grant's span).
function T.need(c, p, now, from_now, reach)
  local slack = math.floor(p.window / __LOG_SLACK_PER_WINDOW__) + __EXPIRY_SLACK_US__
  local need = T.idle_at(c, p) + slack
  if from_now then need = math.max(need, now + T.span(p)) end
  if reach then need = math.max(need, reach + slack) end
  return need
end

-- The cover given at `now` to a counter that must live until `need` (tally.rs cover_end).
function T.cover_end(now, need, span)
  local target = math.max(need, now + __COVER_SPANS__ * span)
  local grid = T.div_ceil(span, 2)
  while target - now > __GRID_PER_DISTANCE__ * grid do grid = grid * 2 end
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
  if raw and string.sub(raw, 1, 1) == 'K' and #raw >= __TALLY_HEADER_BYTES__
      and (#raw - __TALLY_HEADER_BYTES__) % __TALLY_RECORD_BYTES__ == 0 then
    g, h = struct.unpack('>dd', raw, 2)
    for at = __TALLY_HEADER_BYTES__ + 1, #raw, __TALLY_RECORD_BYTES__ do
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
    h = math.max(lost_at, gen.seen) + __HOLD_SPANS__ * span
  elseif g ~= gen.born then
    h = math.max(h, lost_at + __HOLD_SPANS__ * span)
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
-- asks it, then calls again), {'keys', budget} or {'held', until}. `reach` as for T.need.
function T.cover(c, p, now, from_now, adm, gen, KEYS, honour_hold, reach)
  if adm.tally == 0 then return nil end
  local need = T.need(c, p, now, from_now, reach)
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
  c.keep = math.min(now + T.span(p), value - __EXPIRY_SLACK_US__)
  c.dirty = true
  return nil
end

-- The reply to a one-counter operation that T.cover stopped: its answer, for counter 1.
function T.uncovered(answer, now, gen)
  local reply = T.head(answer[1], now, gen)
  reply[__REPLY_AT__], reply[__REPLY_AT__ + 1], reply[__REPLY_AT__ + 2] =
    1, answer[2], answer[3]
  return reply
end
