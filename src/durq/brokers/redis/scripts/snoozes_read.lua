-- snoozes_read: how often a leased task was snoozed (durq.Snooze), before its worker decides
-- whether it may snooze again.
--
-- KEYS[1] task hash
-- ARGV[1] fencing token
-- Returns the count, or false when the lease is no longer held.
-- Complexity: O(1).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'snoozes')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return false
end
return tonumber(cur[3] or '0')
