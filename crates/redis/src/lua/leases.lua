-- Concurrency (the twin of the core's counter/leases.rs): the counter's leases in b, a flat
-- list of LEASE_NUMBERS numbers per lease (fence, slots, expires_at), kept in the counter's
-- value. This part owns their expiry, room, grants, release and renewal.

-- Drop the leases that have ended at `now`.
function T.leases_expire(c, now)
  local b, kept = c.b, {}
  for i = 1, #b, __LEASE_NUMBERS__ do
    if b[i + 2] > now then
      kept[#kept + 1] = b[i]
      kept[#kept + 1] = b[i + 1]
      kept[#kept + 1] = b[i + 2]
    end
  end
  if #kept < #b then
    c.b = kept
    c.dirty = true
  end
end

function T.leases_used(c)
  local sum = 0
  for i = 2, #c.b, __LEASE_NUMBERS__ do sum = sum + c.b[i] end
  return sum
end

-- Time from `now` until the leases ending first have freed `excess` slots.
function T.leases_wait_for_room(c, now, excess)
  local expiries = {}
  for i = 1, #c.b, __LEASE_NUMBERS__ do expiries[#expiries + 1] = { c.b[i + 2], c.b[i + 1] } end
  table.sort(expiries, function(x, y)
    if x[1] ~= y[1] then return x[1] < y[1] end
    return x[2] < y[2]
  end)
  local freed = 0
  for _, e in ipairs(expiries) do
    freed = freed + e[2]
    if freed >= excess then return T.sub0(e[1], now) end
  end
  return 0
end

-- A lease of `cost` slots numbered `fence`, until `expires_at`.
function T.leases_grant(c, fence, cost, expires_at)
  local b = c.b
  local n = #b
  b[n + 1] = fence
  b[n + 2] = cost
  b[n + 3] = expires_at
end

-- End the lease `fence`; the slots it freed (0 when it had already ended).
function T.leases_release(c, fence)
  local b = c.b
  for i = 1, #b, __LEASE_NUMBERS__ do
    if b[i] == fence then
      local released = b[i + 1]
      -- swap_remove: the last lease moves into this place
      local n = #b
      b[i], b[i + 1], b[i + 2] = b[n - 2], b[n - 1], b[n]
      b[n], b[n - 1], b[n - 2] = nil, nil, nil
      c.dirty = true
      return released
    end
  end
  return 0
end

-- Where the lease `fence` is in b, to be renewed; nil when it has ended.
function T.leases_find(c, fence)
  local b = c.b
  for i = 1, #b, __LEASE_NUMBERS__ do
    if b[i] == fence then return i end
  end
  return nil
end

-- When the last lease ends (0 for none).
function T.leases_counted_until(c)
  local latest = 0
  -- expires_at, the last of each lease's numbers
  for i = __LEASE_NUMBERS__, #c.b, __LEASE_NUMBERS__ do
    if c.b[i] > latest then latest = c.b[i] end
  end
  return latest
end
