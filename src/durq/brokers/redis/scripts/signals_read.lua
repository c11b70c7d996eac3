-- signals_read: the signals delivered to a leased task (ctx.wait_for), as the text of one
-- JSON object {name: payload}: the stored payloads are joined as they were sent, never
-- decoded and encoded again (cjson would change numbers and key order).
--
-- KEYS[1] task hash
-- ARGV[1] fencing token
-- Returns that text, or false when there are none or the lease is no longer held.
-- Complexity: O(n) in the task hash's fields.
local cur = redis.call('HMGET', KEYS[1], 'state', 'token')
if cur[1] ~= 'active' or cur[2] ~= ARGV[1] then
  return false
end
local flat = redis.call('HGETALL', KEYS[1])
local names, payloads = {}, {}
for i = 1, #flat, 2 do
  local f = flat[i]
  if string.sub(f, 1, 3) == 'sg:' then
    local name = string.sub(f, 4)
    names[#names + 1] = name
    payloads[name] = flat[i + 1]
  end
end
if #names == 0 then
  return false
end
-- By name, so the same signals always read as the same text.
table.sort(names)
local parts = {}
for i, name in ipairs(names) do
  parts[i] = cjson.encode(name) .. ':' .. payloads[name]
end
return '{' .. table.concat(parts, ',') .. '}'
