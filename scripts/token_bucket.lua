-- token_bucket: a = burst, b/c = rate as b tokens per c microseconds.
-- Tokens refill continuously (fractional tokens kept) up to burst; a request
-- takes `cost` tokens. State: a hash with `d`, the tokens missing from a full
-- bucket, and `ts`, the time it was counted. Storing what is missing rather
-- than what is left makes a reload that raises the burst take effect at once
-- without resetting anyone: the new bucket is just as many tokens short
-- (and one lowered reads at most empty, see below).
-- The deficit is stored exactly (see rat_encode) and computed in integer
-- units of 1/per token, of which `den` refill per microsecond: with a
-- fractional rate such as 5/10s, floating point drifts off the exact count
-- (2.9999999 tokens reported as 2 left).
if USED.token_bucket then ALGORITHMS.token_bucket = {
  check = function(r, key, now, cost, burst, n, period)
    local g = gcd(n, period)
    local per, den = period / g, n / g
    local cap = burst * per
    -- A deficit over the burst was left by a larger one: a reload lowered
    -- it, or a sidecar not yet reloaded shares the key. Read as it stands,
    -- a client that had spent 1000 of a burst lowered to 10 at 1/s would
    -- wait 991 s for a token it would have had in 1 s under either number.
    -- These numbers see at most an empty bucket, refilling since the last
    -- charge (`missing`), while what is stored stays the deficit as it
    -- stands (`owed`) plus any charge: a sidecar with the larger burst still
    -- counts every request (storing the capped deficit handed it back the
    -- difference, 90 of 100 at each denial here, through a rollout), and
    -- the key lives as long as that needs. Until the excess drains, this
    -- bucket gives the rate but not its burst back (an admission leaves it
    -- as empty as what is owed, and the reply says so): the conservative
    -- side of both.
    local missing, owed = 0, 0
    local state = call('HMGET', key, 'd', 'ts')
    if state[1] then
      local m0 = rat_decode(state[1], 0, per, true)
      local seen = m0 < cap and m0 or cap
      local elapsed = now - (tonumber(state[2]) or now)
      if elapsed < 0 then elapsed = 0 end
      -- compare before multiplying, so an old timestamp cannot overflow
      if seen > 0 and elapsed < ceil(seen / den) then
        missing = seen - elapsed * den
      end
      if m0 > 0 and elapsed < ceil(m0 / den) then
        owed = m0 - elapsed * den
      end
    end
    local x = cap - missing              -- tokens
    local charge = cost * per
    local allowed = x >= charge
    local retry = 0
    if not allowed then
      if cost > burst then
        retry = ceil(missing / den) + ceil(cap / den)  -- never passes; a hint
      else
        retry = ceil((charge - x) / den)
      end
    end
    -- What is stored is `owed`: the reply counts from it, so that it says
    -- what the next check will find. Under one burst owed is missing;
    -- with an excess owed (see above) an admission leaves the bucket as
    -- empty as min(owed + charge, cap) reads, one admitted now is all there
    -- is, and the bucket is full again once the whole of owed has refilled.
    local after = owed + charge
    local seen_after = after < cap and after or cap
    r.allowed = allowed
    r.remaining_after = floor((cap - seen_after) / per)
    r.remaining = x >= charge and r.remaining_after + cost or floor(x / per)
    r.reset = ceil(owed / den)
    r.reset_after = ceil(after / den)
    r.retry = retry
    r.delay = 0
    r.missing = after                    -- what is stored if admitted
    r.per = per
  end,
  commit = function(r, key, now)
    call('HSET', key, 'd', rat_encode(0, r.missing, r.per), 'ts', formatted[now] or fmt_int(now))
    expire_in_us(key, r.reset_after)
  end,
  hold = hold_for_reset,
} end
