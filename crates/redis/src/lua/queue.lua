-- One counter's queue across the fleet (crates/redis-protocol/src/queue.rs, the reference this
-- follows; the differential tests compare them, and its bounds are put in from there):
-- places of waiting requests, PLACE_BYTES each,
-- '>ddddd' (priority, arrival, id, cost, expires), in rank order: higher priority first, then
-- earlier arrival, then lower id. A request is granted only if its counter has room for its
-- cost plus the costs of every live place ahead of it. A request that does not wait has id
-- NEWCOMER_ID (2^53), after every id a process draws. At most PLACES_MAX (32): a full queue keeps
-- its best. Read only when its key exists: a counter nobody waits for pays one key in the MGET.
function T.queue_read(raw, now)
  local q, expired = {}, false
  if not raw then return q, false end
  for at = 1, #raw - __PLACE_BYTES__ + 1, __PLACE_BYTES__ do
    local pr, ar, id, cost, ex = struct.unpack('>ddddd', raw, at)
    if ex > now then q[#q + 1] = { pr, ar, id, cost, ex } else expired = true end
  end
  return q, expired
end

function T.before(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[3] < b[3]
end

-- The rank of a request of `priority` and `id` ({priority, arrival, id}), and the units the
-- places ahead of it ask for.
function T.queue_rank(q, now, priority, id)
  local rank = { priority, now, id }
  for _, place in ipairs(q) do
    if place[3] == id then rank[2] = place[2] end
  end
  local ahead = 0
  for _, place in ipairs(q) do
    if place[3] ~= id and T.before(place, rank) then ahead = ahead + place[4] end
  end
  return rank, ahead
end

-- Without the place of `id`; whether it had one.
function T.queue_leave(q, id)
  for i, place in ipairs(q) do
    if place[3] == id then
      table.remove(q, i)
      return true
    end
  end
  return false
end

-- The place of a denied waiting request, taken or renewed until now + ttl.
function T.queue_stand(q, rank, cost, now, ttl)
  T.queue_leave(q, rank[3])
  local place = { rank[1], rank[2], rank[3], cost, now + ttl }
  local at = #q + 1
  for i, other in ipairs(q) do
    if T.before(place, other) then
      at = i
      break
    end
  end
  if at > __PLACES_MAX__ then return end
  table.insert(q, at, place)
  if #q > __PLACES_MAX__ then q[#q] = nil end
end

function T.queue_write(key, q, now)
  if #q == 0 then
    redis.call('DEL', key)
    return
  end
  local parts, last = {}, 0
  for i, place in ipairs(q) do
    parts[i] = struct.pack('>ddddd', place[1], place[2], place[3], place[4], place[5])
    if place[5] > last then last = place[5] end
  end
  redis.call('SET', key, table.concat(parts), 'PX', T.ttl_ms(last, now))
end

-- The namespace's wake channel, from the generation's key (`tg:{<tag>}:<namespace>:gen`): for
-- the rare calls that free a place without being told the channel.
function T.wake_channel(generation_key)
  return 'tg:' .. string.match(generation_key, '}:([^:]*):gen$') .. ':wake'
end

function T.wake(channel, counter_key)
  redis.call('PUBLISH', channel, counter_key)
end
