-- The entry points: the call's numbers unpacked, the clock read, and each operation sent to its
-- part (T.decide); then the function Redis calls, registered. Always the last part.

-- The unpacking format of each count of numbers up to UNPACK_CHUNK, made once.
T.formats = {}

function T.format(count)
  local format = T.formats[count]
  if not format then
    format = '>' .. string.rep('d', count)
    T.formats[count] = format
  end
  return format
end

-- The numbers packed in `packed` (ARGV[1]). A batch's may be thousands: a C function returns
-- its results on Lua's bounded stack, so they are unpacked UNPACK_CHUNK at a time.
function T.numbers(packed)
  local count = #packed / __NUMBER_BYTES__
  if count <= __UNPACK_CHUNK__ then return { struct.unpack(T.format(count), packed) } end
  local a = {}
  for at = 0, count - 1, __UNPACK_CHUNK__ do
    local chunk = { struct.unpack(T.format(math.min(__UNPACK_CHUNK__, count - at)), packed,
      at * __NUMBER_BYTES__ + 1) }
    for i = 1, #chunk - 1 do a[at + i] = chunk[i] end
  end
  return a
end

-- One operation: KEYS and ARGV as in the header.
function T.decide(KEYS, ARGV)
  local a = T.numbers(ARGV[1])
  local op = a[1]
  local watch = op >= __OP_WATCH_EVICTIONS__
  if watch then op = op - __OP_WATCH_EVICTIONS__ end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * __US_PER_S__ + tonumber(time[2])
  if op == __OP_BEGIN__ then
    -- begin a new namespace: a generation born at time zero, owned here, unless one exists.
    local set = redis.call('SET', KEYS[1], struct.pack('>dd', 0, now + __RENEW_EVERY_US__) ..
      T.identity(), 'NX', 'PX', __GENERATION_TTL_MS__)
    if set and watch then
      -- Nothing of a new namespace was evicted: its evictions record starts at the count now.
      local count = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')) or -1
      redis.call('SET', KEYS[#KEYS], struct.pack('>ddd', count, 0, now + __RENEW_EVERY_US__),
        'PX', __GENERATION_TTL_MS__)
    end
    if set then return 1 end
    return 0
  end

  if op == __OP_ACQUIRE__ then return T.acquire(KEYS, a, 2, 0, now, nil, watch, ARGV[1]) end

  if op == __OP_BATCH__ then
    -- a batch of acquires on one slot, decided in order, each all or nothing, at one `now`: [2]
    -- how many, then per acquire: how far its keys are shifted (its own KEYS[x] is
    -- KEYS[x + shift]; KEYS[1], the generation, is shared), how many numbers it has, then its
    -- numbers as an acquire's from its cost (its costs per counter, if any, among them). The generation (and the evictions record) is read
    -- once. Reply: one acquire's reply per acquire, in order.
    local names = { KEYS[1] }
    if watch then names[2] = KEYS[#KEYS] end
    local values = redis.call('MGET', unpack(names))
    local gen = T.generation(values[1], KEYS[1], now)
    if watch then T.evictions(gen, values[2], KEYS[#KEYS], now) end
    local replies, at = {}, __BATCH_AT__
    for d = 1, a[2] do
      replies[d] = T.acquire(KEYS, a, at + 2, a[at], now, gen, false, ARGV[1])
      at = at + 2 + a[at + 1]
    end
    return replies
  end

  -- The generation and the one key every other operation reads first (a counter's state, or a
  -- limit's pause), with the limit's pause for usage when it is kept here, in one read.
  local names = { KEYS[1], KEYS[2] }
  if op == __OP_USAGE__ and a[__ARG_OWN__] >= 1 then names[3] = KEYS[a[__ARG_OWN__]] end
  if watch then names[#names + 1] = KEYS[#KEYS] end
  local values = redis.call('MGET', unpack(names))
  local gen = T.generation(values[1], KEYS[1], now)
  if watch then T.evictions(gen, values[#names], KEYS[#KEYS], now) end
  if op == __OP_LEAVE__ then
    -- a waiting request gives up its place: [2] its id; KEYS[2] the counter's queue, ARGV[2]
    -- the counter's key (the wake-up's message). Reply: ok now born lost
    local q, expired = T.queue_read(values[2], now)
    if T.queue_leave(q, a[2]) or expired then
      T.queue_write(KEYS[2], q, now)
      T.wake(T.wake_channel(KEYS[1]), ARGV[2])
    end
    return T.head('ok', now, gen)
  end

  if op == __OP_ADMIT__ then
    -- admit a key: [2..10] policy, [11] budget, [12] the counter's cover, [13] until when it
    -- must live, [14] honour a hold, [15] apart (as in an admission). Reply: ok now born lost
    -- cover_end, keys now born lost budget, or held now born lost until
    local p = T.read_policy(a, 2, ARGV[1])
    local status, value = T.admit(KEYS[2], values[2], now, gen, p, a[__ARG_ADMISSION__ + 1],
      a[__ARG_ADMISSION__ + 2], a[__ARG_ADMISSION__], a[__ARG_ADMISSION__ + 4],
      a[__ARG_ADMISSION__ + 3])
    local reply = T.head(status, now, gen)
    reply[__REPLY_AT__] = value
    return reply
  end

  -- Every other operation is on one counter: [2..10] its policy, [ARG_ADMISSION ..] its
  -- admission, then its own numbers from [ARG_OWN]. Each may answer admit or keys for counter
  -- 1, as acquire does.
  local adm = T.read_admission(a, __ARG_ADMISSION__)
  if op == __OP_COMMIT__ then return T.commit_op(KEYS, ARGV, a, now, gen, values, adm) end
  if op == __OP_RENEW__ then return T.renew_op(KEYS, ARGV, a, now, gen, values, adm) end
  if op == __OP_PAUSE__ then return T.pause_op(KEYS, ARGV, a, now, gen, values, adm) end
  if op == __OP_RESUME__ then return T.resume_op(KEYS, ARGV, a, now, gen, values, adm) end
  if op == __OP_USAGE__ then return T.usage_op(KEYS, ARGV, a, now, gen, values, adm) end
  if op == __OP_CHARGE__ then return T.charge_op(KEYS, ARGV, a, now, gen, values, adm) end

  return redis.error_reply('tollgate: unknown operation ' .. tostring(op))
end

-- Loaded as a function library (FUNCTION LOAD, Redis 7 and later; the client names the function
-- after the script's hash), the helpers above are made once rather than on every call, which
-- is a measurable share of a decision's cost. Run by EVALSHA (older Redis), the chunk runs,
-- and decides, on every call.
if redis.register_function then
  redis.register_function('__TOLLGATE_FUNCTION__', function(keys, args)
    return T.decide(keys, args)
  end)
else
  return T.decide(KEYS, ARGV)
end
