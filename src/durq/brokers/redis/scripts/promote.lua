-- promote: move due scheduled/retry tasks of one queue to pending, bounded per call.
--
-- KEYS[1] pending zset   KEYS[2] scheduled zset   KEYS[3] retry zset
-- ARGV[1] now ("" = TIME) ARGV[2] task key prefix ARGV[3] bound (per source zset)
-- ARGV[4] wake-up channel
-- Returns how many moved (integer).
-- Complexity: O(f log n) for f forwarded tasks.
local bound, now = tonumber(ARGV[3]), clock(ARGV[1])
local moved = forward_due(KEYS[2], KEYS[1], ARGV[2], now, bound)
  + forward_due(KEYS[3], KEYS[1], ARGV[2], now, bound)
if moved > 0 then
  wake_workers(ARGV[4])
end
return moved
