-- admin_move: the inspector's run, archive and delete of a task that is not active (I3),
-- fenced by the state the move was decided on, with the follow-ups of an archive.
--
-- KEYS[1] task hash   KEYS[2] pending   KEYS[3] scheduled   KEYS[4] retry
-- KEYS[5] active      KEYS[6] completed KEYS[7] archived    KEYS[8] unique hash
-- KEYS[9] held zset (W13: a held pending task leaves it too)
-- KEYS[10] limits hash   KEYS[11] waiting set (W25: an archived or deleted task gives back
--          the sequences' keys it kept; the workers are woken if tasks are held on them)
-- ARGV[1] now         ARGV[2] expected state (the fence)
-- ARGV[3] to: "pending" (due now, wakes workers) | "archived" | "deleted"
-- ARGV[4] last_error to set ("" keeps the current one)      ARGV[5] wake-up channel
-- Then, per follow-up i = 0, 1, ...: KEYS[12+6i .. 17+6i] and ARGV[6+17i .. 22+17i] as KEYS
-- and ARGV of enqueue.lua.
-- Last two ARGV: a group member's final state when archived ("" for none) and its entry.
-- An unfinished group member that is deleted finishes as deleted; tasks waiting for an
-- archived or deleted task count it (a finished one holds none back any more).
-- Archive and delete publish on the task's end channel (KEYS[1] .. ':end', see keys.py).
-- Returns {"ok", <HGETALL after (before, when deleted)>} | {"fenced"}.
-- Complexity: O(log n).
local zsets = {pending = KEYS[2], scheduled = KEYS[3], retry = KEYS[4], active = KEYS[5],
  completed = KEYS[6], archived = KEYS[7], waiting = queue_base(KEYS[1]) .. ':waiting'}
local cur = redis.call('HMGET', KEYS[1], 'state', 'm', 'expires_at', 'prio', 'D')
if cur[1] ~= ARGV[2] or cur[1] == 'active'
    or (cur[1] == 'completed' and tonumber(cur[3]) <= tonumber(ARGV[1])) then
  return {'fenced'}
end
redis.call('ZREM', zsets[cur[1]], cur[2])
if cur[1] == 'waiting' then  -- a wait for a signal is also indexed by its end
  redis.call('ZREM', queue_base(KEYS[1]) .. ':awaiting', cur[2])
end
unhold(KEYS[1], KEYS[9], cur[2])
local to = ARGV[3]
if to ~= 'pending' and give_back_kept(KEYS[1], KEYS[10], KEYS[11]) then
  wake_workers(ARGV[5])
end
if to == 'deleted' then
  local before = redis.call('HGETALL', KEYS[1])
  forget_member(KEYS[1], ARGV[1])
  release_dependents(KEYS[1], cur[5], ARGV[1])
  free_unique(KEYS[8], KEYS[1])
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1] .. ':end', '1')
  return {'ok', before}
end
if to == 'pending' then
  redis.call('HSET', KEYS[1], 'state', 'pending', 'npa', ARGV[1])
  -- A fresh start for the poison-pill count, as on the SQL brokers (lost 0 is not stored).
  redis.call('HDEL', KEYS[1], 'archived_at', 'lost', 'cancel')
  redis.call('ZADD', KEYS[2], ready_score(ARGV[1], cur[4]), cur[2])
  fair_join(KEYS[1], cur[2])
  wake_workers(ARGV[5])
else
  free_unique(KEYS[8], KEYS[1])
  redis.call('HSET', KEYS[1], 'state', 'archived', 'archived_at', ARGV[1])
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[1], 'last_error', ARGV[4])
  end
  redis.call('ZADD', KEYS[7], ARGV[1], cur[2])
  enqueue_follow_ups(11, 5)
  if ARGV[#ARGV - 1] ~= '' then
    finish_member(KEYS[1], ARGV[#ARGV - 1], ARGV[#ARGV], ARGV[1])
  end
  release_dependents(KEYS[1], cur[5], ARGV[1])
  redis.call('PUBLISH', KEYS[1] .. ':end', '1')
end
return {'ok', redis.call('HGETALL', KEYS[1])}
