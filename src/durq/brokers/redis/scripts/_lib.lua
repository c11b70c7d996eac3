-- _lib.lua: helpers prepended to every script of this directory (not an operation itself).
--
-- Conventions shared by all scripts:
--   * times arrive as strings in ARGV, computed by the broker from its injected clock; Lua
--     only compares them (tonumber) and stores the strings unchanged, so no precision is lost;
--   * every state zset member is "<16 hex digits of the enqueue sequence><task id>", so equal
--     scores sort in enqueue order; the task hash keeps its member in field "m";
--   * replies never carry Lua numbers that are not integers (Redis would truncate them);
--   * payload, headers and result are stored in chunks "<tag>:0", "<tag>:1", ... (see below).

-- The task id inside a zset member.
local function member_id(m)
  return string.sub(m, 17)
end

-- Drop the task's uniqueness lock (E4) if the task still owns it.
local function free_unique(unique_hash, task_key)
  local uk = redis.call('HGET', task_key, 'unique_key')
  if uk then
    local owner = redis.call('HGET', unique_hash, uk)
    local id = redis.call('HGET', task_key, 'id')
    if owner and id and string.sub(owner, 1, #id + 1) == id .. '|' then
      redis.call('HDEL', unique_hash, uk)
    end
  end
end

-- Add to the processed/failed counters of the queue (total and UTC day, I1).
local function count(stats_key, day_key, day_ttl, processed, failed)
  if processed > 0 then
    redis.call('HINCRBY', stats_key, 'processed', processed)
    redis.call('HINCRBY', day_key, 'processed', processed)
  end
  if failed > 0 then
    redis.call('HINCRBY', stats_key, 'failed', failed)
    redis.call('HINCRBY', day_key, 'failed', failed)
  end
  if processed > 0 or failed > 0 then
    redis.call('EXPIRE', day_key, day_ttl)
  end
end

-- Move up to `bound` members of zset `src` whose score is <= now into `pending` (same
-- score), marking their hashes pending. Returns how many moved.
local function forward_due(src, pending, task_prefix, now, bound)
  local due = redis.call('ZRANGEBYSCORE', src, '-inf', now, 'WITHSCORES', 'LIMIT', 0, bound)
  local moved = 0
  for i = 1, #due, 2 do
    local m, score = due[i], due[i + 1]
    redis.call('ZREM', src, m)
    local key = task_prefix .. member_id(m)
    if redis.call('EXISTS', key) == 1 then
      redis.call('HSET', key, 'state', 'pending')
      redis.call('ZADD', pending, score, m)
      moved = moved + 1
    end
  end
  return moved
end

-- A hash field value longer than 64 bytes (hash-max-listpack-value) turns the whole task hash
-- from a compact listpack into a hashtable, about three times the memory. So payload ("p"),
-- headers ("h") and result ("r") are stored as 64-byte chunks while the hash stays within the
-- listpack entry limit; larger values are kept whole (the hash is a hashtable anyway then).
local CHUNK = 64
local MAX_CHUNKED = CHUNK * 200
local function set_chunked(key, tag, value)
  if #value <= CHUNK or #value > MAX_CHUNKED then
    redis.call('HSET', key, tag .. ':0', value)
    return
  end
  local n = 0
  for i = 1, #value, CHUNK do
    redis.call('HSET', key, tag .. ':' .. n, string.sub(value, i, i + CHUNK - 1))
    n = n + 1
  end
end

-- Create one task: the body of enqueue.lua, shared with the continuations of complete.lua
-- and archive.lua. Its 6 keys are k[ko+1..ko+6] and its 14 arguments a[ao+1..ao+14], laid
-- out as KEYS/ARGV of enqueue.lua (see there).
-- Returns {"ok"} | {"conflict", <HGETALL of the existing task>} | {"duplicate", <task id>}.
local function enqueue_task(k, ko, a, ao)
  local now = tonumber(a[ao + 1])
  local id = a[ao + 2]
  local task_key = k[ko + 1]

  if redis.call('EXISTS', task_key) == 1 then
    local cur = redis.call('HMGET', task_key, 'state', 'expires_at', 'm')
    -- A completed task past its retention counts as gone even before the janitor runs.
    if cur[1] == 'completed' and cur[2] and tonumber(cur[2]) <= now then
      redis.call('ZREM', k[ko + 4], cur[3])
      redis.call('DEL', task_key)
    else
      return {'conflict', redis.call('HGETALL', task_key)}
    end
  end

  local unique = a[ao + 11]
  if unique ~= '' then
    local owner = redis.call('HGET', k[ko + 5], unique)
    if owner then
      local sep = string.find(owner, '|', 1, true)
      if sep and tonumber(string.sub(owner, sep + 1)) > now then
        return {'duplicate', string.sub(owner, 1, sep - 1)}
      end
    end
    redis.call('HSET', k[ko + 5], unique, id .. '|' .. a[ao + 12])
  end

  local seq = redis.call('INCR', k[ko + 6])
  local m = string.format('%016x', seq) .. id
  local state, npa = a[ao + 9], a[ao + 8]
  local fields = {
    'id', id, 'type', a[ao + 3], 'state', state, 'max_retry', a[ao + 5], 'npa', npa,
    'enqueued_at', a[ao + 1], 'm', m,
  }
  -- Defaults (retried 0, retention 0, no timeout...) are not stored: smaller hashes.
  if tonumber(a[ao + 10]) > 0 then
    table.insert(fields, 'retention'); table.insert(fields, a[ao + 10])
  end
  if a[ao + 6] ~= '' then table.insert(fields, 'timeout'); table.insert(fields, a[ao + 6]) end
  if a[ao + 7] ~= '' then table.insert(fields, 'deadline'); table.insert(fields, a[ao + 7]) end
  if unique ~= '' then table.insert(fields, 'unique_key'); table.insert(fields, unique) end
  redis.call('HSET', task_key, unpack(fields))
  set_chunked(task_key, 'p', a[ao + 4])
  if a[ao + 13] ~= '' then set_chunked(task_key, 'h', a[ao + 13]) end

  if state == 'pending' then
    redis.call('ZADD', k[ko + 2], npa, m)
    redis.call('PUBLISH', a[ao + 14], '1')
  else
    redis.call('ZADD', k[ko + 3], npa, m)
  end
  return {'ok'}
end

-- Create the follow-ups (continuations) passed after a script's own keys and arguments:
-- groups of 6 KEYS from index nk + 1 and of 14 ARGV from index na + 1, as enqueue_task
-- takes them. A follow-up whose id or unique key is taken is skipped.
local function enqueue_follow_ups(nk, na)
  local n = (#KEYS - nk) / 6
  for i = 0, n - 1 do
    enqueue_task(KEYS, nk + 6 * i, ARGV, na + 14 * i)
  end
end
