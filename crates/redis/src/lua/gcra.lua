-- GCRA (the twin of the core's counter/gcra.rs): t the theoretical arrival time, the end of the
-- backlog of granted units at e microseconds (the emission interval) each; l the newest grant's
-- number, the one grant a refund can take back. A grant is gcra_admit's step, in T.grant.

-- A GCRA body that counts `used_before` units carried over from another algorithm's, as a
-- backlog from `now`.
function T.gcra_carried(c, p, now, used_before)
  c.k = __BODY_GCRA__
  c.t = now + used_before * p.emission
  c.e = p.emission
  c.l = 0
end

-- Time from `now` until `cost` more units fit under `open`: once the backlog is at most
-- (open - cost) emission intervals.
function T.gcra_wait_for_room(c, p, now, cost, open)
  return T.sub0(T.sub0(c.t, (open - cost) * p.emission), now)
end

-- Give back `give_back` units of the grant numbered `seq`, if it is the newest (an older one's
-- time may since have been absorbed by an idle gap); returns the units given back.
function T.gcra_refund(c, p, seq, give_back)
  if c.l == seq then
    c.t = T.sub0(c.t, give_back * p.emission)
    return give_back
  end
  return 0
end
