-- token_bucket: a = burst, b/c = rate as b tokens per c microseconds.
-- Tokens refill continuously (fractional tokens kept) up to burst; a request
-- takes `cost` tokens. State: a hash with `d`, the tokens missing from a full
-- bucket, and `ts`, the time it was counted. Storing what is missing rather
-- than what is left makes a reload that raises the burst take effect at once
-- without resetting anyone: the new bucket is just as many tokens short
-- (and one lowered is at most empty).
-- The deficit is stored exactly (see rat_encode) and computed in integer
-- units of 1/per token, of which `den` refill per microsecond: with a
-- fractional rate such as 5/10s, floating point drifts off the exact count
-- (2.9999999 tokens reported as 2 left).
if USED.token_bucket then ALGORITHMS.token_bucket = {
  check = function(r, key, now, cost, burst, n, period)
    local g = gcd(n, period)
    local per, den = period / g, n / g
    local cap = burst * per
    local missing = 0
    local state = call('HMGET', key, 'd', 'ts')
    if state[1] then
      local m0 = rat_decode(state[1], 0, per, true)
      local elapsed = now - (tonumber(state[2]) or now)
      if elapsed < 0 then elapsed = 0 end
      -- compare before multiplying, so an old timestamp cannot overflow
      if m0 > 0 and elapsed < ceil(m0 / den) then
        missing = m0 - elapsed * den
      end
    end
    -- Under one rate and burst the deficit never passes the burst, so this
    -- changes only state left under a larger burst: lowered on reload from
    -- 1000 to 10 at 1/s, a client that had spent 1000 would owe 990 more
    -- than the bucket holds, and wait 991 s for a token it would have had
    -- in 1 s under either number. It owes at most an empty bucket, stored
    -- by hold when the request is denied, so the refill counts from now.
    local clamped = false
    if missing > cap then
      missing = cap
      clamped = formatted[now] or fmt_int(now)
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
    r.allowed = allowed
    r.remaining = floor(x / per)
    r.remaining_after = floor((x - charge) / per)
    r.reset = ceil(missing / den)
    r.reset_after = ceil((missing + charge) / den)
    r.retry = retry
    r.delay = 0
    r.missing = missing + charge
    r.per = per
    r.clamped = clamped
    r.burst = burst
  end,
  commit = function(r, key, now)
    call('HSET', key, 'd', rat_encode(0, r.missing, r.per), 'ts', formatted[now] or fmt_int(now))
    expire_in_us(key, r.reset_after)
  end,
  hold = function(r, key)
    if r.clamped then
      call('HSET', key, 'd', fmt_int(r.burst), 'ts', r.clamped)
    end
    hold_for_reset(r, key)
  end,
} end
