-- admin_archive: the inspector's "archive": pending/scheduled/retry -> archived (I3).
-- Also the inspector's "cancel" of a task that is not active yet (ARGV[2] = "cancelled").
--
-- KEYS[1] task hash   KEYS[2] pending   KEYS[3] scheduled   KEYS[4] retry
-- KEYS[5] active      KEYS[6] completed KEYS[7] archived    KEYS[8] unique hash
-- ARGV[1] now         ARGV[2] last_error to set ("" keeps the current one)
-- Returns {"ok", <HGETALL after>} | {"missing"} | {"state", <current state>}.
-- Complexity: O(log n).
local zsets = {pending = KEYS[2], scheduled = KEYS[3], retry = KEYS[4], active = KEYS[5],
  completed = KEYS[6], archived = KEYS[7]}
local cur = redis.call('HMGET', KEYS[1], 'state', 'm', 'expires_at')
if not cur[1] or (cur[1] == 'completed' and tonumber(cur[3]) <= tonumber(ARGV[1])) then
  return {'missing'}
end
if cur[1] ~= 'pending' and cur[1] ~= 'scheduled' and cur[1] ~= 'retry' then
  return {'state', cur[1]}
end
redis.call('ZREM', zsets[cur[1]], cur[2])
free_unique(KEYS[8], KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'archived', 'archived_at', ARGV[1])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'last_error', ARGV[2])
end
redis.call('ZADD', KEYS[7], ARGV[1], cur[2])
return {'ok', redis.call('HGETALL', KEYS[1])}
