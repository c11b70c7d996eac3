-- claim: lease up to ARGV[2] claimable tasks of one queue, in pending-score order (priority,
-- then ready time, then enqueue order). Due scheduled/retry tasks are forwarded to pending
-- first (bounded), so they are claimable without waiting for a promoter.
--
-- KEYS[1] pending zset   KEYS[2] scheduled zset   KEYS[3] retry zset
-- KEYS[4] active zset    KEYS[5] paused flag
-- ARGV[1] now ("" = TIME) ARGV[2] limit           ARGV[3] lease length (s)
-- ARGV[4] worker id      ARGV[5] token base (a fresh random string per call)
-- ARGV[6] task key prefix ("P:{Q}:t:")           ARGV[7] forward bound
-- Returns a list of {token, <HGETALL of the task as now active>}, in claim order.
-- Complexity: O((f + k) log n) for f forwarded and k claimed tasks.
if redis.call('EXISTS', KEYS[5]) == 1 then
  return {}
end
local now, limit, bound = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[7])
local expires = later(now, ARGV[3])
forward_due(KEYS[2], KEYS[1], ARGV[6], now, bound)
forward_due(KEYS[3], KEYS[1], ARGV[6], now, bound)

local out = {}
local popped = redis.call('ZPOPMIN', KEYS[1], limit)
for i = 1, #popped, 2 do
  local m = popped[i]
  local key = ARGV[6] .. member_id(m)
  if redis.call('EXISTS', key) == 1 then
    local token = ARGV[5] .. '.' .. tostring((i + 1) / 2)
    redis.call('HSET', key, 'state', 'active', 'token', token, 'started_at', now,
      'lease_expires_at', expires, 'worker_id', ARGV[4])
    redis.call('HDEL', key, 'cancel')
    redis.call('ZADD', KEYS[4], expires, m)
    table.insert(out, {token, redis.call('HGETALL', key)})
  end
end
return out
