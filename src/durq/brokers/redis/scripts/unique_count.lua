-- unique_count: how many unique keys (E4) tasks of one queue hold at `now`: the locks of the
-- queue's unique hash whose time has not passed (a lock past its time stays in the hash
-- until its task ends or a twin takes the key).
--
-- KEYS[1] unique hash   ARGV[1] now (epoch seconds)
-- Returns the count.
-- Complexity: O(n) for n locks in the hash (read by the inspector, not on the hot path).
local now = tonumber(ARGV[1])
local held = 0
for _, owner in ipairs(redis.call('HVALS', KEYS[1])) do
  local sep = string.find(owner, '|', 1, true)
  if sep and tonumber(string.sub(owner, sep + 1)) > now then
    held = held + 1
  end
end
return held
