-- ratelimitd: the entry point of the limits script.
--
-- One call decides a batch of checks, in order, each exactly as if it had
-- been sent alone at the same instant: a check sees what the checks before
-- it in the batch charged, and nothing else is shared.
--
-- KEYS         the state keys of every check's limits, in order (the keys
--              of one check share one {hash tag})
-- ARGV[1]      forced time in microseconds, or "0" for redis TIME (tests only)
-- then per check:
--   cost       of the request (integer >= 1)
--   n          number of limits (>= 1)
--   n times:   algorithm name, then a, b, c
--
-- A malformed call (see BATCH in lib.lua) or an unknown algorithm is
-- refused before anything is decided. Within a check every limit is checked
-- first; only when all allow is any charged, so a denied request costs
-- nothing anywhere (all-or-nothing, atomic because the whole script is).
--
-- Reply, per check in order: allowed, now_ms, then per limit: allowed,
-- remaining, reset_ms, retry_after_ms, delay_ms. A check whose Redis
-- commands fail (a key of another type at its name: WRONGTYPE; OOM under
-- maxmemory) has -1 and the error's text in its first two places, zeros in
-- the rest: it alone fails, and the checks after it are still decided.

if BAD then
  return redis.error_reply('ERR ratelimitd: ' .. BAD)
end
for name in pairs(USED) do
  if ALGORITHMS[name] == nil then
    return redis.error_reply('ERR ratelimitd: unknown algorithm ' .. tostring(name))
  end
end

local now = now_us()
local now_ms = math.floor(now / 1000)
local reply, nreply = {}, 0
-- The current check's result per limit, reused from check to check: a
-- table per check and per limit cost about 4 % of a call of 32 checks.
local results = {}

-- One check: limits at ARGV[arg..] (their numbers in PARAMS), keys at
-- KEYS[key + 1..].
local function check_one(cost, n, arg, key)
  local all_allowed = true
  for i = 1, n do
    local at = arg + 4 * (i - 1)
    local r = ALGORITHMS[ARGV[at]].check(KEYS[key + i], now, cost,
                                         PARAMS[at + 1], PARAMS[at + 2], PARAMS[at + 3])
    results[i] = r
    if not r.allowed then all_allowed = false end
  end

  reply[nreply + 1] = all_allowed and 1 or 0
  reply[nreply + 2] = now_ms
  nreply = nreply + 2
  for i = 1, n do
    local r = results[i]
    local remaining, reset, delay
    if all_allowed then
      local at = arg + 4 * (i - 1)
      ALGORITHMS[ARGV[at]].commit(KEYS[key + i], now, cost, r,
                                  PARAMS[at + 1], PARAMS[at + 2], PARAMS[at + 3])
      remaining, reset, delay = r.remaining_after, r.reset_after, r.delay
    else
      local hold = ALGORITHMS[ARGV[arg + 4 * (i - 1)]].hold
      if hold then hold(KEYS[key + i], r) end
      remaining, reset, delay = r.remaining, r.reset, 0
    end
    if remaining < 0 then remaining = 0 end
    reply[nreply + 1] = r.allowed and 1 or 0
    reply[nreply + 2] = math.floor(remaining)
    reply[nreply + 3] = us_to_ms_ceil(reset)
    reply[nreply + 4] = r.allowed and 0 or us_to_ms_ceil(r.retry)
    reply[nreply + 5] = us_to_ms_ceil(delay)
    nreply = nreply + 5
  end
end

-- Redis does not undo a script's writes when it fails, so an error that
-- ended the call would leave the checks before it charged and answered
-- as failures, and the checks after it undecided. Every limit of a check
-- is read before any is charged, so a key of the wrong type fails its
-- check before that check is charged anywhere. (A stored value only
-- this script could have written wrongly, such as a count of "1.5", can
-- fail a later limit's write after an earlier one was charged.)
for i = 1, #BATCH, 4 do
  local n, at = BATCH[i + 1], nreply
  local ok, err = pcall(check_one, BATCH[i], n, BATCH[i + 2], BATCH[i + 3])
  if not ok then
    reply[at + 1] = -1
    reply[at + 2] = type(err) == 'table' and tostring(err.err) or tostring(err)
    for k = at + 3, at + 2 + 5 * n do reply[k] = 0 end
    nreply = at + 2 + 5 * n
  end
end
return reply
