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
