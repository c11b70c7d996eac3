-- admin_cancel: the inspector's "cancel" (W12). An active task is flagged; its worker sees
-- the flag on its next heartbeat, cancels the handler and archives it "cancelled".
-- pending/scheduled/retry are archived "cancelled" at once.
--
-- KEYS[1] task hash   KEYS[2] pending   KEYS[3] scheduled   KEYS[4] retry
-- KEYS[5] active      KEYS[6] completed KEYS[7] archived    KEYS[8] unique hash
-- ARGV[1] now
-- Returns {"ok", <HGETALL after>} | {"missing"} | {"state", <current state>}.
-- Complexity: O(log n).
local zsets = {pending = KEYS[2], scheduled = KEYS[3], retry = KEYS[4], active = KEYS[5],
  completed = KEYS[6], archived = KEYS[7]}
local cur = redis.call('HMGET', KEYS[1], 'state', 'm', 'expires_at')
if not cur[1] or (cur[1] == 'completed' and tonumber(cur[3]) <= tonumber(ARGV[1])) then
  return {'missing'}
end
if cur[1] == 'active' then
  redis.call('HSET', KEYS[1], 'cancel', '1')
elseif cur[1] == 'pending' or cur[1] == 'scheduled' or cur[1] == 'retry' then
  redis.call('ZREM', zsets[cur[1]], cur[2])
  free_unique(KEYS[8], KEYS[1])
  redis.call('HSET', KEYS[1], 'state', 'archived', 'archived_at', ARGV[1],
    'last_error', 'cancelled')
  redis.call('ZADD', KEYS[7], ARGV[1], cur[2])
else
  return {'state', cur[1]}
end
return {'ok', redis.call('HGETALL', KEYS[1])}
