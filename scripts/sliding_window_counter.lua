-- sliding_window_counter: a = limit, b = window (us), c = precision (us);
-- the window is a multiple of the precision (the daemon validates it).
-- One hash per client: field = start time (us) of a precision bucket
-- floor(now / precision) * precision, value = the cost admitted in it.
-- The count over the window (now - W, now] is
--
--   count = sum over buckets s of n_s * clamp(s + P - (now - W), 0, P) / P
--
-- i.e. every bucket that lies inside the window counts in full and the
-- oldest, partly outside, counts for the fraction of it that is still
-- inside, as if its requests had been spread evenly over it. Buckets that
-- have left the window entirely are deleted on every check (Redis 7.0 has
-- no HEXPIRE), so the hash holds at most W/P + 1 fields.
-- All arithmetic is on integers scaled by P, hence exact.
local SWC_HDEL_BATCH = 1000

if USED.sliding_window_counter then ALGORITHMS.sliding_window_counter = {
  check = function(r, key, now, cost, limit, window, precision)
    local P, W = precision, window
    local h = call('HGETALL', key)
    local f = 0            -- count * P
    local ends = {}        -- per live bucket: us from now until it has left
    local counts = {}
    local stale = {}
    local reset = 0
    for i = 1, #h, 2 do
      local n = tonumber(h[i + 1])
      local e = tonumber(h[i]) + P + W - now
      if e <= 0 then
        stale[#stale + 1] = h[i]
      else
        f = f + n * math.min(e, P)
        ends[#ends + 1] = e
        counts[#counts + 1] = n
        if e > reset then reset = e end
      end
    end
    for i = 1, #stale, SWC_HDEL_BATCH do
      call('HDEL', key, unpack(stale, i, math.min(#stale, i + SWC_HDEL_BATCH - 1)))
    end
    local cap, charge = limit * P, cost * P
    -- One expression for the verdict and the sweep's target: past 2^53
    -- (limit * P, P in us) the doubles round, and `f + charge <= cap`
    -- could deny what `f <= cap - charge` let the sweep find already
    -- passing, at a slope of 0 (a retry of -inf).
    local target = cap - charge
    local allowed = f <= target
    local retry = 0
    if not allowed then
      if cost > limit then
        retry = reset + W               -- never passes; a hint only
      else
        -- count(now + u) is continuous, piecewise linear and non-increasing
        -- in u: bucket i holds full weight until u = e_i - P, then loses
        -- n_i per us until u = e_i. Sweep those breakpoints for the first u
        -- with count * P <= cap - charge.
        local events = {}
        local slope = 0
        for i = 1, #ends do
          if ends[i] - P <= 0 then
            slope = slope + counts[i]
          else
            events[#events + 1] = { ends[i] - P, counts[i] }
          end
          events[#events + 1] = { ends[i], -counts[i] }
        end
        table.sort(events, function(x, y) return x[1] < y[1] end)
        local u, val = 0, f
        for i = 1, #events do
          local at = events[i][1]
          local next_val = val - slope * (at - u)
          if next_val <= target and slope > 0 then
            retry = u + math.ceil((val - target) / slope)
            break
          end
          u, val = at, next_val
          slope = slope + events[i][2]
        end
      end
    end
    local cur = math.floor(now / P) * P
    local reset_after = cur + P + W - now
    if reset > reset_after then reset_after = reset end
    r.allowed = allowed
    r.remaining = floor((cap - f) / P)
    r.remaining_after = floor((cap - f - charge) / P)
    r.reset = reset
    r.reset_after = reset_after
    r.retry = retry
    r.delay = 0
    r.bucket = cur
  end,
  commit = function(r, key, now, cost)
    call('HINCRBY', key, fmt_int(r.bucket), fmt_int(cost))
    expire_in_us(key, r.reset_after)
  end,
  hold = hold_for_reset,
} end