-- admin_run_all: run up to ARGV[3] tasks of one state (scheduled, retry, archived) now.
-- The broker calls it again until it returns fewer than ARGV[3].
--
-- KEYS[1] source zset (of that state)   KEYS[2] pending zset
-- ARGV[1] now            ARGV[2] task key prefix  ARGV[3] batch size
-- ARGV[4] wake-up channel
-- Returns how many ran (integer).
-- Complexity: O(k log n) for k tasks.
local batch = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1)
for _, m in ipairs(batch) do
  redis.call('ZREM', KEYS[1], m)
  local key = ARGV[2] .. member_id(m)
  redis.call('HSET', key, 'state', 'pending', 'npa', ARGV[1])
  redis.call('HDEL', key, 'archived_at', 'lost', 'cancel')  -- lost 0: a fresh poison-pill count
  redis.call('ZADD', KEYS[2], ready_score(ARGV[1], redis.call('HGET', key, 'prio')), m)
  fair_join(key, m)
end
if #batch > 0 then
  wake_workers(ARGV[4])
end
return #batch
