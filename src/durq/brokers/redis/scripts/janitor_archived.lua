-- janitor_archived: delete up to ARGV[4] archived tasks of one queue archived at least
-- ARGV[2] seconds ago (the archived zset is scored by the moment of archiving).
--
-- KEYS[1] archived zset
-- ARGV[1] now ("" = TIME) ARGV[2] the queue's archived retention (s) ARGV[3] task key prefix
-- ARGV[4] limit
-- Returns how many were deleted (integer). A member's group outcome was recorded when it
-- was archived: its group is unchanged.
-- Complexity: O(k log n) for k deleted tasks.
local before = tonumber(clock(ARGV[1])) - tonumber(ARGV[2])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', before, 'LIMIT', 0, tonumber(ARGV[4]))
for _, m in ipairs(gone) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('DEL', ARGV[3] .. member_id(m))
end
return #gone
