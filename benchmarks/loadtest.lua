-- wrk script of benchmarks/loadtest.py: a burst of POST /orders, each order with its own
-- Idempotency-Key and body, exactly LOADTEST_ORDERS of them across LOADTEST_THREADS threads.
--
-- Environment: LOADTEST_ORDERS (how many orders), LOADTEST_THREADS (wrk's -t),
-- LOADTEST_RUN (the Idempotency-Key prefix of this run), LOADTEST_TOKEN (the bearer token).
-- Thread k sends the orders k, k + threads, k + 2 * threads, ... and, on stderr (unbuffered),
-- one line per answer and one when its share is answered:
--   "R <status> <order_id or ->"   an answer to an order
--   "H <status>"                   an answer to a filler request (see request())
--   "D <thread>"                   every order of this thread has been answered
-- At the end (after SIGINT) the latency percentiles and socket errors go to stdout:
--   "L <p50 us> <p95 us> <p99 us> <max us> <requests>"
--   "E <connect> <read> <write> <timeout>"

local total = tonumber(os.getenv("LOADTEST_ORDERS"))
local threads = tonumber(os.getenv("LOADTEST_THREADS"))
local run = os.getenv("LOADTEST_RUN")
local token = os.getenv("LOADTEST_TOKEN")
local next_id = 0

function setup(thread)
   thread:set("first", next_id)
   next_id = next_id + 1
end

function init(args)
   index = first
   quota = 0
   if first < total then
      quota = math.floor((total - 1 - first) / threads) + 1
   end
   sent, fillers, answered, delays = 0, 0, 0, 0
   headers = {
      ["Authorization"] = "Bearer " .. token,
      ["Content-Type"] = "application/json",
   }
end

local function order(i)
   headers["Idempotency-Key"] = run .. "-" .. i
   -- Quantities stay within the simulated warehouses' stock (100 units of every SKU).
   local body = string.format('{"items":[{"sku":"A-%d","qty":%d}]}', i % 97, i % 9 + 1)
   return wrk.format("POST", "/orders", headers, body)
end

function request()
   if delays == 0 then
      -- wrk calls this once before the run to check the script (every request of the run
      -- comes after a delay() call): nothing is sent, so nothing is counted.
      return order(index)
   end
   if sent >= quota then
      -- Every order of this thread was sent: a connection whose delay below has passed,
      -- or one wrk reconnected, sends a cheap GET (answered "H", not an order).
      fillers = fillers + 1
      return wrk.format("GET", "/health")
   end
   local i = index
   index = index + threads
   sent = sent + 1
   return order(i)
end

function delay()
   delays = delays + 1
   -- Once every order of this thread is sent, a connection waits for the others' answers;
   -- a request every 4 s keeps it from the server's keep-alive timeout (5 s in uvicorn),
   -- so a closed connection is always the server dropping one.
   if sent >= quota then
      return 4000
   end
   return 0
end

function response(status, headers, body)
   answered = answered + 1
   if string.find(body, '"broker"', 1, true) then
      io.stderr:write(string.format("H %d\n", status))
   else
      local order = string.match(body, '"order_id":"(ord_[0-9a-f]+)"') or "-"
      io.stderr:write(string.format("R %d %s\n", status, order))
   end
   if sent >= quota and answered >= sent + fillers then
      io.stderr:write(string.format("D %d\n", first))
      wrk.thread:stop()
   end
end

function done(summary, latency, requests)
   io.write(string.format("L %d %d %d %d %d\n", latency:percentile(50), latency:percentile(95),
      latency:percentile(99), latency.max, summary.requests))
   local e = summary.errors
   io.write(string.format("E %d %d %d %d\n", e.connect, e.read, e.write, e.timeout))
end
