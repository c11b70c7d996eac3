-- free_unique: a twin in a state its durq.Unique does not block in lets its key go (E4).
--
-- KEYS[1] task hash      KEYS[2] unique hash
-- ARGV[1] the unique key the task must still hold    ARGV[2..] the states it must be in
-- Returns 1 when the key was freed, else 0.
-- Complexity: O(1).
local cur = redis.call('HMGET', KEYS[1], 'state', 'unique_key', 'id')
if not cur[1] or cur[2] ~= ARGV[1] or not holds(KEYS[2], ARGV[1], cur[3]) then
  return 0
end
for i = 2, #ARGV do
  if cur[1] == ARGV[i] then
    free_unique(KEYS[2], KEYS[1])
    redis.call('HDEL', KEYS[1], 'unique_key', 'uu')
    return 1
  end
end
return 0
