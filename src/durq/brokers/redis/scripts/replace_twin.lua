-- replace_twin: Unique(on_conflict="replace") and durq.Debounce change a waiting twin in
-- place: its payload; a scheduled one's due time (ARGV[4] seconds from now, no later than
-- ARGV[5] seconds after its enqueue) and priority (ARGV[6]). Fenced by the task holding the unique key ARGV[2] and
-- being pending, scheduled or retry: a running task is never changed.
--
-- KEYS[1] task hash      KEYS[2] scheduled zset      KEYS[3] unique hash
-- ARGV[1] now ("" = TIME)    ARGV[2] unique key    ARGV[3] the new payload
-- ARGV[4] delay ("" keeps the due time)    ARGV[5] latest, after the enqueue ("" for none)
-- ARGV[6] priority ("" keeps it)
-- Returns the task hash after the change (HGETALL), or an empty reply when fenced.
-- Complexity: O(log n) plus the payload's chunks.
local cur = redis.call('HMGET', KEYS[1], 'state', 'unique_key', 'm', 'enqueued_at', 'id')
local state = cur[1]
if cur[2] ~= ARGV[2] or not (state == 'pending' or state == 'scheduled' or state == 'retry')
    or not holds(KEYS[3], ARGV[2], cur[5]) then
  return {}
end
local _, chunks = read_chunked(KEYS[1], 'p')
drop_chunked(KEYS[1], 'p', chunks)
set_chunked(KEYS[1], 'p', ARGV[3])
if state == 'scheduled' then
  if ARGV[4] ~= '' then
    local npa = later(clock(ARGV[1]), ARGV[4])
    if ARGV[5] ~= '' then
      local latest = later(cur[4], ARGV[5])
      if tonumber(latest) < tonumber(npa) then
        npa = latest
      end
    end
    redis.call('HSET', KEYS[1], 'npa', npa)
    redis.call('ZADD', KEYS[2], npa, cur[3])
  end
  if ARGV[6] == '0' then
    redis.call('HDEL', KEYS[1], 'prio')
  elseif ARGV[6] ~= '' then
    redis.call('HSET', KEYS[1], 'prio', ARGV[6])
  end
end
return redis.call('HGETALL', KEYS[1])
