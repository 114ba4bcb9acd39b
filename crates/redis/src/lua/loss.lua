-- Lost state (G6; the twin of crates/redis-protocol/src/loss.rs): which Redis master runs the
-- script, the slot's generation, the evictions seen, and a counter loaded under them (held
-- when it may have lost what it counted; the hold itself is in pauses.lua). The generation
-- (and the evictions record) is RENEW_EVERY_US from its next write, and expires after
-- GENERATION_TTL_MS (30 days, pushed back once a day): a namespace idle longer starts over and
-- waits one period, as after a loss.

-- Which Redis master runs this script: its cluster node id (empty outside a cluster), its run
-- id, which every start of a Redis process draws anew, and its replication id, which it draws
-- anew whenever it becomes a master. Asked once per script engine, which is made again when the
-- library is loaded (a start, a full sync). A master demoted and promoted again without a full
-- sync keeps its old identity, and rightly: it then holds all its new master held. Where the
-- Redis module is loaded, its identity is this one (TOLLGATE.IDENTITY, read the same way and
-- kept by the module until Redis loads a data set): the replication id also changes without a
-- load, and two identities read at two moments would take turns declaring losses.
function T.identity()
  if not T.me then
    local kept = redis.pcall('TOLLGATE.IDENTITY')
    if type(kept) == 'string' then
      T.me = kept
      return T.me
    end
    -- Loaded but refused (an ACL without the module's commands): an identity read here could
    -- differ from the module's, so the call fails, as the store's own TOLLGATE.VERSION would.
    -- Not loaded, Redis calls the command unknown ("Unknown Redis command called from script").
    if type(kept) == 'table' and kept.err
        and not string.find(string.lower(kept.err), 'unknown', 1, true) then
      error('tollgate: TOLLGATE.IDENTITY refused: ' .. kept.err)
    end
    local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
    local term = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''
    local node = redis.pcall('CLUSTER', 'MYID')
    if type(node) ~= 'string' then node = '' end
    T.me = node .. '/' .. run_id .. ':' .. term
  end
  return T.me
end

-- The generation: born, renew (doubles) then the owner's identity, in one string read with the
-- call's other keys (`raw`) and written only when it changes: a missing generation (restart
-- without persistence, flush), or one written by another Redis master (a failover, a restart,
-- a slot moved here) means state may be lost: a new generation starts, born now, and every
-- counter not written since (T.load) waits out whatever it may have counted (G6). A reshard
-- loses nothing, but nothing the script can see tells it from a failover to a stale copy.
-- A generation read before is known by its text (`T.generations`, kept by a function library
-- from call to call, at most CACHE_MAX of them): read again, it is neither unpacked nor compared.
T.generations, T.generations_n = {}, 0

function T.generation(raw, key, now)
  local me = T.identity()
  local born, renew
  local known = raw and T.generations[raw]
  if known then
    born, renew = known[1], known[2]
  elseif raw and #raw > __GENERATION_HEADER_BYTES__
    and string.sub(raw, __GENERATION_HEADER_BYTES__ + 1) == me then
    born, renew = struct.unpack('>dd', raw)
    if T.generations_n >= __CACHE_MAX__ then T.generations, T.generations_n = {}, 0 end
    T.generations[raw] = { born, renew }
    T.generations_n = T.generations_n + 1
  end
  -- Missing, or written by another master: lost.
  local gen = { born = born, lost = 0, seen = 0 }
  if born == nil then
    gen.lost = 1
    gen.born = now
    renew = 0
  end
  if renew <= now then
    -- Keep the expiry ahead with one write a day.
    redis.call('SET', key, struct.pack('>dd', gen.born, now + __RENEW_EVERY_US__) .. me, 'PX',
      __GENERATION_TTL_MS__)
  end
  return gen
end

-- Evictions, for a call that watches them (Redis may evict: its policy is not noeviction).
-- Nothing tells an evicted counter from one that expired idle, so Redis's own count of evicted
-- keys (INFO stats, the node's) is kept per slot, in `key`, with when it was last seen to move
-- (`seen`): a counter found missing is held until `seen` plus what it may have counted
-- (T.load), every counter evicted since having moved the count. Eviction runs before a command,
-- never inside this script, so a count read here covers every key missing here. A record
-- that is missing (never watched here, or itself evicted) is taken as an eviction seen now,
-- unless the node never evicted anything. Kept with one write a day, as the generation is.
-- A few microseconds a call (INFO's text), paid only by a store that watches.
function T.evictions(gen, raw, key, now)
  local count = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')) or -1
  local seen_count, seen, renew
  if raw and #raw == __EVICTIONS_BYTES__ then
    seen_count, seen, renew = struct.unpack('>ddd', raw)
  end
  if seen_count == nil then
    seen = now
    if count == 0 then seen = 0 end
    renew = 0
  elseif seen_count ~= count then
    seen = now
    renew = 0
  end
  if renew <= now then
    redis.call('SET', key, struct.pack('>ddd', count, seen, now + __RENEW_EVERY_US__), 'PX',
      __GENERATION_TTL_MS__)
  end
  gen.seen = seen
end

-- The counter in `raw` (a GET's answer), or a new one, and until when it must be held. A new
-- counter, one this script cannot read, or one written before the generation began (kept by a
-- replica that may have missed its last writes) counts as lost state: it grants nothing until
-- whatever it may have counted is over. A counter missing after an eviction was seen
-- (gen.seen, T.evictions) may be an evicted one: it is held the same way, from then.
function T.load(raw, KEYS, j, now, gen, p)
  if raw then
    local c = T.decode(raw, KEYS, j, now)
    if c and c.g == gen.born then return c end
    if c then
      c.g = gen.born
      c.dirty = true
      return c, gen.born + p.memory
    end
    return T.empty(KEYS, j, now, gen.born), now + p.memory
  end
  return T.empty(KEYS, j, now, gen.born), math.max(gen.born, gen.seen) + p.memory
end
