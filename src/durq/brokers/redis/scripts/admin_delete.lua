-- admin_delete: the inspector's "delete": any state but active (cancel it first) (I3).
--
-- KEYS[1] task hash   KEYS[2] pending   KEYS[3] scheduled   KEYS[4] retry
-- KEYS[5] active      KEYS[6] completed KEYS[7] archived    KEYS[8] unique hash
-- ARGV[1] now
-- Returns {"ok"} | {"missing"} | {"state", "active"}.
-- Complexity: O(log n).
local zsets = {pending = KEYS[2], scheduled = KEYS[3], retry = KEYS[4], active = KEYS[5],
  completed = KEYS[6], archived = KEYS[7]}
local cur = redis.call('HMGET', KEYS[1], 'state', 'm', 'expires_at')
if not cur[1] or (cur[1] == 'completed' and tonumber(cur[3]) <= tonumber(ARGV[1])) then
  return {'missing'}
end
if cur[1] == 'active' then
  return {'state', cur[1]}
end
redis.call('ZREM', zsets[cur[1]], cur[2])
free_unique(KEYS[8], KEYS[1])
redis.call('DEL', KEYS[1])
return {'ok'}
