-- _lib.lua: helpers prepended to every script of this directory (not an operation itself).
--
-- Conventions shared by all scripts:
--   * times arrive as strings in ARGV, computed by the broker from its injected clock; Lua
--     only compares them (tonumber) and stores the strings unchanged, so no precision is lost;
--   * every state zset member is "<16 hex digits of the enqueue sequence><task id>", so equal
--     scores sort in enqueue order; the task hash keeps its member in field "m";
--   * replies never carry Lua numbers that are not integers (Redis would truncate them).

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
