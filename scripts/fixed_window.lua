-- fixed_window: a = limit, b = window (us).
-- One counter per aligned window floor(now / window), kept in a hash with the
-- window's start `s` so a stale counter reads as zero without a second key.
-- Like every fixed window it admits up to 2x limit across a boundary.
--
-- The expiry is set once, by the first charge of a window: the window's end
-- is fixed, so every later charge would set the same deadline again, and
-- that PEXPIRE was a fifth of the script's time on a busy key. The hash
-- keeps the window length `w` it was set for, so a charge that finds
-- another length (a reload, or a sidecar with another policy, whose window
-- happens to start at the same instant) sets it again. A hash written by a
-- build without `w` gets it, and its expiry, on its next charge.
if USED.fixed_window then
-- The window starting at `start`, holding n, with its expiry at its end.
-- `cmd` is redis.call for a charge; redis.pcall for the housekeeping a
-- check does before its verdict, which under maxmemory Redis refuses (OOM)
-- when it is the call's first write: the check is then still decided on
-- the count it read (a denied client stays denied) rather than failing by
-- its failure mode. True if written.
local function fw_write(cmd, key, now, start, n, window)
  local r = cmd('HSET', key, 's', fmt_int(start), 'n', fmt_int(n), 'w', fmt_int(window))
  if type(r) == 'table' and r.err then return false end
  cmd('PEXPIRE', key, fmt_int(expiry_ms(start + window - now)))
  return true
end

ALGORITHMS.fixed_window = {
  check = function(r, key, now, cost, limit, window)
    local start = floor(now / window) * window
    local state = call('HMGET', key, 's', 'n', 'w')
    local count = 0
    local expiry_set = false   -- for this window length: a charge adds only
    -- The stored numbers are compared as the strings this script writes
    -- (formatted once per call) before as numbers: strtod is dear here.
    if state[1] == (formatted[start] or fmt_int(start)) or tonumber(state[1]) == start then
      count = tonumber(state[2]) or 0
      expiry_set = count > 0 and (state[3] == (formatted[window] or fmt_int(window))
                                  or tonumber(state[3]) == window)
    else
      -- A count kept for a window of another length (a reload changed it)
      -- that began inside this window: its requests came between its start
      -- and now, so they are this window's too, whatever its length. (One
      -- that began earlier may hold requests from before this window: that
      -- count is not carried. One that begins after now is Redis's clock
      -- gone back: that window starts from zero.)
      local s0 = tonumber(state[1])
      if s0 and s0 >= start and s0 <= now then
        count = tonumber(state[2]) or 0
      end
    end
    -- A count of this window stored for another length (carried, or a
    -- reload at an instant where both windows start): its expiry is the
    -- old window's end. Written for this one now, denied or not, as
    -- housekeeping that keeps the count: left to a charge, a client denied
    -- until the old key expired started this window from zero.
    if count > 0 and not expiry_set then
      expiry_set = fw_write(redis.pcall, key, now, start, count, window)
    end
    local until_end = start + window - now
    local allowed = count + cost <= limit
    local retry = 0
    if not allowed then
      if cost > limit then
        retry = (count > 0 and until_end or 0) + window  -- never passes; a hint
      else
        retry = until_end
      end
    end
    r.allowed = allowed
    r.remaining = limit - count
    r.remaining_after = limit - count - cost
    r.reset = (count > 0) and until_end or 0
    r.reset_after = until_end
    r.retry = retry
    r.delay = 0
    r.start = start
    r.count = count
    r.expiry_set = expiry_set
  end,
  commit = function(r, key, now, cost, limit, window)
    if r.expiry_set then
      call('HINCRBY', key, 'n', formatted[cost] or fmt_int(cost))
      return
    end
    fw_write(call, key, now, r.start, r.count + cost, window)
  end,
}
end
