-- ratelimitd: the shared prelude of the limits script.
--
-- The daemon sends one script: this file, then every algorithm file, then
-- main.lua, concatenated at build time. Each algorithm registers itself in
-- ALGORITHMS under its policy name with two functions:
--
--   check(key, now, cost, a, b, c) -> r
--     Reads the state at `key` and decides without charging (it may drop
--     entries that no longer count: housekeeping). `now` is in
--     microseconds. r must have: allowed (bool), remaining (before charge),
--     remaining_after (if charged), reset (us until full, before charge),
--     reset_after (us until full, if charged), retry (us until a request of
--     this cost could pass, 0 when allowed), delay (us an allowed request must
--     be held before it may proceed; 0 except for shaping algorithms).
--   commit(key, now, cost, r, a, b, c)
--     Writes the charged state, with an expiry no longer than it matters.
--
-- Numbers that become part of a string go through fmt_int: Lua's own
-- number-to-string conversion (tostring, `..`) uses "%.14g", which would
-- truncate microsecond timestamps (16 digits). (redis.call formats a bare
-- number argument with "%.17g" on Redis 7.0, exact for these integers; the
-- scripts pass fmt_int strings there too, so every stored number has one
-- form whatever the Redis version.)

local ALGORITHMS = {}

-- The batch is read and checked whole before anything is decided, so a
-- malformed call is refused having changed nothing. BATCH holds four
-- entries per check: cost, limit count, index of its first limit in ARGV,
-- index before its first key in KEYS. PARAMS holds each limit's a, b, c as
-- numbers at their ARGV indexes, so they are converted once. BAD names the
-- first problem.
--
-- Only the algorithms this call names are built (USED). Redis runs the whole
-- script body on every call, so defining all six (tables and closures) cost
-- about 4 us per call; each algorithm file wraps its definition in `if
-- USED.x`.
--
-- Every check of a route sends the same numbers (cost 1, its limits'
-- parameters), and tonumber of a string runs strtod twice, so each distinct
-- string is converted once per call (argnum): converting them all was a
-- tenth of the script's time on a route with three limits.
local BATCH = {}
local PARAMS = {}
local USED = {}
local BAD = nil
do
  local converted = {}
  local function argnum(s)
    if s == nil then return nil end   -- past the end of ARGV
    local x = converted[s]
    if x == nil then
      x = tonumber(s) or false
      converted[s] = x
    end
    return x or nil
  end
  local arg, key = 2, 0
  while arg <= #ARGV do
    local cost, n = argnum(ARGV[arg]), argnum(ARGV[arg + 1])
    if cost == nil or cost < 1 or cost > 1e15 or cost ~= math.floor(cost) then
      BAD = 'bad cost'
      break
    end
    if n == nil or n < 1 or n ~= math.floor(n) or key + n > #KEYS
        or arg + 1 + 4 * n > #ARGV then
      BAD = 'bad limit count'
      break
    end
    for j = 0, n - 1 do
      local at = arg + 2 + 4 * j
      local a, b, c = argnum(ARGV[at + 1]), argnum(ARGV[at + 2]), argnum(ARGV[at + 3])
      if a == nil or b == nil or c == nil then
        BAD = 'bad limit parameters'
        break
      end
      PARAMS[at + 1], PARAMS[at + 2], PARAMS[at + 3] = a, b, c
      USED[ARGV[at]] = true
    end
    if BAD then break end
    local b = #BATCH
    BATCH[b + 1], BATCH[b + 2], BATCH[b + 3], BATCH[b + 4] = cost, n, arg + 2, key
    arg = arg + 2 + 4 * n
    key = key + n
  end
  if BAD == nil and key ~= #KEYS then BAD = 'more keys than limits' end
end

-- Formatting is sprintf, and many of the numbers a call writes repeat from
-- check to check (the cost, the time, a window), so each is formatted once.
local formatted = {}
local function fmt_int(x)
  local s = formatted[x]
  if s == nil then
    s = string.format('%.0f', x)
    formatted[x] = s
  end
  return s
end

-- Microseconds to whole milliseconds, rounded up so that a client told to
-- wait that long is never early.
local function us_to_ms_ceil(us)
  if us <= 0 then return 0 end
  return math.ceil(us / 1000)
end

