-- fixed_window: a = limit, b = window (us).
-- One counter per aligned window floor(now / window), kept in a hash with the
-- window's start so a stale counter reads as zero without a second key. Like
-- every fixed window it admits up to 2x limit across a boundary.
if USED.fixed_window then ALGORITHMS.fixed_window = {
  check = function(key, now, cost, limit, window)
    local start = math.floor(now / window) * window
    local state = redis.call('HMGET', key, 's', 'n')
    local count = 0
    if tonumber(state[1]) == start then count = tonumber(state[2]) or 0 end
    local until_end = start + window - now
    local allowed = count + cost <= limit
    local retry = 0
    if not allowed then
      if cost > limit then retry = until_end + window else retry = until_end end
    end
    return {
      allowed = allowed,
      remaining = limit - count,
      remaining_after = limit - count - cost,
      reset = (count > 0) and until_end or 0,
      reset_after = until_end,
      retry = retry,
      delay = 0,
      start = start,
      count = count,
    }
  end,
  commit = function(key, now, cost, r, limit, window)
    redis.call('HSET', key, 's', fmt_int(r.start), 'n', fmt_int(r.count + cost))
    expire_in_us(key, r.start + window - now)
  end,
} end