-- retry: the attempt failed; wait in retry until next_process_at, retried + 1.
--
-- KEYS[1] task hash      KEYS[2] active zset      KEYS[3] retry zset
-- KEYS[4] stats hash     KEYS[5] stats hash of the day
-- ARGV[1] fencing token  ARGV[2] error            ARGV[3] next_process_at
-- ARGV[4] TTL of the daily counters (s)
-- Returns 1, or 0 (nothing changed) when the lease is no longer held.
-- Complexity: O(log n).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'm')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return 0
end
redis.call('ZREM', KEYS[2], cur[3])
redis.call('HINCRBY', KEYS[1], 'retried', 1)
redis.call('HSET', KEYS[1], 'state', 'retry', 'last_error', ARGV[2], 'npa', ARGV[3])
redis.call('HDEL', KEYS[1], 'token', 'lease_expires_at', 'cancel')
redis.call('ZADD', KEYS[3], ARGV[3], cur[3])
count(KEYS[4], KEYS[5], ARGV[4], 1, 1)
return 1
