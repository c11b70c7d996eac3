-- oldest_pending: when the longest-waiting pending task of one queue became ready. The
-- pending zset orders by priority band first (see ready_score), so the oldest task is the
-- first member of some band: the script visits the first member of each band in use.
--
-- KEYS[1] pending zset   ARGV[1] most bands to visit (one per priority: 201)
-- Returns the earliest ready time as a string, or false when nothing is pending.
-- Complexity: O(b log n) for b priorities in use.
local best = nil
local from = '-inf'
for _ = 1, tonumber(ARGV[1]) do
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #first == 0 then
    break
  end
  local at = ready_time(first[2])
  if not best or at < best then
    best = at
  end
  from = string.format('%.17g', (math.floor(tonumber(first[2]) / BAND) + 1) * BAND)
end
if not best then
  return false
end
return string.format('%.17g', best)
