-- enqueue_after: create one task that waits for others (enqueue after=), in the same step
-- as its dependencies list it.
--
-- KEYS[1] task hash .. KEYS[6] and ARGV[1] now .. ARGV[17]: as enqueue.lua
-- KEYS[7] this queue's waiting zset
-- KEYS[8..] the dependencies' task hashes (another queue is another slot: single node only)
-- A dependency that is missing, completed or archived counts as done. Each other one lists
-- the task (its field "D", see _lib.lua); the task then waits for as many (state waiting,
-- field "wf", in the waiting zset by enqueue time) instead of being pending or scheduled.
-- Returns {"ok", <the clock it read>, <dependencies waited for>} | enqueue.lua's refusals.
-- Complexity: O(log n + d * s), d dependencies, s the dependents each already lists.
local now_s = clock(ARGV[1])
local held = {}
for i = 8, #KEYS do
  local state = redis.call('HGET', KEYS[i], 'state')
  if state and state ~= 'completed' and state ~= 'archived' then
    held[#held + 1] = KEYS[i]
  end
end
local reply, pending = enqueue_task(KEYS[1], KEYS, 1, now_s, ARGV, 2)
if type(reply) == 'table' then
  return reply
end
if #held == 0 then
  if pending then
    wake_workers(ARGV[2])
  end
  return {'ok', reply, 0}
end
-- Out of the pending or scheduled zset enqueue_task put it in, into the waiting one.
local m = redis.call('HGET', KEYS[1], 'm')
redis.call('ZREM', KEYS[2], m)
redis.call('ZREM', KEYS[3], m)
redis.call('ZADD', KEYS[7], now_s, m)
redis.call('HSET', KEYS[1], 'state', 'waiting', 'wf', #held)
for _, key in ipairs(held) do
  local raw = redis.call('HGET', key, 'D')
  local list = {}
  if raw then
    list = cjson.decode(raw)
  end
  list[#list + 1] = KEYS[1]
  redis.call('HSET', key, 'D', cjson.encode(list))
end
return {'ok', reply, #held}
