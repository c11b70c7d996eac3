-- requeue: a shutting-down worker hands an active task back as pending (W7), due now on
-- the broker's clock (as every broker: the model's rule); no attempt is counted.
--
-- KEYS[1] task hash      KEYS[2] active zset      KEYS[3] pending zset
-- ARGV[1] fencing token  ARGV[2] wake-up channel  ARGV[3] now ('' = server TIME)
-- KEYS[4] limits hash    KEYS[5] waiting set (W13: the task's keys give their slot back)
-- ARGV[4] "1": the task keeps its sequences' keys (W25, see release_limits)
-- Returns 1, or 0 (nothing changed) when the lease is no longer held.
-- Complexity: O(log n).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'm', 'prio')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return 0
end
redis.call('ZREM', KEYS[2], cur[3])
release_limits(KEYS[1], KEYS[4], KEYS[5], ARGV[4] == '1' and 'keep' or nil)
local now = clock(ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'pending', 'npa', now)
redis.call('HDEL', KEYS[1], 'token', 'lease_expires_at', 'cancel', 'worker_id')
redis.call('ZADD', KEYS[3], ready_score(now, cur[4]), cur[3])
fair_join(KEYS[1], cur[3])
wake_workers(ARGV[2])
return 1
