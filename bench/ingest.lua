-- wrk script: POST /events as fast as possible, each with its own
-- idempotency key (so the dedupe check is exercised, as in production).
-- Usage: HOOKD_TOKEN=… wrk -t2 -c32 -d10s -s bench/ingest.lua http://127.0.0.1:8080
local counter = 0
local token = os.getenv("HOOKD_TOKEN") or ""
local threads = 0
-- Each wrk thread has its own Lua state: give each a distinct key prefix.
function setup(thread)
  threads = threads + 1
  thread:set("prefix", tostring(os.time()) .. "-t" .. threads)
end

function request()
  counter = counter + 1
  local body = '{"type":"bench.event","idempotency_key":"' .. prefix .. "-" .. counter ..
               '","payload":{"n":' .. counter .. ',"note":"a small payload of typical size"}}'
  return wrk.format("POST", "/events", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. token,
  }, body)
end

local statuses = {}
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  io.write(string.format("events accepted/s: %.0f  (p50 %.1f ms, p99 %.1f ms, non-2xx %d)\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.status))
end
