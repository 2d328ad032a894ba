-- wrk script for `make bench`: each request is /check for the original URI
-- given as the first argument, with X-Api-Key picked at random (seeded, so
-- runs are repeatable) from a fixed set of keys.
--
--   wrk ... -s keys.lua URL/check -- ORIGINAL_URI [NKEYS [SEED]]
--
-- The requests are formatted once in init() so that the per-request cost in
-- wrk is one table lookup: with -t1, wrk's own CPU must not be what limits
-- the daemon's numbers.

local requests = {}
local nkeys = 0

function init(args)
  local uri = args[1] or "/fw/x"
  nkeys = tonumber(args[2]) or 10000
  local seed = tonumber(args[3]) or 20240601
  math.randomseed(seed)
  for i = 1, nkeys do
    requests[i] = wrk.format("GET", "/check", {
      ["X-Original-URI"] = uri,
      ["X-Api-Key"] = "bench-key-" .. i,
    })
  end
end

function request()
  return requests[math.random(nkeys)]
end
