-- gcra: a = burst, b/c = rate as b requests per c microseconds.
-- The generic cell rate algorithm with redis-cell's semantics and one
-- timestamp per key: the theoretical arrival time TAT. The emission
-- interval is T = period / N and a request of cost c is admitted iff
--   max(TAT, now) + c*T - now <= burst * T
-- (the tolerance is (burst - 1) * T on the old TAT), so a fresh client gets
-- exactly `burst` requests at once, where redis-cell's max_burst = B admits
-- B + 1. TAT is stored exactly (see rat_encode); the computation is
-- meter_check in lib.lua, which leaky_bucket shares.
if USED.gcra then ALGORITHMS.gcra = {
  check = meter_check,
  commit = meter_commit,
  hold = meter_hold,
} end
