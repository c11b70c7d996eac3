-- rescue: recover active tasks of one queue whose lease expired (their worker died, W1).
-- Each gets retried + 1 and lost + 1 and becomes retry (due now, "lease expired"), or is
-- archived when lost >= max_lost ("worker lost") or its retries are used up.
--
-- KEYS[1] active zset    KEYS[2] retry zset       KEYS[3] archived zset
-- KEYS[4] unique hash    KEYS[5] stats hash       KEYS[6] stats hash of the day
-- ARGV[1] now            ARGV[2] task key prefix  ARGV[3] max_lost
-- ARGV[4] bound          ARGV[5] TTL of the daily counters (s)   ARGV[6] wake-up channel
-- Returns a list of <HGETALL of each rescued task as it is now>.
-- Complexity: O(k log n) for k rescued tasks.
local now, max_lost = ARGV[1], tonumber(ARGV[3])
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
local retried_any = false
for _, m in ipairs(expired) do
  redis.call('ZREM', KEYS[1], m)
  local key = ARGV[2] .. member_id(m)
  if redis.call('EXISTS', key) == 1 then
    local before = tonumber(redis.call('HGET', key, 'retried') or '0')
    local max_retry = tonumber(redis.call('HGET', key, 'max_retry') or '0')
    redis.call('HINCRBY', key, 'retried', 1)
    local lost = redis.call('HINCRBY', key, 'lost', 1)
    redis.call('HDEL', key, 'token', 'lease_expires_at', 'cancel')
    if lost >= max_lost then
      free_unique(KEYS[4], key)
      redis.call('HSET', key, 'state', 'archived', 'last_error', 'worker lost', 'archived_at', now)
      redis.call('ZADD', KEYS[3], now, m)
    elseif before >= max_retry then
      free_unique(KEYS[4], key)
      redis.call('HSET', key, 'state', 'archived', 'last_error', 'lease expired', 'archived_at', now)
      redis.call('ZADD', KEYS[3], now, m)
    else
      redis.call('HSET', key, 'state', 'retry', 'last_error', 'lease expired', 'npa', now)
      redis.call('ZADD', KEYS[2], now, m)
      retried_any = true
    end
    table.insert(out, redis.call('HGETALL', key))
  end
end
count(KEYS[5], KEYS[6], ARGV[5], #out, #out)
if retried_any then
  redis.call('PUBLISH', ARGV[6], '1')
end
return out
