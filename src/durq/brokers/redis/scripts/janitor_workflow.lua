-- janitor_workflow: drop a workflow's record once none of its nodes' tasks is left; else
-- look at it again in a minute.
--
-- KEYS[1] the record's hash (P:{Q}:w:<id>), KEYS[2] its queue's index of workflows,
-- KEYS[3] that queue's zset of when the janitor looks at each, KEYS[4..] its nodes' task
-- hashes.
-- ARGV[1] now ("" = TIME)  ARGV[2] the workflow id.
-- Returns 1 when the record was dropped, else 0.
-- Complexity: O(k + log w) for k nodes among w workflows of the queue.
local now = tonumber(clock(ARGV[1]))
local id = ARGV[2]
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('ZADD', KEYS[3], now + 60, id)
    return 0
  end
end
local created = redis.call('HGET', KEYS[1], 'created_at')
if created then
  redis.call('ZREM', KEYS[2], string.format('%020.6f', tonumber(created)) .. ':' .. id)
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], id)
return 1
