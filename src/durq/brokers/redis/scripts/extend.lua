-- extend: heartbeat of the leases one worker holds in one queue.
--
-- KEYS[1] active zset
-- ARGV[1] now ("" = TIME)   ARGV[2] task key prefix     ARGV[3] lease length (s)
-- ARGV[4], ARGV[5], ...      pairs of task id, fencing token
-- Returns {lost ids, ids asked to cancel}.
-- Complexity: O(k log n) for k leases.
local lost, cancel = {}, {}
local expires = later(clock(ARGV[1]), ARGV[3])
for i = 4, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = ARGV[2] .. id
  local cur = redis.call('HMGET', key, 'state', 'token', 'm', 'cancel')
  if cur[1] == 'active' and cur[2] == token then
    redis.call('HSET', key, 'lease_expires_at', expires)
    redis.call('ZADD', KEYS[1], 'XX', expires, cur[3])
    if cur[4] == '1' then
      table.insert(cancel, id)
    end
  else
    table.insert(lost, id)
  end
end
return {lost, cancel}
