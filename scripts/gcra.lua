-- gcra: a = burst, b/c = rate as b requests per c microseconds.
-- The generic cell rate algorithm with redis-cell's semantics and one
-- timestamp per key: the theoretical arrival time TAT. The emission
-- interval is T = period / N and a request of cost c is admitted iff
--   max(TAT, now) + c*T - now <= burst * T
-- (the tolerance is (burst - 1) * T on the old TAT), so a fresh client gets
-- exactly `burst` requests at once, where redis-cell's max_burst = B admits
-- B + 1. TAT is stored exactly (see rat_encode) and computed in integer
-- units of 1/den us, T being `per` such units.
if USED.gcra then ALGORITHMS.gcra = {
  check = function(key, now, cost, burst, n, period)
    local g = gcd(n, period)
    local per, den = period / g, n / g
    local tau = burst * per
    local d = 0                        -- max(TAT - now, 0)
    local s = redis.call('GET', key)
    if s then
      d = rat_decode(s, now, den, true)
      if d < 0 then d = 0 end
    end
    local after = d + cost * per       -- new TAT - now
    local allowed = after <= tau
    local retry = 0
    if not allowed then
      if cost > burst then
        retry = math.ceil(d / den) + math.ceil(tau / den)  -- never passes; a hint
      else
        retry = math.ceil((after - tau) / den)
      end
    end
    return {
      allowed = allowed,
      remaining = math.floor((tau - d) / per),
      remaining_after = math.floor((tau - after) / per),
      reset = math.ceil(d / den),
      reset_after = math.ceil(after / den),
      retry = retry,
      delay = 0,
      tat_after = after,
      den = den,
    }
  end,
  commit = function(key, now, cost, r)
    redis.call('SET', key, rat_encode(now, r.tat_after, r.den),
               'PX', fmt_int(math.max(1, us_to_ms_ceil(r.reset_after))))
  end,
} end