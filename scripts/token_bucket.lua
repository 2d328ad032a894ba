-- token_bucket: a = burst, b/c = rate as b tokens per c microseconds.
-- Tokens refill continuously (fractional tokens kept) up to burst; a request
-- takes `cost` tokens. State: a hash with the tokens `t` and the time `ts`
-- they were counted. Tokens are stored exactly (see rat_encode) and computed
-- in integer units of 1/per token, of which `den` refill per microsecond:
-- with a fractional rate such as 5/10s, floating point drifts off the exact
-- count (2.9999999 tokens reported as 2 left).
ALGORITHMS.token_bucket = {
  check = function(key, now, cost, burst, n, period)
    local g = gcd(n, period)
    local per, den = period / g, n / g
    local cap = burst * per
    local x = cap
    local state = redis.call('HMGET', key, 't', 'ts')
    if state[1] then
      local x0 = rat_decode(state[1], 0, per, false)
      local elapsed = now - (tonumber(state[2]) or now)
      if elapsed < 0 then elapsed = 0 end
      -- compare before multiplying, so an old timestamp cannot overflow
      if x0 < cap and elapsed < math.ceil((cap - x0) / den) then
        x = x0 + elapsed * den
      end
    end
    local charge = cost * per
    local allowed = x >= charge
    local after = x - charge
    local retry = 0
    if not allowed then
      if cost > burst then
        retry = math.ceil((cap - x) / den) + math.ceil(cap / den)  -- never passes; a hint
      else
        retry = math.ceil((charge - x) / den)
      end
    end
    return {
      allowed = allowed,
      remaining = math.floor(x / per),
      remaining_after = math.floor(after / per),
      reset = math.ceil((cap - x) / den),
      reset_after = math.ceil((cap - after) / den),
      retry = retry,
      delay = 0,
      tokens = after,
      per = per,
    }
  end,
  commit = function(key, now, cost, r)
    redis.call('HSET', key, 't', rat_encode(0, r.tokens, r.per), 'ts', fmt_int(now))
    expire_in_us(key, r.reset_after)
  end,
}
