-- leaky_bucket: a = burst, b/c = rate as b requests per c microseconds.
-- A queue drained at `rate` that holds at most `burst` (in cost units); a
-- request is admitted when it fits, and is served once the queue ahead of
-- it has drained: its delay is that queue's length divided by the rate, so
-- a fresh client gets exactly `burst` at once, the k-th with delay
-- (k - 1) / rate, and no delay ever reaches burst / rate. The script always
-- returns the delay; the daemon holds the reply (delay: true, shaping) or
-- ignores it (delay: false, policing).
-- State: one string, the time the queue will be empty ("empty_at"), stored
-- exactly (see rat_encode); the queue length at `now` is
-- (empty_at - now) * rate. Time is computed in integer units of 1/den us,
-- where one request drains in `per` units.
if USED.leaky_bucket then ALGORITHMS.leaky_bucket = {
  check = function(key, now, cost, burst, n, period)
    local g = gcd(n, period)
    local per, den = period / g, n / g
    local cap = burst * per            -- a full queue, drained in burst/rate
    local q = 0                        -- queue before this request (drain time)
    local s = redis.call('GET', key)
    if s then
      q = rat_decode(s, now, den, true)
      if q < 0 then q = 0 end
    end
    local after = q + cost * per
    local allowed = after <= cap
    local retry = 0
    if not allowed then
      if cost > burst then
        retry = math.ceil(q / den) + math.ceil(cap / den)  -- never passes; a hint
      else
        retry = math.ceil((after - cap) / den)              -- until it fits
      end
    end
    return {
      allowed = allowed,
      remaining = math.floor((cap - q) / per),
      remaining_after = math.floor((cap - after) / per),
      reset = math.ceil(q / den),
      reset_after = math.ceil(after / den),
      retry = retry,
      delay = math.ceil(q / den),
      empty_at = after,
      den = den,
    }
  end,
  commit = function(key, now, cost, r)
    redis.call('SET', key, rat_encode(now, r.empty_at, r.den),
               'PX', fmt_int(math.max(1, us_to_ms_ceil(r.reset_after))))
  end,
} end