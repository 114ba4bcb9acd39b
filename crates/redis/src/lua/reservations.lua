-- A rate counter's open reservations (the twin of the core's counter/reservations.rs): the
-- grants a commit can still refund, RESERVATIONS_TRACKED_MAX at most, as records (seq, units,
-- at) in the reservations log (logs.lua), oldest first.

function T.clear_reservations(c)
  if c.re > c.ro then c.dirty = true end
  c.ro, c.re, c.ra = c.re, c.re, -1
end

-- Drop the reservations whose units no longer count at `now` (a window after their time).
function T.reservations_expire(c, p, now)
  local window = p.window
  if now >= c.rx then T.clear_reservations(c) end
  while c.re > c.ro do
    local at = c.ra
    if at < 0 then
      local bytes = redis.call('GETRANGE', c.rk, c.ro + __RESERVATION_AT__,
        c.ro + (__RESERVATION_AT__ + __NUMBER_BYTES__ - 1))
      if #bytes ~= __NUMBER_BYTES__ then
        -- The log is gone (evicted): its reservations can no longer be committed.
        T.clear_reservations(c)
        break
      end
      at = struct.unpack('>d', bytes)
      c.ra = at
      c.dirty = true
    end
    if at + window > now then break end
    c.ro = c.ro + __RECORD_BYTES__
    c.ra = -1
    c.dirty = true
  end
end

-- Record a refundable grant; past the cap the oldest is forgotten (its units stay counted), as
-- in the core.
function T.reservations_record(c, p, now, seq, cost, reserved_at, slack)
  if c.re - c.ro >= __RESERVATIONS_TRACKED_MAX__ * __RECORD_BYTES__ then
    c.ro = c.ro + __RECORD_BYTES__
    c.ra = -1
  end
  local first = c.re == c.ro
  local restarted
  c.ro, c.re, c.rx, restarted = T.log_append(c.rk, c.ro, c.re, c.rx,
    struct.pack('>ddd', seq, cost, reserved_at), reserved_at + p.window, slack, now)
  if first or restarted then c.ra = reserved_at end
  c.rl = reserved_at
end

-- The open reservation numbered `seq`: its place, units and time, and the live records read
-- (nil when it is not open). Reservations are in seq order: binary search, as the core does.
function T.reservations_find(c, seq)
  local live = T.log_read(c.rk, c.ro, c.re)
  if #live ~= c.re - c.ro then
    T.clear_reservations(c)
    live = ''
  end
  local lo, hi = 1, #live / __RECORD_BYTES__
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local record_seq, record_units, record_at =
      struct.unpack('>ddd', live, (mid - 1) * __RECORD_BYTES__ + 1)
    if record_seq == seq then
      return mid, record_units, record_at, live
    elseif record_seq < seq then
      lo = mid + 1
    else
      hi = mid - 1
    end
  end
  return nil
end

-- Remove the reservation at `index` of the live records `live` (T.reservations_find).
function T.reservations_remove(c, now, live, index)
  local count = #live / __RECORD_BYTES__
  if index == 1 then
    c.ro = c.ro + __RECORD_BYTES__
    if count > 1 then
      c.ra = struct.unpack('>d', live, __RECORD_BYTES__ + __RESERVATION_AT__ + 1)
    else
      c.ra = -1
    end
  else
    live = string.sub(live, 1, (index - 1) * __RECORD_BYTES__) ..
      string.sub(live, index * __RECORD_BYTES__ + 1)
    c.ro, c.re, c.rx = T.log_rewrite(c.rk, live, c.rx, now)
    c.ra = struct.unpack('>d', live, __RESERVATION_AT__ + 1)
    if index == count then c.rl = struct.unpack('>d', live, #live - (__NUMBER_BYTES__ - 1)) end
  end
  c.dirty = true
end
