-- The append-only logs beside a counter's value (its closed sliding buckets, its open
-- reservations): records of RECORD_BYTES (three big-endian doubles, '>ddd'), a live range
-- [lo, hi) of bytes and the key's expiry, kept in the counter's value. Lua only: the core keeps
-- these lists in memory.
-- Append a record to a log, keeping its key's expiry at least `until_us` (pushed `slack`
-- further). Returns the new live range and expiry. A key that is not what the counter says
-- (expired, evicted, or left by an older counter of the same name) starts over with the record.
function T.log_append(key, lo, hi, expiry, record, until_us, slack, now)
  local length = redis.call('APPEND', key, record)
  if length ~= hi + __RECORD_BYTES__ then
    redis.call('SET', key, record, 'PX', T.ttl_ms(until_us + slack, now))
    return 0, __RECORD_BYTES__, until_us + slack, true
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
