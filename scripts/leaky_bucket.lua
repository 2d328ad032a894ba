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
-- (empty_at - now) * rate.
if USED.leaky_bucket then ALGORITHMS.leaky_bucket = {
  -- gcra's computation (meter_check in lib.lua), plus the delay: the time
  -- the queue ahead of an admitted request takes to drain.
  check = function(r, key, now, cost, burst, n, period)
    meter_check(r, key, now, cost, burst, n, period)
    r.delay = r.reset
  end,
  commit = meter_commit,
  hold = meter_hold,
} end
