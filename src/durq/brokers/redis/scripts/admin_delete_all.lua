-- admin_delete_all: delete up to ARGV[3] tasks of one state (not active).
-- The broker calls it again until it returns fewer than ARGV[3].
--
-- KEYS[1] source zset (of that state)   KEYS[2] unique hash
-- ARGV[1] now            ARGV[2] task key prefix  ARGV[3] batch size
-- An unfinished group member finishes as deleted; tasks waiting for an unfinished one
-- count it.
-- ARGV[4] "held": KEYS[1] is the held zset (W13), whose members end in "\0<member>"
-- KEYS[3] limits hash    KEYS[4] waiting set    ARGV[5] wake-up channel (W25: a task that
-- kept its sequences' keys gives them back; the workers are woken if tasks are held on them)
-- Returns how many were deleted (integer).
-- Complexity: O(k log n) for k tasks.
local batch = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1)
local wake = false
for _, m in ipairs(batch) do
  redis.call('ZREM', KEYS[1], m)
  if ARGV[4] == 'held' then
    m = held_member(m)
  end
  local key = ARGV[2] .. member_id(m)
  wake = give_back_kept(key, KEYS[3], KEYS[4]) or wake
  forget_member(key, ARGV[1])
  release_dependents(key, redis.call('HGET', key, 'D'), ARGV[1])
  free_unique(KEYS[2], key)
  redis.call('DEL', key)
end
if wake then
  wake_workers(ARGV[5])
end
return #batch
