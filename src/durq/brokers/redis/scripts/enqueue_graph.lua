-- enqueue_graph: create every task of a workflow, each waiting for the earlier tasks of the
-- call it names (in its queue's waiting zset, field "wf"), listed by them (field "D"), or
-- nothing.
--
-- KEYS[1] .. KEYS[6] the first task's keys as KEYS of enqueue.lua, KEYS[7] its queue's
-- waiting zset; per task i = 0, 1, ...: KEYS[1+7i .. 7+7i] likewise.
-- ARGV[1] now ("" = TIME)  ARGV[2] number of tasks
-- Per task i: ARGV[3+18i .. 19+18i] as ARGV of enqueue.lua, ARGV[20+18i] the 0-based
-- indexes of the earlier tasks it waits for, comma-separated ("" = none).
-- Returns {"ok", <the clock it read>} | {"conflict", <task index>, <HGETALL of the existing
-- task>} | {"duplicate", <task index>, <task id>}.
-- Complexity: O(n log m + e) for n tasks and e dependencies.
local n = tonumber(ARGV[2])
local now_s = clock(ARGV[1])
local now = tonumber(now_s)

-- First every check, then every write: a refusal leaves nothing behind. (The client
-- refused a call naming one id or unique key twice before sending it.)
for i = 0, n - 1 do
  local ko, ao = 7 * i, 2 + 18 * i
  local refused = refusal(i, KEYS[ko + 1], KEYS[ko + 5], ARGV[ao + 12], now)
  if refused then
    return refused
  end
end

local woken = {}       -- one wake-up per queue, not per task
local listed = {}      -- dependency key -> the keys of its dependents
local order = {}       -- dependency keys in first-listed order: writes in a fixed order
for i = 0, n - 1 do
  local ko, ao = 7 * i, 2 + 18 * i
  local task_key = KEYS[ko + 1]
  local _, pending = enqueue_task(task_key, KEYS, ko + 1, now_s, ARGV, ao + 2)
  local edges = ARGV[ao + 18]
  if edges ~= '' then
    -- Out of the pending or scheduled zset enqueue_task put it in, into the waiting one.
    local m = redis.call('HGET', task_key, 'm')
    redis.call('ZREM', KEYS[ko + 2], m)
    redis.call('ZREM', KEYS[ko + 3], m)
    redis.call('ZADD', KEYS[ko + 7], now_s, m)
    local count = 0
    for j in string.gmatch(edges, '%d+') do
      local dep = KEYS[7 * tonumber(j) + 1]
      if not listed[dep] then
        listed[dep] = {}
        order[#order + 1] = dep
      end
      local list = listed[dep]
      list[#list + 1] = task_key
      count = count + 1
    end
    redis.call('HSET', task_key, 'state', 'waiting', 'wf', count)
  elseif pending and not woken[ARGV[ao + 2]] then
    woken[ARGV[ao + 2]] = true
    wake_workers(ARGV[ao + 2])
  end
end
for _, dep in ipairs(order) do
  redis.call('HSET', dep, 'D', cjson.encode(listed[dep]))
end
return {'ok', now_s}
