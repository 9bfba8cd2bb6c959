-- wrk script for bench/gateway: POST the body named by PVISOR_BENCH_BODY_FILE and print one
-- JSON line of latency percentiles (microseconds) when done.
local f = assert(io.open(os.getenv("PVISOR_BENCH_BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench-not-a-secret"

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"p50_us": %d, "p99_us": %d, "requests": %d, "errors": %d, "non2xx": %d, "duration_us": %d}\n',
    latency:percentile(50), latency:percentile(99), summary.requests,
    e.connect + e.read + e.write + e.timeout, e.status, summary.duration))
end
