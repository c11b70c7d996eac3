-- archive: give up on an active task (retries used up, SkipRetry, cancelled, worker lost).
--
-- KEYS[1] task hash      KEYS[2] active zset      KEYS[3] archived zset
-- KEYS[4] unique hash    KEYS[5] stats hash       KEYS[6] stats hash of the day
-- ARGV[1] fencing token  ARGV[2] now ("" = TIME) ARGV[3] error
-- ARGV[4] "1" to count the attempt (retried + 1 and the counters)
-- ARGV[5] TTL of the daily counters (s)
-- ARGV[6] "1" to add one to lost (the rescuer)
-- ARGV[7] "" or a time: also fenced by the lease having expired by then and by now
--         (the rescuer)
-- KEYS[7] per-minute counters of the day    ARGV[8] their TTL (s)
-- KEYS[8] limits hash    KEYS[9] waiting set (W13: the task's keys give their slot back)
-- ARGV[9] wake-up channel (published when tasks are held on one of those keys)
-- Then, per follow-up task i = 0, 1, ...: KEYS[10+6i .. 15+6i]
-- and ARGV[10+17i .. 26+17i] as KEYS and ARGV of enqueue.lua (see complete.lua).
-- Then the attempt's traceback ("" for none), a group member's final state ("" for no group
-- member) and its entry: the last three ARGV.
-- Last ARGV: the attempt's traceback, "" for none.
-- Publishes on the task's end channel (KEYS[1] .. ':end', see keys.py) when it changed.
-- Returns 1, or 0 (nothing changed) when the fence fails.
-- Complexity: O(log n).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'm', 'lease_expires_at', 'D')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return 0
end
local now = clock(ARGV[2])
if ARGV[7] ~= '' and not (cur[4] and tonumber(cur[4]) <= tonumber(earliest(ARGV[7], now))) then
  return 0
end
redis.call('ZREM', KEYS[2], cur[3])
if release_limits(KEYS[1], KEYS[8], KEYS[9]) then
  wake_workers(ARGV[9])
end
free_unique(KEYS[4], KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'archived', 'last_error', ARGV[3], 'archived_at', now)
redis.call('HDEL', KEYS[1], 'token', 'lease_expires_at', 'cancel')
if ARGV[#ARGV - 2] ~= '' then
  redis.call('HSET', KEYS[1], 'traceback', ARGV[#ARGV - 2])
else
  redis.call('HDEL', KEYS[1], 'traceback')
end
redis.call('ZADD', KEYS[3], now, cur[3])
if ARGV[4] == '1' then
  redis.call('HINCRBY', KEYS[1], 'retried', 1)
  count(KEYS[5], KEYS[6], ARGV[5], 1, 1, KEYS[7], now, ARGV[8])
end
if ARGV[6] == '1' then
  redis.call('HINCRBY', KEYS[1], 'lost', 1)
end
enqueue_follow_ups(9, 9)
if ARGV[#ARGV - 1] ~= '' then
  finish_member(KEYS[1], ARGV[#ARGV - 1], ARGV[#ARGV], now)
end
release_dependents(KEYS[1], cur[5], now)
redis.call('PUBLISH', KEYS[1] .. ':end', '1')
return 1
