-- ratelimitd: the entry point of the limits script.
--
-- One call decides a batch of checks, in order, each exactly as if it had
-- been sent alone at the same instant: a check sees what the checks before
-- it in the batch charged, and nothing else is shared.
--
-- KEYS         the state keys of every check's limits, in order (the keys
--              of one check share one {hash tag})
-- ARGV[1]      forced time in microseconds, or "0" for redis TIME (tests only)
-- ARGV[2..]    the limit sets, then per check its set and cost (see lib.lua)
--
-- A malformed call (see lib.lua) or an unknown algorithm is
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
-- The probe each new link sends (no sets, no checks): an empty answer, not
-- an error, which Redis would count in errorstats and commandstats'
-- failed_calls, where operators alert.
if CHECKS_AT > #ARGV then return {} end
for name in pairs(USED) do
  if ALGORITHMS[name] == nil then
    return redis.error_reply('ERR ratelimitd: unknown algorithm ' .. tostring(name))
  end
end

local now = now_us()
local now_ms = floor(now / 1000)
local reply, nreply = {}, 0
-- Each limit's result, in one table per place in the check, reused from
-- check to check (built per check, they were a fifth of a check's cost).
-- Built with ten fields, so that the room for an algorithm's own fields
-- (x, y, z hold it) is there from the start: a table that grows field by
-- field is rehashed each time its size doubles.
local results = {}
for i = 1, MAX_LIMITS do
  results[i] = { allowed = false, remaining = 0, remaining_after = 0, reset = 0,
                 reset_after = 0, retry = 0, delay = 0, x = 0, y = 0, z = 0 }
end

-- One check of set s, its keys at KEYS[key + 1..].
local function check_one(cost, s, key)
  local first, n = SETS[2 * s - 1], SETS[2 * s]
  local all_allowed = true
  for i = 1, n do
    local l4, r = 4 * (first + i - 1), results[i]
    ALGORITHMS[LIMITS[l4 + 1]].check(r, KEYS[key + i], now, cost,
                                     LIMITS[l4 + 2], LIMITS[l4 + 3], LIMITS[l4 + 4])
    if not r.allowed then all_allowed = false end
  end

  reply[nreply + 1] = all_allowed and 1 or 0
  reply[nreply + 2] = now_ms
  nreply = nreply + 2
  for i = 1, n do
    local l4, r = 4 * (first + i - 1), results[i]
    local alg = ALGORITHMS[LIMITS[l4 + 1]]
    local remaining, reset, delay
    if all_allowed then
      alg.commit(r, KEYS[key + i], now, cost, LIMITS[l4 + 2], LIMITS[l4 + 3], LIMITS[l4 + 4])
      remaining, reset, delay = r.remaining_after, r.reset_after, r.delay
    else
      local hold = alg.hold
      if hold then hold(r, KEYS[key + i]) end
      remaining, reset, delay = r.remaining, r.reset, 0
    end
    if remaining < 0 then remaining = 0 end
    local allowed = r.allowed
    reply[nreply + 1] = allowed and 1 or 0
    reply[nreply + 2] = floor(remaining)
    reply[nreply + 3] = reset > 0 and ceil(reset / 1000) or 0
    reply[nreply + 4] = (allowed or r.retry <= 0) and 0 or ceil(r.retry / 1000)
    reply[nreply + 5] = delay > 0 and ceil(delay / 1000) or 0
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
local key = 0
for arg = CHECKS_AT, #ARGV, 2 do
  local s, at = NUM[ARGV[arg]], nreply
  local n = SETS[2 * s]
  local ok, err = pcall(check_one, NUM[ARGV[arg + 1]], s, key)
  if not ok then
    reply[at + 1] = -1
    reply[at + 2] = type(err) == 'table' and tostring(err.err) or tostring(err)
    for k = at + 3, at + 2 + 5 * n do reply[k] = 0 end
    nreply = at + 2 + 5 * n
  end
  key = key + n
end
return reply
