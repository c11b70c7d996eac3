-- steps_record: a running attempt recorded a step: the whole stored steps (durq.steps),
-- fenced by its token.
--
-- KEYS[1] task hash
-- ARGV[1] fencing token   ARGV[2] the stored steps
-- Returns 1, or 0 (nothing changed) when the lease is no longer held.
-- Complexity: O(1).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'steps', ARGV[2])
return 1
