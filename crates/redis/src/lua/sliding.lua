-- The sliding window (the twin of the core's counter/sliding.rs): units in buckets, each
-- counted until its stamp plus the window. The newest bucket is in the counter's value (lo, ls,
-- lu), older (closed) ones in the bucket log (logs.lua), SLIDING_BUCKETS_MAX at most; qu counts
-- them all. This part owns their expiry, room, grants and refunds.

-- Closed buckets whose log was lost before they expired (eviction): they are kept as one
-- bucket that counts their units until the log would have expired, which is at least as long
-- as any of them counted.
function T.repair_buckets(c, p, now)
  local units = c.qu - c.lu
  local stamp = c.qx - p.window
  local record = struct.pack('>ddd', stamp, stamp, units)
  redis.call('SET', c.qk, record, 'PX', T.ttl_ms(c.qx, now))
  c.qo, c.qe, c.fs, c.fu = 0, __RECORD_BYTES__, stamp, units
  c.dirty = true
  return record
end

-- The closed buckets' records, read whole (a denial's retry time, a refund).
function T.closed_buckets(c, p, now)
  local records = T.log_read(c.qk, c.qo, c.qe)
  if #records ~= c.qe - c.qo then return T.repair_buckets(c, p, now) end
  return records
end

function T.clear_closed(c)
  if c.qe > c.qo then c.dirty = true end
  c.qu = c.lu
  c.qo, c.qe, c.fs, c.fu = c.qe, c.qe, -1, 0
end

-- Drop the buckets that have left the window at `now`.
function T.sliding_expire(c, p, now)
  local window = p.window
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
      local bytes = redis.call('GETRANGE', c.qk, c.qo + __BUCKET_STAMP__,
        c.qo + (__BUCKET_STAMP__ + 2 * __NUMBER_BYTES__ - 1))
      if #bytes ~= 2 * __NUMBER_BYTES__ then
        T.repair_buckets(c, p, now)
      else
        c.fs, c.fu = struct.unpack('>dd', bytes)
      end
      c.dirty = true
    end
    if c.fs + window > now then break end
    c.qu = c.qu - c.fu
    c.qo = c.qo + __RECORD_BYTES__
    c.fs, c.fu = -1, 0
    c.dirty = true
  end
  if c.lu > 0 and c.qe == c.qo and c.ls + window <= now then
    c.qu, c.lo, c.ls, c.lu = 0, 0, 0, 0
    c.dirty = true
  end
end

-- A sliding body that counts `used_before` units carried over from another algorithm's, as
-- one bucket at `now` (its logs already emptied by the caller).
function T.sliding_carried(c, now, used_before)
  c.k = __BODY_SLIDING__
  if used_before > 0 then
    c.lo, c.ls, c.lu, c.qu = now, now, used_before, used_before
  end
end

-- Time from `now` until the oldest buckets holding `excess` units have left the window.
function T.sliding_wait_for_room(c, p, now, excess)
  local freed = 0
  local records = T.closed_buckets(c, p, now)
  for at = __BUCKET_STAMP__ + 1, #records, __RECORD_BYTES__ do
    local stamp, units = struct.unpack('>dd', records, at)
    freed = freed + units
    if freed >= excess then return T.sub0(stamp + p.window, now) end
  end
  return T.sub0(c.ls + p.window, now)
end

-- Count `cost` units at `now` in the newest bucket, or in a new one once the newest spans its
-- share of the window (the newest then moves to the log). Returns the time the grant is
-- counted at (its reservation's).
function T.sliding_grant(c, p, now, cost, slack)
  local span = 0
  if p.limit > __SLIDING_BUCKETS_MAX__ then
    span = math.floor(p.window / __SLIDING_BUCKETS_MAX__)
  end
  local at = now
  if c.lu > 0 then at = math.max(c.ls, now) end
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
        c.qo, c.qe, c.fs, c.fu = 0, 2 * __RECORD_BYTES__, stamp, lost_units
      end
    end
    c.lo, c.ls, c.lu = at, at, cost
  end
  c.qu = c.qu + cost
  return at
end

-- Give back up to `give_back` units of a reservation made at `at`; returns the units given
-- back. They come off the bucket that holds the reservation (the last one opened at or before
-- it), if it still counts it.
function T.sliding_refund(c, p, now, at, give_back)
  local refunded = 0
  if c.lu > 0 and c.lo <= at then
    if c.ls >= at then
      refunded = math.min(give_back, c.lu)
      c.lu = c.lu - refunded
      c.qu = c.qu - refunded
      if c.lu == 0 then
        -- The newest bucket is gone: the newest closed one takes its place.
        local records = T.closed_buckets(c, p, now)
        if #records > 0 then
          c.lo, c.ls, c.lu = struct.unpack('>ddd', records, #records - __RECORD_BYTES__ + 1)
          records = string.sub(records, 1, #records - __RECORD_BYTES__)
          c.qo, c.qe, c.qx = T.log_rewrite(c.qk, records, c.qx, now)
          if #records == 0 then c.fs, c.fu = -1, 0 end
        else
          c.lo, c.ls = 0, 0
        end
      end
    end
  elseif c.qe > c.qo then
    local records = T.closed_buckets(c, p, now)
    for i = #records / __RECORD_BYTES__, 1, -1 do
      local opened, stamp, bucket_units =
        struct.unpack('>ddd', records, (i - 1) * __RECORD_BYTES__ + 1)
      if opened <= at then
        if stamp >= at then
          refunded = math.min(give_back, bucket_units)
          c.qu = c.qu - refunded
          if bucket_units - refunded > 0 then
            redis.call('SETRANGE', c.qk, c.qo + (i - 1) * __RECORD_BYTES__ + __BUCKET_UNITS__,
              struct.pack('>d', bucket_units - refunded))
            if i == 1 then c.fu = bucket_units - refunded end
          else
            records = string.sub(records, 1, (i - 1) * __RECORD_BYTES__) ..
              string.sub(records, i * __RECORD_BYTES__ + 1)
            c.qo, c.qe, c.qx = T.log_rewrite(c.qk, records, c.qx, now)
            if i == 1 then c.fs, c.fu = -1, 0 end
          end
        end
        break
      end
    end
  end
  return refunded
end
