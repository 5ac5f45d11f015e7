-- wrk script: invokes one hiber-router function over and over (docs/router.md, POST
-- /v2/models/{fn}/infer with an application/octet-stream body) on wrk's keep-alive connections,
-- and prints latency percentiles at the end. scripts/router-bench.sh runs it.
--
--   HIBER_FUNCTION=echo HIBER_BODY=ping wrk -t2 -c16 -d10s -s bench/router_invoke.lua \
--       http://127.0.0.1:PORT
--
-- Environment: HIBER_FUNCTION (default echo), HIBER_BODY (default "ping") or HIBER_BODY_FILE
-- (the body read from a file), HIBER_LABEL (the RESULT lines' label, default "router").
-- Prints "RESULT label=L name=router_p50|router_p99|router_p999|router_mean value=N unit=us",
-- "name=router_rate unit=per_s" (answers per second) and "name=router_errors unit=count"
-- (connect, read, write, timeout errors and non-2xx/3xx answers together).

local fn = os.getenv("HIBER_FUNCTION") or "echo"
local body = os.getenv("HIBER_BODY") or "ping"
local body_file = os.getenv("HIBER_BODY_FILE")
if body_file and body_file ~= "" then
  local f = assert(io.open(body_file, "rb"))
  body = f:read("*a")
  f:close()
end

wrk.method = "POST"
wrk.path = "/v2/models/" .. fn .. "/infer"
wrk.body = body
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Connection"] = "keep-alive"

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
