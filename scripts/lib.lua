-- ratelimitd: the shared prelude of the limits script.
--
-- The daemon sends one script: this file, then every algorithm file, then
-- main.lua, concatenated at build time. Each algorithm registers itself in
-- ALGORITHMS under its policy name with two functions, and optionally hold:
--
--   check(r, key, now, cost, a, b, c)
--     Reads the state at `key` and decides without charging (it may drop
--     entries that no longer count: housekeeping). `now` is in
--     microseconds. It fills r, a table reused from check to check (so it
--     sets every field it or its commit reads): allowed (bool), remaining
--     (before charge), remaining_after (if charged), reset (us until full,
--     before charge), reset_after (us until full, if charged), retry (us
--     until a request of this cost could pass, 0 when allowed), delay (us
--     an allowed request must be held before it may proceed; 0 except for
--     shaping algorithms), and whatever its commit needs.
--   commit(r, key, now, cost, a, b, c)
--     Writes the charged state, with an expiry no longer than it matters.
--   hold(r, key)
--     On a denial: keeps the state's expiry right (see hold_for_reset).
--
-- Numbers that become part of a string go through fmt_int: Lua's own
-- number-to-string conversion (tostring, `..`) uses "%.14g", which would
-- truncate microsecond timestamps (16 digits). (redis.call formats a bare
-- number argument with "%.17g" on Redis 7.0, exact for these integers; the
-- scripts pass fmt_int strings there too, so every stored number has one
-- form whatever the Redis version.)
--
-- What a check costs Redis is mostly Lua's. Under callgrind (see
-- scripts/script-instructions.py) one VM instruction is 50-150 machine
-- instructions, a Lua function call about 300-500, a table constructor of
-- ten fields about 4,300 and a tonumber of a string about 1,500 (strtod,
-- twice), against 8,000-10,000 for a redis.call. Hence the shapes below:
-- the globals used per check read once into locals, no table built per
-- check, each distinct argument string converted once. (Each upvalue a
-- closure captures costs its creation a walk of the open upvalues, about
-- 500 here, once per call: cheaper than a global read per check.)

local call = redis.call
local floor, ceil = math.floor, math.ceil
local tonumber = tonumber
local KEYS, ARGV = KEYS, ARGV

local ALGORITHMS = {}

