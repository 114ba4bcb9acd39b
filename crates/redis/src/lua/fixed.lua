-- The fixed window (the twin of the core's counter/fixed.rs): u units counted in the aligned
-- window w of wu microseconds (index floor(now / wu)), rolled over in one place.

-- Start the window `now` is in, if it is a later one than the counter's.
function T.fixed_roll(c, now, window)
  local current = math.floor(now / window)
  if c.w < current then
    c.w = current
    c.u = 0
    c.dirty = true
  end
end

-- A fixed body that counts `used_before` units carried over from another algorithm's, in
-- `now`'s window.
function T.fixed_carried(c, now, window, used_before)
  c.k = __BODY_FIXED__
  c.w = math.floor(now / window)
  c.wu = window
  c.u = used_before
end

-- Time from `now` until the counter's window ends.
function T.fixed_wait_for_room(c, p, now)
  return T.sub0((c.w + 1) * p.window, now)
end

-- Give back up to `give_back` units of a reservation made at `at`, if it was made in the
-- window that counts now; returns the units given back.
function T.fixed_refund(c, p, at, give_back)
  if math.floor(at / p.window) == c.w then
    local refunded = math.min(give_back, c.u)
    c.u = c.u - refunded
    return refunded
  end
  return 0
end
