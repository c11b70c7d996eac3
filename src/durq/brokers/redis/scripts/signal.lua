-- signal: deliver the signal ARGV[1] to a task (app.signal), once: its payload is kept in the
-- task hash as field "sg:<name>", the text as sent (never decoded, so it reads back byte for
-- byte); a task waiting for that name (field "aw", see retry.lua) is pending now, its
-- workers woken.
--
-- KEYS[1] task hash      KEYS[2] waiting zset      KEYS[3] pending zset
-- KEYS[4] awaiting zset (waits for a signal, by their end)
-- ARGV[1] signal name    ARGV[2] payload (JSON text)  ARGV[3] now ("" = TIME)
-- ARGV[4] wake-up channel
-- Returns "missing" (no such task, or completed past its retention: it counts as gone),
-- "duplicate" (a signal of that name is stored: nothing changed, whatever the state),
-- "finished" (completed or archived: nothing stored), "woken" or "kept".
-- Complexity: O(log n).
local cur = redis.call('HMGET', KEYS[1], 'state', 'expires_at', 'aw', 'm', 'prio')
local state = cur[1]
if not state then
  return 'missing'
end
if state == 'completed' or state == 'archived' then
  if state == 'completed' and cur[2] and tonumber(cur[2]) <= tonumber(clock(ARGV[3])) then
    return 'missing'
  end
  -- A sender calling again after the end is told "duplicate", as before the end.
  if redis.call('HEXISTS', KEYS[1], 'sg:' .. ARGV[1]) == 1 then
    return 'duplicate'
  end
  return 'finished'
end
if redis.call('HSETNX', KEYS[1], 'sg:' .. ARGV[1], ARGV[2]) == 0 then
  return 'duplicate'
end
if state ~= 'waiting' or cur[3] ~= ARGV[1] then
  return 'kept'
end
-- Due now, as a promotion would make it (its wait is over: "aw" goes).
local now = clock(ARGV[3])
redis.call('ZREM', KEYS[2], cur[4])
redis.call('ZREM', KEYS[4], cur[4])
redis.call('HSET', KEYS[1], 'state', 'pending', 'npa', now)
redis.call('HDEL', KEYS[1], 'aw')
redis.call('ZADD', KEYS[3], ready_score(now, cur[5]), cur[4])
fair_join(KEYS[1], cur[4])
wake_workers(ARGV[4])
return 'woken'
