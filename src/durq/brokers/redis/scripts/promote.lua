-- promote: move due scheduled/retry tasks of one queue to pending, and tasks whose wait for
-- a signal ran out (ctx.wait_for's timeout, so that the handler runs again and raises it),
-- bounded per call.
--
-- KEYS[1] pending zset   KEYS[2] scheduled zset   KEYS[3] retry zset
-- KEYS[4] waiting zset   KEYS[5] awaiting zset (waits for a signal, by their end)
-- ARGV[1] now ("" = TIME) ARGV[2] task key prefix ARGV[3] bound (per source zset)
-- ARGV[4] wake-up channel
-- Returns how many moved (integer).
-- Complexity: O(f log n) for f forwarded tasks.
local bound, now = tonumber(ARGV[3]), clock(ARGV[1])
local moved = forward_due(KEYS[2], KEYS[1], ARGV[2], now, bound)
  + forward_due(KEYS[3], KEYS[1], ARGV[2], now, bound)
local ended = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'WITHSCORES', 'LIMIT', 0, bound)
for i = 1, #ended, 2 do
  local m, score = ended[i], ended[i + 1]
  redis.call('ZREM', KEYS[5], m)
  local key = ARGV[2] .. member_id(m)
  local cur = redis.call('HMGET', key, 'state', 'aw', 'prio')
  -- Only a task still waiting for a signal (an inspector's move may have taken it since).
  if cur[1] == 'waiting' and cur[2] then
    redis.call('ZREM', KEYS[4], m)
    redis.call('HSET', key, 'state', 'pending')
    redis.call('ZADD', KEYS[1], ready_score(score, cur[3]), m)
    fair_join(key, m)
    moved = moved + 1
  end
end
if moved > 0 then
  wake_workers(ARGV[4])
end
return moved