-- The expiry, in ms, for state that matters `us` longer. Redis counts it
-- from its millisecond clock, which is up to 1 ms behind the microsecond
-- TIME the script decided at, and PEXPIRE deletes a key at once when that
-- deadline has already come (7.0 reads its clock twice). Rounded up plus
-- 1 ms, a key never goes while its state still matters.
local function expiry_ms(us)
  return us_to_ms_ceil(us) + 1
end

local function expire_in_us(key, us)
  redis.call('PEXPIRE', key, fmt_int(expiry_ms(us)))
end

-- A denied check charges nothing, but its state may have been written
-- under other numbers (a reload that slowed a refill or lengthened a
-- window): its expiry is set again from what the current numbers need,
-- or the key would go on the old schedule, taking the count with it. For
-- the algorithms whose expiry depends on those numbers; a fixed window
-- carries its count itself, and gcra's and the leaky bucket's state is a
-- time, its expiry that time.
local function hold_for_reset(key, r)
  if r.reset > 0 then expire_in_us(key, r.reset) end
end

local function now_us()
  local forced = ARGV[1]
  if forced ~= nil and forced ~= '' and forced ~= '0' then
    return tonumber(forced)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Greatest common divisor of two positive integers.
local function gcd(a, b)
  while b ~= 0 do a, b = b, a % b end
  return a
end

-- Exact rationals in stored state (token_bucket, leaky_bucket, gcra).
-- A fractional rate makes times and token counts non-integral (3/s is one
-- request per 333333.33 us), and a double near 1.7e15 us only resolves a
-- quarter microsecond, so such values are stored exactly as "I" or
-- "I+R/D" (integer I plus R/D, 0 < R < D) and computed in integer units of
-- 1/D relative to an origin (usually now), which keeps every value small
-- and every comparison exact.

-- Decodes s as (value - origin) in integer units of 1/den. A value stored
-- with another denominator (the rate changed on reload), or as a plain
-- float, is rounded up or down as the caller asks.
local function rat_decode(s, origin, den, round_up)
  local i, r, d = string.match(s, '^(%-?%d+)%+(%d+)/(%d+)$')
  local x
  if i == nil then
    x = (tonumber(s) - origin) * den
  else
    i, r, d = tonumber(i), tonumber(r), tonumber(d)
    if d == den then return (i - origin) * den + r end
    x = (i - origin) * den + r * den / d
  end
  if round_up then return math.ceil(x) end
  return math.floor(x)
end

-- Encodes origin + x/den exactly (x an integer >= 0).
local function rat_encode(origin, x, den)
  local whole = math.floor(x / den)
  local r = x - whole * den
  if r == 0 then return fmt_int(origin + whole) end
  return fmt_int(origin + whole) .. '+' .. fmt_int(r) .. '/' .. fmt_int(den)
end

-- The meter shared by gcra and leaky_bucket, which are one computation: a
-- single exact timestamp per key, the time the meter is empty again (gcra's
-- TAT, the leaky bucket's empty_at), in integer units of 1/den us, where one
-- request is `per` units. A request of cost c is admitted iff
--   max(stored, now) + c*per - now <= burst * per
-- so a fresh client gets exactly `burst` at once. The result's delay is 0;
-- leaky_bucket sets its own.
local function meter_check(key, now, cost, burst, n, period)
  local g = gcd(n, period)
  local per, den = period / g, n / g
  local cap = burst * per              -- a full meter, empty after burst/rate
  local d = 0                          -- max(stored - now, 0)
  local s = redis.call('GET', key)
  if s then
    d = rat_decode(s, now, den, true)
    if d < 0 then d = 0 end
  end
  local after = d + cost * per         -- the stored time if admitted, - now
  local allowed = after <= cap
  local retry = 0
  if not allowed then
    if cost > burst then
      retry = math.ceil(d / den) + math.ceil(cap / den)  -- never passes; a hint
    else
      retry = math.ceil((after - cap) / den)              -- until it fits
    end
  end
  return {
    allowed = allowed,
    remaining = math.floor((cap - d) / per),
    remaining_after = math.floor((cap - after) / per),
    reset = math.ceil(d / den),
    reset_after = math.ceil(after / den),
    retry = retry,
    delay = 0,
    empty_after = after,
    den = den,
  }
end

local function meter_commit(key, now, cost, r)
  redis.call('SET', key, rat_encode(now, r.empty_after, r.den),
             'PX', fmt_int(expiry_ms(r.reset_after)))
end
