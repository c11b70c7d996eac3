-- fair_partitions: W22, the fair tasks of one slice of a queue's zset counted by partition,
-- for the inspector; it reads the queue slice by slice and adds them up, so that no call
-- holds the server long. Task hashes are named from the zset's queue prefix (same slot).
--
-- KEYS[1] the zset read: pending ("P:{Q}:pending", tasks not held), held ("P:{Q}:held")
--         or active ("P:{Q}:active")
-- ARGV[1] which: "pending", "held" or "active"   ARGV[2] first index   ARGV[3] how many
-- Returns {read, template, key, n, template, key, n, ...}: how many entries the slice had,
-- and per partition how many of its tasks are in that state (stale entries not counted).
-- Complexity: O(log N + M) for M entries read, one HMGET each.
local which, first = ARGV[1], tonumber(ARGV[2])
local entries = redis.call('ZRANGE', KEYS[1], first, first + tonumber(ARGV[3]) - 1)
local prefix = queue_base(KEYS[1]) .. ':t:'
local state = which == 'active' and 'active' or 'pending'
local counts, order = {}, {}
for _, e in ipairs(entries) do
  -- A held entry is "<limit key>\0<rank>\0<member>"; the others are the member itself.
  local m = which == 'held' and string.match(e, '[^%z]*$') or e
  local f = redis.call('HMGET', prefix .. member_id(m), 'state', 'fg', 'L', 'held_by')
  if f[1] == state and f[2] and (which == 'held') == (f[4] ~= false) then
    -- The fair limit is the first: its key is the first string of the JSON.
    local key = string.match(f[3], '^%[%["([^"\\]*)",') or cjson.decode(f[3])[1][1]
    local part = f[2] .. '\0' .. key
    if not counts[part] then
      counts[part] = 0
      order[#order + 1] = part
    end
    counts[part] = counts[part] + 1
  end
end
local out = {#entries}
for _, part in ipairs(order) do
  local sep = string.find(part, '\0', 1, true)
  out[#out + 1] = string.sub(part, 1, sep - 1)
  out[#out + 1] = string.sub(part, sep + 1)
  out[#out + 1] = counts[part]
end
return out
