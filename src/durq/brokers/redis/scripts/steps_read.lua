-- steps_read: a running task's recorded steps (durq.steps), when a snooze is counted.
--
-- KEYS[1] task hash
-- ARGV[1] fencing token
-- Returns the stored steps, or false when there are none or the lease is no longer held.
-- Complexity: O(1).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'steps')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return false
end
return cur[3]
