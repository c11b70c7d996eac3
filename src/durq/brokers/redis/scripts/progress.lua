-- progress: a running attempt's report (durq.progress), fenced by its token. The log is one
-- stored line per '\n'-separated line of the 'logs' field; the last ARGV[4] are kept (the
-- same rule as durq.progress.append_lines).
--
-- KEYS[1] task hash
-- ARGV[1] fencing token   ARGV[2] '1': set the progress to ARGV[3] ('' clears it)
-- ARGV[3] progress        ARGV[4] lines to keep   ARGV[5] lines to append ('' = none)
-- Returns 1, or 0 (nothing changed) when the lease is no longer held.
-- Complexity: O(lines kept).
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'logs')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return 0
end
if ARGV[2] == '1' then
  if ARGV[3] == '' then
    redis.call('HDEL', KEYS[1], 'progress')
  else
    redis.call('HSET', KEYS[1], 'progress', ARGV[3])
  end
end
if ARGV[5] ~= '' then
  local text = ARGV[5]
  if cur[3] then
    text = cur[3] .. '\n' .. text
  end
  local lines = {}
  for line in string.gmatch(text, '[^\n]+') do
    lines[#lines + 1] = line
  end
  local keep = tonumber(ARGV[4])
  if #lines > keep then
    text = table.concat(lines, '\n', #lines - keep + 1)
  end
  redis.call('HSET', KEYS[1], 'logs', text)
end
return 1
