-- wrk script: invokes hiber-router functions over and over (docs/router.md, POST
-- /v2/models/{fn}/infer with an application/octet-stream body) on wrk's keep-alive connections,
-- and prints latency percentiles at the end. scripts/router-bench.sh runs it.
--
--   HIBER_FUNCTIONS=echo-0,echo-1 HIBER_BODY=ping wrk -t2 -c16 -d10s -s bench/router_invoke.lua \
--       http://127.0.0.1:PORT
--
-- Environment: HIBER_FUNCTIONS, a comma-separated list of functions that successive requests
-- take in turn (hiberd runs one request of a function at a time, so a throughput run spreads
-- its requests over several functions); else HIBER_FUNCTION (default echo). HIBER_BODY (default
-- "ping") or HIBER_BODY_FILE (the body read from a file), HIBER_CONTENT_TYPE (default
-- application/octet-stream), HIBER_LABEL (the RESULT lines' label, default "router").
-- Prints "RESULT label=L name=router_p50|router_p99|router_p999|router_mean value=N unit=us",
-- "name=router_rate unit=per_s" (answers per second) and "name=router_errors unit=count"
-- (connect, read, write, timeout errors and non-2xx/3xx answers together).

local body = os.getenv("HIBER_BODY") or "ping"
local body_file = os.getenv("HIBER_BODY_FILE")
if body_file and body_file ~= "" then
  local f = assert(io.open(body_file, "rb"))
  body = f:read("*a")
  f:close()
end

local functions = {}
for name in string.gmatch(os.getenv("HIBER_FUNCTIONS") or "", "[^,]+") do
  table.insert(functions, name)
end
if #functions == 0 then functions = {os.getenv("HIBER_FUNCTION") or "echo"} end

wrk.method = "POST"
wrk.path = "/v2/models/" .. functions[1] .. "/infer"
wrk.body = body
wrk.headers["Content-Type"] = os.getenv("HIBER_CONTENT_TYPE") or "application/octet-stream"
wrk.headers["Connection"] = "keep-alive"

-- Each wrk thread gets its number, so the threads start at different functions.
local threads = 0
function setup(thread)
  thread:set("thread_number", threads)
  threads = threads + 1
end

-- With one function wrk sends its one prepared request; with several, each request is formatted
-- once here and request() only picks the next.
local requests = {}
local next_request = 1
function init(args)
  for i, name in ipairs(functions) do
    requests[i] = wrk.format(nil, "/v2/models/" .. name .. "/infer")
  end
  next_request = ((thread_number or 0) % #requests) + 1
end

if #functions > 1 then
  function request()
    local r = requests[next_request]
    next_request = next_request % #requests + 1
    return r
  end
end

function done(summary, latency, requests)
  local label = os.getenv("HIBER_LABEL") or "router"
  local function result(name, value, unit)
    io.write(string.format("RESULT label=%s name=%s value=%.3f unit=%s\n", label, name, value, unit))
  end
  local e = summary.errors
  local errors = e.connect + e.read + e.write + e.status + e.timeout
  result("router_p50", latency:percentile(50), "us")
  result("router_p99", latency:percentile(99), "us")
  result("router_p999", latency:percentile(99.9), "us")
  result("router_mean", latency.mean, "us")
  result("router_rate", summary.requests / (summary.duration / 1e6), "per_s")
  result("router_errors", errors, "count")
end
