-- A fixed window of the period alone (the margin is not added; the twin of the core's
-- counter/bare.rs): u units in the aligned window w of wu (the period) microseconds.

function T.bare_roll(c, now, period)
  local current = math.floor(now / period)
  if c.w < current then
    c.w = current
    c.u = 0
    c.dirty = true
  end
end

function T.bare_carried(c, now, period, used_before)
  c.k = __BODY_BARE__
  c.w = math.floor(now / period)
  c.wu = period
  c.u = used_before
end

function T.bare_wait_for_room(c, p, now)
  return T.sub0((c.w + 1) * p.period, now)
end

function T.bare_refund(c, p, at, give_back)
  if math.floor(at / p.period) == c.w then
    local refunded = math.min(give_back, c.u)
    c.u = c.u - refunded
    return refunded
  end
  return 0
end
