-- complete: the handler returned. Completed with its result for the retention, or deleted.
--
-- KEYS[1] task hash      KEYS[2] active zset      KEYS[3] completed zset
-- KEYS[4] unique hash    KEYS[5] stats hash       KEYS[6] stats hash of the day
-- ARGV[1] fencing token  ARGV[2] now ("" = TIME) ARGV[3] retention, s ("0" = delete)
-- ARGV[4] unused         ARGV[5] "1" if a result follows    ARGV[6] result
-- ARGV[7] TTL of the daily counters (s)
-- KEYS[7] per-minute counters of the day    ARGV[8] their TTL (s)
-- KEYS[8] limits hash    KEYS[9] waiting set (W13: the task's keys give their slot back)
-- ARGV[9] wake-up channel (published when tasks are held on one of those keys)
-- Then, per follow-up (continuation) i = 0, 1, ...: KEYS[10+6i .. 15+6i] and
-- ARGV[10+17i .. 26+17i] as KEYS and ARGV of enqueue.lua. Created only if the lease is held;
-- one whose id is taken is skipped. Keys of another queue are another hash slot: atomic on
-- a single node, refused by a Redis Cluster.
-- Last two ARGV: a group member's final state ("" for no group member) and its entry.
-- Tasks waiting for this one count it (release_dependents in _lib.lua).
-- Publishes on the task's end channel (KEYS[1] .. ':end', see keys.py) when it changed.
-- Returns 1, or 0 (nothing changed) when the lease is no longer held.
-- Complexity: O(log n).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'm', 'D')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return 0
end
redis.call('ZREM', KEYS[2], cur[3])
if release_limits(KEYS[1], KEYS[8], KEYS[9]) then
  wake_workers(ARGV[9])
end
free_unique(KEYS[4], KEYS[1])
local now = clock(ARGV[2])
if ARGV[#ARGV - 1] ~= '' then
  finish_member(KEYS[1], ARGV[#ARGV - 1], ARGV[#ARGV], now)
end
release_dependents(KEYS[1], cur[4], now)
if tonumber(ARGV[3]) > 0 then
  local expires = later(now, ARGV[3])
  redis.call('HSET', KEYS[1], 'state', 'completed', 'completed_at', now,
    'expires_at', expires, 'retention', ARGV[3])
  redis.call('HDEL', KEYS[1], 'token', 'lease_expires_at', 'cancel')
  if ARGV[5] == '1' then
    set_chunked(KEYS[1], 'r', ARGV[6])
  end
  redis.call('ZADD', KEYS[3], expires, cur[3])
else
  redis.call('DEL', KEYS[1])
end
count(KEYS[5], KEYS[6], ARGV[7], 1, 0, KEYS[7], now, ARGV[8])
enqueue_follow_ups(9, 9)
redis.call('PUBLISH', KEYS[1] .. ':end', '1')
return 1
