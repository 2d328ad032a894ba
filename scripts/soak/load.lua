-- wrk script for `make soak`: /check requests over the soak policy's
-- routes, X-Api-Key over a few thousand keys (a fifth of the requests on a
-- few hot keys, so that denials happen), counting the replies by status.
--
--   SOAK_WRK_OUT=FILE wrk -t1 ... -s load.lua URL/check -- ROUTES NKEYS SEED
--
-- ROUTES is a comma-separated list of route path prefixes (fw,swl,...).
-- With -t1 all the counts live in one thread; done() copies them out with
-- thread:get and writes FILE, one "name value" a line (done() runs in
-- wrk's main Lua state, which init() never sees: hence the environment
-- variable rather than an argument):
--   status_NNN   replies with that status
--   degraded     200s and 503s with X-RateLimit-Remaining: -1 (the
--                failure mode answered: Redis did not)
--   err_connect, err_read, err_write, err_status, err_timeout  wrk's errors
--   requests, latency_p99_us, latency_max_us

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

local routes = {}
local nkeys = 3000

function init(args)
  for r in string.gmatch(args[1] or "fw", "[^,]+") do
    table.insert(routes, "/" .. r .. "/item")
  end
  nkeys = tonumber(args[2]) or nkeys
  math.randomseed(tonumber(args[3]) or 1)
  counts = {}
end

-- A route at random; 4 requests in 5 on a key drawn from nkeys, 1 in 5 on
-- one of 8 hot keys, which go over their limits.
function request()
  local key
  if math.random(5) == 1 then
    key = "hot-" .. math.random(8)
  else
    key = "k-" .. math.random(nkeys)
  end
  return wrk.format("GET", "/check", {
    ["X-Original-URI"] = routes[math.random(#routes)],
    ["X-Api-Key"] = key,
  })
end

function response(status, headers, body)
  local k = "status_" .. status
  counts[k] = (counts[k] or 0) + 1
  local rem = headers["X-RateLimit-Remaining"] or headers["x-ratelimit-remaining"]
  if rem == "-1" then
    counts.degraded = (counts.degraded or 0) + 1
  end
end

function done(summary, latency, _)
  local out = assert(io.open(os.getenv("SOAK_WRK_OUT"), "w"))
  local total = {}
  for _, t in ipairs(threads) do
    local c = t:get("counts") or {}
    for k, v in pairs(c) do
      total[k] = (total[k] or 0) + v
    end
  end
  for k, v in pairs(total) do
    out:write(k, " ", v, "\n")
  end
  local e = summary.errors
  out:write("err_connect ", e.connect, "\n", "err_read ", e.read, "\n",
            "err_write ", e.write, "\n", "err_status ", e.status, "\n",
            "err_timeout ", e.timeout, "\n")
  out:write("requests ", summary.requests, "\n")
  out:write("latency_p99_us ", latency:percentile(99), "\n")
  out:write("latency_max_us ", latency.max, "\n")
  out:close()
end
