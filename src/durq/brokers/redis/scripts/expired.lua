-- expired: active tasks of one queue whose lease expired by now (their worker died, W1).
-- Read only, except for members whose task hash is gone (dropped from the zset).
--
-- KEYS[1] active zset
-- ARGV[1] now ("" = TIME) ARGV[2] task key prefix ARGV[3] bound
-- Returns a list of <HGETALL of each task> (with its fencing token in field "token").
-- Complexity: O(k log n) for k expired leases.
local now = clock(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, m in ipairs(expired) do
  local key = ARGV[2] .. member_id(m)
  if redis.call('EXISTS', key) == 1 then
    table.insert(out, redis.call('HGETALL', key))
  else
    redis.call('ZREM', KEYS[1], m)
  end
end
return out