-- The call, read and checked whole before anything is decided, so a
-- malformed call is refused having changed nothing:
--
--   ARGV[2]    S, the number of limit sets the call uses (>= 1; 0 only in
--              the link's probe, a call of no sets and no checks)
--   S times:   n (>= 1), then n times: algorithm name, a, b, c
--   per check: the index of its set (1..S), its cost (integer >= 1)
--
-- A route's limits are sent once per call however many of its checks the
-- call carries, and each check is two short strings: the parameters of a
-- route with three limits were fourteen strings per check, each interned
-- by Redis and converted by the script.
--
-- LIMITS holds each limit's algorithm name and its a, b, c as numbers, at
-- 4l-3 .. 4l for limit l, numbered across the sets. SETS holds each set's
-- number of limits before it and its own count, at 2s-1 and 2s. The checks
-- start at ARGV[CHECKS_AT]; main.lua reads them again from there, their
-- strings already converted in NUM. BAD names the first problem. (Each
-- table a call builds costs it an allocation, hence few and flat ones.)
--
-- Only the algorithms this call names are built (USED). Redis runs the whole
-- script body on every call, so defining all six (tables and closures) cost
-- about 4 us per call; each algorithm file wraps its definition in `if
-- USED.x`.
local LIMITS, SETS, NUM, USED = {}, {}, {}, {}
local CHECKS_AT, MAX_LIMITS = 0, 0
local BAD = nil
do
  -- Every check of a route sends the same strings, and tonumber of a
  -- string runs strtod twice, so each distinct string is converted once.
  local function argnum(s)
    if s == nil then return nil end   -- past the end of ARGV
    local x = NUM[s]
    if x == nil then
      x = tonumber(s) or false
      NUM[s] = x
    end
    return x or nil
  end
  local nargv = #ARGV
  local nsets = argnum(ARGV[2])
  local arg, nlimits = 3, 0
  if nsets == nil or nsets < 0 or nsets ~= floor(nsets) or 2 + 5 * nsets > nargv then
    BAD = 'bad set count'
  else
    for s = 1, nsets do
      local n = argnum(ARGV[arg])
      if n == nil or n < 1 or n ~= floor(n) or arg + 4 * n > nargv then
        BAD = 'bad limit count'
        break
      end
      SETS[2 * s - 1], SETS[2 * s] = nlimits, n
      if n > MAX_LIMITS then MAX_LIMITS = n end
      for at = arg + 1, arg + 4 * n, 4 do
        local name = ARGV[at]
        local a, b, c = argnum(ARGV[at + 1]), argnum(ARGV[at + 2]), argnum(ARGV[at + 3])
        if a == nil or b == nil or c == nil then
          BAD = 'bad limit parameters'
          break
        end
        local l4 = 4 * nlimits
        LIMITS[l4 + 1], LIMITS[l4 + 2], LIMITS[l4 + 3], LIMITS[l4 + 4] = name, a, b, c
        nlimits = nlimits + 1
        USED[name] = true
      end
      if BAD then break end
      arg = arg + 1 + 4 * n
    end
  end
  CHECKS_AT = arg
  local key, nkeys = 0, #KEYS
  while BAD == nil and arg <= nargv do
    local s, cost = argnum(ARGV[arg]), argnum(ARGV[arg + 1])
    local n = s and SETS[2 * s]
    if n == nil or s < 1 or s ~= floor(s) then
      BAD = 'bad set index'
    elseif cost == nil or cost < 1 or cost > 1e15 or cost ~= floor(cost) then
      BAD = 'bad cost'
    elseif key + n > nkeys then
      BAD = 'more limits than keys'
    else
      key = key + n
      arg = arg + 2
    end
  end
  if BAD == nil and key ~= nkeys then BAD = 'more keys than limits' end
end

-- Formatting is sprintf, and many of the numbers a call writes repeat from
-- check to check (the cost, the time, a window), so each is formatted once.
local formatted = {}
local format = string.format
local function fmt_int(x)
  local s = formatted[x]
  if s == nil then
    s = format('%.0f', x)
    formatted[x] = s
  end
  return s
end

-- Microseconds to whole milliseconds, rounded up so that a client told to
-- wait that long is never early.
local function us_to_ms_ceil(us)
  if us <= 0 then return 0 end
  return ceil(us / 1000)
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
  call('PEXPIRE', key, fmt_int(expiry_ms(us)))
end

-- A denied check charges nothing, but its state may have been written
-- under other numbers (a reload that slowed a refill or lengthened a
-- window): its expiry is set again from what the current numbers need,
-- or the key would go on the old schedule, taking the count with it. For
-- the algorithms whose expiry depends on those numbers; a fixed window
-- carries its count itself, and gcra's and the leaky bucket's state is a
-- time, its expiry that time (their hold, meter_hold, writes only a meter
-- that held more than the new numbers allow).
local function hold_for_reset(r, key)
  if r.reset > 0 then expire_in_us(key, r.reset) end
end

local function now_us()
  local forced = ARGV[1]
  if forced ~= nil and forced ~= '' and forced ~= '0' then
    return tonumber(forced)
  end
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Only the algorithms that keep exact rationals use what follows, to the
-- end of this file; built on every call, as the whole script runs per
-- call, its closures cost a call that uses none of them about 5,000
-- instructions (of 157,000 for one fixed_window check). Each `function
-- name` below assigns the local declared here.
local gcd, rat_decode, rat_encode, meter_check, meter_commit, meter_hold
if USED.token_bucket or USED.leaky_bucket or USED.gcra then
-- Greatest common divisor of two positive integers.
function gcd(a, b)
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
function rat_decode(s, origin, den, round_up)
  local i, r, d = string.match(s, '^(%-?%d+)%+(%d+)/(%d+)$')
  local x
  if i == nil then
    x = (tonumber(s) - origin) * den
  else
    i, r, d = tonumber(i), tonumber(r), tonumber(d)
    if d == den then return (i - origin) * den + r end
    x = (i - origin) * den + r * den / d
  end
  if round_up then return ceil(x) end
  return floor(x)
end

-- Encodes origin + x/den exactly (x an integer >= 0).
function rat_encode(origin, x, den)
  local whole = floor(x / den)
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
function meter_check(r, key, now, cost, burst, n, period)
  local g = gcd(n, period)
  local per, den = period / g, n / g
  local cap = burst * per              -- a full meter, empty after burst/rate
  local d = 0                          -- max(stored - now, 0)
  local clamped = false                -- the state to store if denied
  local s = call('GET', key)
  if s then
    d = rat_decode(s, now, den, true)
    if d < 0 then d = 0 end
    -- Under one rate and burst the meter never holds more than cap, so this
    -- changes only state left under other numbers. A rate raised on reload
    -- from 1/h to 10/s reads 3 h of meter as 108,000 requests owed, and
    -- unclamped would lock the client out for 3 h just when it was meant
    -- to get in sooner. The time alone cannot say what it was at the old
    -- rate, so a client owes at most a full meter at the new numbers;
    -- meter_hold stores that if the request is denied, so that the meter
    -- drains from now.
    if d > cap then
      d = cap
      clamped = rat_encode(now, cap, den)
    end
  end
  local after = d + cost * per         -- the stored time if admitted, - now
  local allowed = after <= cap
  local retry = 0
  if not allowed then
    if cost > burst then
      retry = ceil(d / den) + ceil(cap / den)  -- never passes; a hint
    else
      retry = ceil((after - cap) / den)        -- until it fits
    end
  end
  r.allowed = allowed
  r.remaining = floor((cap - d) / per)
  r.remaining_after = floor((cap - after) / per)
  r.reset = ceil(d / den)
  r.reset_after = ceil(after / den)
  r.retry = retry
  r.delay = 0
  r.empty_after = after
  r.den = den
  r.clamped = clamped
end

function meter_commit(r, key, now)
  call('SET', key, rat_encode(now, r.empty_after, r.den),
       'PX', fmt_int(expiry_ms(r.reset_after)))
end

function meter_hold(r, key)
  if r.clamped then
    call('SET', key, r.clamped, 'PX', fmt_int(expiry_ms(r.reset)))
  end
end
end -- the rational algorithms
