-- admin_rewrite: durq encryption rotate's new payload and result bytes, fenced by the task's
-- state and by the bytes the new ones were made from (a task that moved or was rewritten
-- meanwhile is left as it is).
--
-- KEYS[1] task hash
-- ARGV[1] now ("" = TIME)    ARGV[2] expected state (an active task is never rewritten)
-- ARGV[3] the payload now    ARGV[4] "1" when the task has a result now    ARGV[5] that result
-- ARGV[6] the new payload    ARGV[7] "1" to store a result                 ARGV[8] that result
-- Returns 1, or 0 (nothing changed) when a fence fails.
-- Complexity: O(n) in the payload's and result's chunks.
local cur = redis.call('HMGET', KEYS[1], 'state', 'expires_at')
if not cur[1] or cur[1] ~= ARGV[2] or cur[1] == 'active' then
  return 0
end
if cur[1] == 'completed' and cur[2] and tonumber(cur[2]) <= tonumber(clock(ARGV[1])) then
  return 0  -- past its retention: counts as gone
end
local payload, pn = read_chunked(KEYS[1], 'p')
if (payload or '') ~= ARGV[3] then
  return 0
end
local result, rn = read_chunked(KEYS[1], 'r')
if (result ~= nil) ~= (ARGV[4] == '1') or (result or '') ~= ARGV[5] then
  return 0
end
drop_chunked(KEYS[1], 'p', pn)
set_chunked(KEYS[1], 'p', ARGV[6])
drop_chunked(KEYS[1], 'r', rn)
if ARGV[7] == '1' then
  set_chunked(KEYS[1], 'r', ARGV[8])
end
return 1
