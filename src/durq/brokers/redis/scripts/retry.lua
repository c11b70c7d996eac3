-- retry: the attempt failed (or its lease expired); wait in retry for the delay (from the
-- broker's clock), retried + 1. A snooze (ARGV[12]) waits in scheduled instead, snoozes + 1,
-- retried, last_error, traceback and the failure counters left alone; a snooze that waits for
-- a signal (ARGV[13]) is waiting (KEYS[10], and KEYS[11] by the end of its wait), or pending
-- at once when that signal was delivered already.
--
-- KEYS[1] task hash      KEYS[2] active zset      KEYS[3] retry zset (scheduled: a snooze)
-- KEYS[4] stats hash     KEYS[5] stats hash of the day
-- ARGV[1] fencing token  ARGV[2] error            ARGV[3] delay (s)
-- ARGV[4] TTL of the daily counters (s)
-- ARGV[5] "1" to add one to lost (the rescuer)
-- ARGV[6] "" or a time: also fenced by the lease having expired by then and by now
--         (the rescuer)
-- ARGV[7] "" or the wake-up channel to publish on (the retry is due now)
-- ARGV[8] the attempt's traceback, "" for none
-- ARGV[9] now ("" = TIME)
-- KEYS[6] per-minute counters of the day    ARGV[10] their TTL (s)
-- KEYS[7] limits hash    KEYS[8] waiting set (W13: the task's keys give their slot back)
-- ARGV[11] wake-up channel (published when tasks are held on one of those keys)
-- ARGV[12] "1": a snooze
-- ARGV[13] the signal the task waits for (field "aw"; "" clears it: names are never empty)
-- KEYS[9] pending zset: a snooze waiting for a signal the task holds already (field
--         "sg:<name>", see signal.lua) is pending now instead, its workers woken (ARGV[11])
-- KEYS[10] waiting zset  KEYS[11] awaiting zset (waits for a signal, by their end)
-- ARGV[14] "1": the task keeps its sequences' keys (W25, see release_limits)
-- Returns 1, or 0 (nothing changed) when the fence fails.
-- Complexity: O(log n).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'm', 'lease_expires_at', 'prio')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return 0
end
local now = clock(ARGV[9])
if ARGV[6] ~= '' and not (cur[4] and tonumber(cur[4]) <= tonumber(earliest(ARGV[6], now))) then
  return 0
end
local npa = later(now, ARGV[3])
local awaits = ARGV[13]
-- The signal came while the attempt ran: the wait ends before it starts.
local ready = ARGV[12] == '1' and awaits ~= ''
  and redis.call('HEXISTS', KEYS[1], 'sg:' .. awaits) == 1
if ready then
  npa = now
end
redis.call('ZREM', KEYS[2], cur[3])
if release_limits(KEYS[1], KEYS[7], KEYS[8], ARGV[14] == '1' and 'keep' or nil) then
  wake_workers(ARGV[11])
end
if ARGV[5] == '1' then
  redis.call('HINCRBY', KEYS[1], 'lost', 1)
end
if ARGV[12] == '1' then
  redis.call('HINCRBY', KEYS[1], 'snoozes', 1)
  local state = ready and 'pending' or awaits ~= '' and 'waiting' or 'scheduled'
  redis.call('HSET', KEYS[1], 'state', state, 'npa', npa)
else
  redis.call('HINCRBY', KEYS[1], 'retried', 1)
  redis.call('HSET', KEYS[1], 'state', 'retry', 'last_error', ARGV[2], 'npa', npa)
  if ARGV[8] ~= '' then
    redis.call('HSET', KEYS[1], 'traceback', ARGV[8])
  else
    redis.call('HDEL', KEYS[1], 'traceback')
  end
end
-- Every move says what the task waits for next, so a stale name never wakes it.
if awaits ~= '' then
  redis.call('HSET', KEYS[1], 'aw', awaits)
  redis.call('HDEL', KEYS[1], 'token', 'lease_expires_at', 'cancel')
else
  redis.call('HDEL', KEYS[1], 'token', 'lease_expires_at', 'cancel', 'aw')
end
if ARGV[12] ~= '1' then
  count(KEYS[4], KEYS[5], ARGV[4], 1, 1, KEYS[6], now, ARGV[10])
end
if ready then
  redis.call('ZADD', KEYS[9], ready_score(npa, cur[5]), cur[3])
  fair_join(KEYS[1], cur[3])
  wake_workers(ARGV[11])
  return 1
end
if ARGV[12] == '1' and awaits ~= '' then
  -- Not claimable: the signal (signal.lua) or the end of the wait (promote.lua) wakes it.
  redis.call('ZADD', KEYS[10], now, cur[3])
  redis.call('ZADD', KEYS[11], npa, cur[3])
  return 1
end
redis.call('ZADD', KEYS[3], npa, cur[3])
if ARGV[7] ~= '' then
  wake_workers(ARGV[7])
end
return 1
