-- admin_run: the inspector's "run now": scheduled/retry/archived -> pending (I3).
--
-- KEYS[1] task hash   KEYS[2] pending   KEYS[3] scheduled   KEYS[4] retry
-- KEYS[5] active      KEYS[6] completed KEYS[7] archived    KEYS[8] unique hash
-- ARGV[1] now         ARGV[2] wake-up channel
-- Returns {"ok", <HGETALL after>} | {"missing"} | {"state", <current state>}.
-- Complexity: O(log n).
local zsets = {pending = KEYS[2], scheduled = KEYS[3], retry = KEYS[4], active = KEYS[5],
  completed = KEYS[6], archived = KEYS[7]}
local cur = redis.call('HMGET', KEYS[1], 'state', 'm', 'expires_at')
if not cur[1] or (cur[1] == 'completed' and tonumber(cur[3]) <= tonumber(ARGV[1])) then
  return {'missing'}
end
if cur[1] ~= 'scheduled' and cur[1] ~= 'retry' and cur[1] ~= 'archived' then
  return {'state', cur[1]}
end
redis.call('ZREM', zsets[cur[1]], cur[2])
redis.call('HSET', KEYS[1], 'state', 'pending', 'npa', ARGV[1])
-- A fresh start for the poison-pill count, as on the SQL brokers (lost 0 is not stored).
redis.call('HDEL', KEYS[1], 'archived_at', 'lost', 'cancel')
redis.call('ZADD', KEYS[2], ARGV[1], cur[2])
redis.call('PUBLISH', ARGV[2], '1')
return {'ok', redis.call('HGETALL', KEYS[1])}
