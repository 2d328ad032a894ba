-- ratelimitd: the entry point of the limits script.
--
-- KEYS[i]      the state key of limit i (all share one {hash tag})
-- ARGV[1]      forced time in microseconds, or "0" for redis TIME (tests only)
-- ARGV[2]      cost of the request (integer >= 1)
-- ARGV[3+4(i-1) .. 6+4(i-1)]  limit i: algorithm name, then a, b, c
--
-- Every limit is checked first; only when all allow is any charged, so a
-- denied request costs nothing anywhere (all-or-nothing, atomic because the
-- whole script is).
--
-- Reply: { allowed, now_ms, then per limit: allowed, remaining, reset_ms,
--          retry_after_ms, delay_ms }

local now = now_us()
local cost = tonumber(ARGV[2])
if cost == nil or cost < 1 then
  return redis.error_reply('ERR ratelimitd: bad cost')
end

local results = {}
local all_allowed = true
for i = 1, #KEYS do
  local base = 2 + (i - 1) * 4
  local name = ARGV[base + 1]
  local algorithm = ALGORITHMS[name]
  if algorithm == nil then
    return redis.error_reply('ERR ratelimitd: unknown algorithm ' .. tostring(name))
  end
  local a, b, c = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local r = algorithm.check(KEYS[i], now, cost, a, b, c)
  results[i] = { algorithm = algorithm, r = r, a = a, b = b, c = c }
  if not r.allowed then all_allowed = false end
end

local reply = { all_allowed and 1 or 0, math.floor(now / 1000) }
for i = 1, #KEYS do
  local e = results[i]
  local r = e.r
  local remaining, reset, delay
  if all_allowed then
    e.algorithm.commit(KEYS[i], now, cost, r, e.a, e.b, e.c)
    remaining, reset, delay = r.remaining_after, r.reset_after, r.delay
  else
    remaining, reset, delay = r.remaining, r.reset, 0
  end
  if remaining < 0 then remaining = 0 end
  reply[#reply + 1] = r.allowed and 1 or 0
  reply[#reply + 1] = math.floor(remaining)
  reply[#reply + 1] = us_to_ms_ceil(reset)
  reply[#reply + 1] = r.allowed and 0 or us_to_ms_ceil(r.retry)
  reply[#reply + 1] = us_to_ms_ceil(delay)
end
return reply
