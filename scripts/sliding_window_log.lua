-- sliding_window_log: a = limit, b = window (us).
-- Exact: a sorted set of the times of the admitted requests, one member per
-- unit of cost, so that no more than `limit` fall in any window
-- (now - window, now]. A denied request is not stored, so the set never
-- holds more than `limit` members. Members are "<time>:<n>", numbered per
-- timestamp (members at one time are only ever removed all together), so
-- requests at the same microsecond stay distinct.
local SWL_ZADD_BATCH = 1000   -- members per ZADD (Lua's unpack has a limit)

if USED.sliding_window_log then ALGORITHMS.sliding_window_log = {
  check = function(r, key, now, cost, limit, window)
    -- Housekeeping, not a charge: entries at or before now - window are out.
    call('ZREMRANGEBYSCORE', key, '-inf', fmt_int(now - window))
    local count = call('ZCARD', key)
    local newest = nil
    if count > 0 then
      newest = tonumber(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    end
    local allowed = count + cost <= limit
    -- Back to full quota when the newest entry leaves the window.
    local reset = 0
    if newest then reset = newest + window - now end
    local latest = now
    if newest and newest > now then latest = newest end
    local retry = 0
    if not allowed then
      if cost > limit then
        retry = reset + window          -- never passes; a hint only
      else
        -- The (count + cost - limit) oldest entries must leave first.
        local j = count + cost - limit
        local e = call('ZRANGE', key, j - 1, j - 1, 'WITHSCORES')
        retry = tonumber(e[2]) + window - now
      end
    end
    r.allowed = allowed
    r.remaining = limit - count
    r.remaining_after = limit - count - cost
    r.reset = reset
    r.reset_after = latest + window - now
    r.retry = retry
    r.delay = 0
  end,
  commit = function(r, key, now, cost)
    local t = fmt_int(now)
    local seq = call('ZCOUNT', key, t, t)
    local i = 0
    while i < cost do
      local args = {}
      local n = math.min(cost - i, SWL_ZADD_BATCH)
      for k = 1, n do
        args[#args + 1] = t
        args[#args + 1] = t .. ':' .. fmt_int(seq + i + k)
      end
      call('ZADD', key, unpack(args))
      i = i + n
    end
    expire_in_us(key, r.reset_after)
  end,
  hold = hold_for_reset,
} end