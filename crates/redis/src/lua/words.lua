-- A counter's value as Redis keeps it (the twin of the core's counter/words.rs, in a layout of
-- its own): made, read and written here.
--
-- The counter's value: 'X' (byte COUNTER_TAG), the common header '>dddddddddd'
-- (COUNTER_HEADER_BYTES with the 'X'), then the body's header by kind, then for leases their
-- records.
--   common: g the birth of the generation it was written in, p paused_until, s next_seq, k body
--     kind (BODY_EMPTY, BODY_SLIDING, BODY_FIXED, BODY_GCRA or BODY_LEASES, numbered as the
--     core's words.rs numbers them); the reservations log: ro, re its live bytes [ro, re), ra
--     the oldest live one's `at` (-1: not read yet), rl the newest one's `at`, rx the log key's
--     expiry (us); a the counter's cover (until when its limit's key budget counts it,
--     T.cover; 0 none)
--   sliding '>dddddddddd': qu units of every bucket; the newest bucket kept here: lo opened,
--     ls stamp, lu units (0: no bucket at all); older (closed) buckets in the bucket log: qo, qe
--     its live bytes, fs, fu the oldest closed one's stamp and units (fs -1: not read yet), qx
--     its expiry, qw the shortest window any of its records' expiry was reckoned with (so a
--     longer window pushes qx by the difference)
--   fixed '>ddd': w window index, wu window_us, u used. gcra '>ddd': t tat, e emission_us,
--     l last_seq. leases '>d': nb, then nb records
--     (RECORD_BYTES each, LEASE_NUMBERS numbers: fence, slots, expires_at).
-- Every record a log holds stops counting before its key's expiry (rx, qx only grow while
-- records are appended), so a log whose expiry has passed holds nothing live.

-- A counter of the three keys from KEYS[j]: `ck` its state, `rk`, `qk` its reservations and
-- bucket log keys. `dirty`: the header must be written back. Every field is made here, in one
-- table of the right size: a table that grows field by field is rebuilt as it grows. The
-- leases' records (`b`) are made by a counter of leases.
function T.empty(KEYS, j, now, born)
  return { ck = KEYS[j], rk = KEYS[j + 1], qk = KEYS[j + 2], g = born,
    p = 0, s = now, k = __BODY_EMPTY__, ro = 0, re = 0, ra = -1, rl = 0, rx = 0, a = 0,
    qu = 0, lo = 0, ls = 0, lu = 0, qo = 0, qe = 0, fs = -1, fu = 0, qx = 0, qw = 0,
    w = 0, wu = 0, u = 0, t = 0, e = 0, l = 0, dirty = true }
end

-- nil when `raw` is not a counter this script wrote (another format, or damaged).
function T.decode(raw, KEYS, j, now)
  if string.byte(raw, 1) ~= __COUNTER_TAG__ or #raw < __COUNTER_HEADER_BYTES__ then return nil end
  local c = T.empty(KEYS, j, now, 0)
  c.dirty = false
  local k, at
  c.g, c.p, c.s, k, c.ro, c.re, c.ra, c.rl, c.rx, c.a, at = struct.unpack('>dddddddddd', raw, 2)
  c.k = k
  if k == __BODY_SLIDING__ then
    c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw, at =
      struct.unpack('>dddddddddd', raw, at)
  elseif k == __BODY_FIXED__ then
    c.w, c.wu, c.u, at = struct.unpack('>ddd', raw, at)
  elseif k == __BODY_GCRA__ then
    c.t, c.e, c.l, at = struct.unpack('>ddd', raw, at)
  elseif k == __BODY_LEASES__ then
    local nb
    nb, at = struct.unpack('>d', raw, at)
    if #raw ~= at - 1 + nb * __RECORD_BYTES__ then return nil end
    local b = {}
    c.b = b
    for _ = 1, nb do
      local fence, slots, expires_at
      fence, slots, expires_at, at = struct.unpack('>ddd', raw, at)
      b[#b + 1] = fence
      b[#b + 1] = slots
      b[#b + 1] = expires_at
    end
  elseif k ~= __BODY_EMPTY__ then
    return nil
  end
  if at ~= #raw + 1 then return nil end
  return c
end

-- One pack for the common kinds.
function T.encode(c)
  local k = c.k
  if k == __BODY_SLIDING__ then
    return struct.pack('>Bdddddddddddddddddddd', __COUNTER_TAG__, c.g, c.p, c.s, k, c.ro, c.re,
      c.ra, c.rl, c.rx, c.a, c.qu, c.lo, c.ls, c.lu, c.qo, c.qe, c.fs, c.fu, c.qx, c.qw)
  elseif k == __BODY_FIXED__ then
    return struct.pack('>Bddddddddddddd', __COUNTER_TAG__, c.g, c.p, c.s, k, c.ro, c.re, c.ra,
      c.rl, c.rx, c.a, c.w, c.wu, c.u)
  elseif k == __BODY_GCRA__ then
    return struct.pack('>Bddddddddddddd', __COUNTER_TAG__, c.g, c.p, c.s, k, c.ro, c.re, c.ra,
      c.rl, c.rx, c.a, c.t, c.e, c.l)
  end
  local common = struct.pack('>Bdddddddddd', __COUNTER_TAG__, c.g, c.p, c.s, k, c.ro, c.re, c.ra,
    c.rl, c.rx, c.a)
  if k == __BODY_LEASES__ then
    local b = c.b
    local parts = { common, struct.pack('>d', #b / __LEASE_NUMBERS__) }
    for i = 1, #b, __LEASE_NUMBERS__ do
      parts[#parts + 1] = struct.pack('>ddd', b[i], b[i + 1], b[i + 2])
    end
    return table.concat(parts)
  end
  return common
end
