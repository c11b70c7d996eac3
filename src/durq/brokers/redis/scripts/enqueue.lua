-- enqueue: create one task, checking its id (E3) and its uniqueness lock (E4) atomically.
--
-- KEYS[1] task hash         KEYS[2] pending zset     KEYS[3] scheduled zset
-- KEYS[4] completed zset    KEYS[5] unique hash      KEYS[6] sequence counter
-- ARGV[1] now               ARGV[2] task id          ARGV[3] type
-- ARGV[4] payload           ARGV[5] max_retry        ARGV[6] timeout ("" = none)
-- ARGV[7] deadline ("")     ARGV[8] next_process_at  ARGV[9] state: pending | scheduled
-- ARGV[10] retention        ARGV[11] unique key ("") ARGV[12] unique lock expiry ("")
-- ARGV[13] headers JSON ("") ARGV[14] wake-up channel
-- Returns {"ok"} | {"conflict", <HGETALL of the existing task>} | {"duplicate", <task id>}.
-- Complexity: O(log n) in the size of the target zset.
local now = tonumber(ARGV[1])
local id = ARGV[2]

if redis.call('EXISTS', KEYS[1]) == 1 then
  local cur = redis.call('HMGET', KEYS[1], 'state', 'expires_at', 'm')
  -- A completed task past its retention counts as gone even before the janitor runs.
  if cur[1] == 'completed' and cur[2] and tonumber(cur[2]) <= now then
    redis.call('ZREM', KEYS[4], cur[3])
    redis.call('DEL', KEYS[1])
  else
    return {'conflict', redis.call('HGETALL', KEYS[1])}
  end
end

if ARGV[11] ~= '' then
  local owner = redis.call('HGET', KEYS[5], ARGV[11])
  if owner then
    local sep = string.find(owner, '|', 1, true)
    if sep and tonumber(string.sub(owner, sep + 1)) > now then
      return {'duplicate', string.sub(owner, 1, sep - 1)}
    end
  end
  redis.call('HSET', KEYS[5], ARGV[11], id .. '|' .. ARGV[12])
end

local seq = redis.call('INCR', KEYS[6])
local m = string.format('%016x', seq) .. id
local fields = {
  'id', id, 'type', ARGV[3], 'state', ARGV[9], 'max_retry', ARGV[5], 'npa', ARGV[8],
  'enqueued_at', ARGV[1], 'm', m,
}
-- Defaults (retried 0, retention 0, no timeout...) are not stored: smaller hashes.
if tonumber(ARGV[10]) > 0 then table.insert(fields, 'retention'); table.insert(fields, ARGV[10]) end
if ARGV[6] ~= '' then table.insert(fields, 'timeout'); table.insert(fields, ARGV[6]) end
if ARGV[7] ~= '' then table.insert(fields, 'deadline'); table.insert(fields, ARGV[7]) end
if ARGV[11] ~= '' then table.insert(fields, 'unique_key'); table.insert(fields, ARGV[11]) end
redis.call('HSET', KEYS[1], unpack(fields))
set_chunked(KEYS[1], 'p', ARGV[4])
if ARGV[13] ~= '' then set_chunked(KEYS[1], 'h', ARGV[13]) end

if ARGV[9] == 'pending' then
  redis.call('ZADD', KEYS[2], ARGV[8], m)
  redis.call('PUBLISH', ARGV[14], '1')
else
  redis.call('ZADD', KEYS[3], ARGV[8], m)
end
return {'ok'}
