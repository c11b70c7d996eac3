-- enqueue_graph: create every task of a workflow, each waiting for the earlier tasks of the
-- call it names (in its queue's waiting zset, field "wf"), listed by them (field "D"), or
-- nothing.
--
-- KEYS[1] .. KEYS[6] the first task's keys as KEYS of enqueue.lua, KEYS[7] its queue's
-- waiting zset; per task i = 0, 1, ...: KEYS[1+7i .. 7+7i] likewise.
-- ARGV[1] now ("" = TIME)  ARGV[2] number of tasks
-- Per task i: ARGV[3+18i .. 19+18i] as ARGV of enqueue.lua, ARGV[20+18i] the 0-based
-- indexes of the earlier tasks it waits for, comma-separated ("" = none).
-- The workflow's record (absent: none), after the n tasks' keys and arguments:
-- KEYS[7n+1] its hash (P:{Q}:w:<id>), KEYS[7n+2] its queue's index of workflows,
-- KEYS[7n+3] that queue's zset of when the janitor looks at each;
-- ARGV[3+18n] its id, ARGV[4+18n] name, ARGV[5+18n] retention (s), ARGV[6+18n] nodes (JSON).
-- Returns {"ok", <the clock it read>} | {"conflict", <task index>, <HGETALL of the existing
-- task>} | {"duplicate", <task index>, <task id>}.
-- Complexity: O(n log m + e) for n tasks and e dependencies, plus O(log w) for the record
-- among w workflows of its queue.
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

local wo = 3 + 18 * n
if ARGV[wo] then
  local record, index, due = KEYS[7 * n + 1], KEYS[7 * n + 2], KEYS[7 * n + 3]
  local id = ARGV[wo]
  -- A record left by an older workflow of this id (its tasks all gone, or they would have
  -- been refused above) is replaced.
  local old = redis.call('HGET', record, 'created_at')
  if old then
    redis.call('ZREM', index, string.format('%020.6f', tonumber(old)) .. ':' .. id)
    redis.call('DEL', record)
  end
  -- To the microsecond, as the index and a listing's cursor spell it.
  local created = string.format('%.6f', now)
  redis.call('HSET', record, 'id', id, 'name', ARGV[wo + 1], 'created_at', created,
             'retention', ARGV[wo + 2], 'nodes', ARGV[wo + 3])
  redis.call('ZADD', index, 0, string.format('%020.6f', now) .. ':' .. id)
  redis.call('ZADD', due, now + tonumber(ARGV[wo + 2]), id)
end
return {'ok', now_s}
