-- schedule_put: store a periodic schedule's record, fenced by the version the caller read.
--
-- KEYS[1] the schedules hash (P:schedules)
-- ARGV[1] schedule name
-- ARGV[2] the version the caller read ("0": none of that name may exist)
-- ARGV[3] the new record, JSON, already carrying version ARGV[2] + 1
-- Returns 1 when stored, 0 when the fence failed.
-- Complexity: O(1) (one record).
local current = redis.call('HGET', KEYS[1], ARGV[1])
local version = 0
if current then
  version = tonumber(cjson.decode(current)['version'])
end
if version ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
