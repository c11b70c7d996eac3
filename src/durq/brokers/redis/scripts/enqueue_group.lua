-- enqueue_group: create a group's record, all its members and its follow-up (waiting for
-- the group, in its queue's waiting zset, field "wf" 1), or nothing.
--
-- KEYS[1] group hash     KEYS[2] its entries hash (":e")
-- Then per member i = 0, 1, ...: KEYS[3+6i .. 8+6i] as KEYS of enqueue.lua; with a
-- follow-up, last its queue's waiting zset.
-- ARGV[1] now ("" = TIME) ARGV[2] number of members      ARGV[3] retention (s)
-- ARGV[4..9] the follow-up's enqueue.lua KEYS, ARGV[10..26] its ARGV ("" in ARGV[4]: none)
-- ARGV[27] the tail of the follow-up's payload        ARGV[28] the follow-up's queue
-- Then per member i: ARGV[29+18i .. 45+18i] as ARGV of enqueue.lua, ARGV[46+18i] its
-- "deleted" entry.
-- Returns {"ok", <the clock it read>} | {"conflict", <member index; the number of members:
-- the follow-up>, <HGETALL of the existing task>} | {"duplicate", <member index>, <task id>}.
-- Complexity: O(n log m) for n members.
local n = tonumber(ARGV[2])
local now_s = clock(ARGV[1])
local now = tonumber(now_s)

-- First every check, then every write: a refusal leaves nothing behind.
if ARGV[4] ~= '' and taken_by(ARGV[4], now) then
  return {'conflict', n, redis.call('HGETALL', ARGV[4])}
end
local taken = {}
for i = 0, n - 1 do
  local ko, ao = 2 + 6 * i, 28 + 18 * i
  local task_key = KEYS[ko + 1]
  local unique = ARGV[ao + 12]
  local slot = KEYS[ko + 5] .. '|' .. unique
  -- An id taken first, then a unique key an earlier member takes, then a stored lock.
  if unique ~= '' and taken[slot] and not taken_by(task_key, now) then
    return {'duplicate', i, taken[slot]}
  end
  local refused = refusal(i, task_key, KEYS[ko + 5], unique, now)
  if refused then
    return refused
  end
  if unique ~= '' then
    taken[slot] = ARGV[ao + 3]
  end
end

local g = {'total', n, 'finished', 0, 'created_at', now_s, 'retention', ARGV[3]}
if ARGV[4] ~= '' then
  for j = 1, 6 do
    g[#g + 1] = 'k' .. j
    g[#g + 1] = ARGV[3 + j]
  end
  for j = 1, 17 do
    g[#g + 1] = 'a' .. j
    g[#g + 1] = ARGV[9 + j]
  end
  g[#g + 1] = 'tail'
  g[#g + 1] = ARGV[27]
  g[#g + 1] = 'tq'
  g[#g + 1] = ARGV[28]
  g[#g + 1] = 'w'
  g[#g + 1] = '1'
end
redis.call('HSET', KEYS[1], unpack(g))

if ARGV[4] ~= '' then
  -- The follow-up, due now, its payload without entries until the last member finishes
  -- (finish_member in _lib.lua writes it and releases the task).
  local k, a = {}, {}
  for j = 1, 6 do
    k[j] = ARGV[3 + j]
  end
  for j = 1, 17 do
    a[j] = ARGV[9 + j]
  end
  a[1] = now_s
  a[5] = a[5] .. ARGV[27]
  a[9] = ''
  a[10] = 'pending'
  a[15] = ''
  enqueue_task(k[1], k, 1, now_s, a, 2)
  local m = redis.call('HGET', k[1], 'm')
  redis.call('ZREM', k[2], m)
  redis.call('ZADD', KEYS[#KEYS], now_s, m)
  redis.call('HSET', k[1], 'state', 'waiting', 'wf', 1)
end

local entries = {}
local woken = {}  -- one wake-up per queue, not per member
for i = 0, n - 1 do
  local ko, ao = 2 + 6 * i, 28 + 18 * i
  local _, pending = enqueue_task(KEYS[ko + 1], KEYS, ko + 1, now_s, ARGV, ao + 2)
  redis.call('HSET', KEYS[ko + 1], 'g', KEYS[1], 'gp', i)
  entries[#entries + 1] = tostring(i)
  entries[#entries + 1] = ARGV[ao + 18]
  if pending and not woken[ARGV[ao + 2]] then
    woken[ARGV[ao + 2]] = true
    wake_workers(ARGV[ao + 2])
  end
end
call_in_slices('HSET', KEYS[2], entries)
return {'ok', now_s}
