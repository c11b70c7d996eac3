-- janitor: delete up to ARGV[3] completed tasks of one queue whose retention has passed.
--
-- KEYS[1] completed zset
-- ARGV[1] now ("" = TIME) ARGV[2] task key prefix ARGV[3] limit
-- Returns how many were deleted (integer).
-- Complexity: O(k log n) for k deleted tasks.
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', clock(ARGV[1]), 'LIMIT', 0, tonumber(ARGV[3]))
for _, m in ipairs(gone) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('DEL', ARGV[2] .. member_id(m))
end
return #gone
