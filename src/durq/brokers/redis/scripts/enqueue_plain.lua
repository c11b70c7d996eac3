-- enqueue_plain: enqueue.lua for the plain task, the one a web handler sends on every
-- request: due now, priority 0, no unique key, headers, limits or deadline. The client
-- picks it for such params only (storage.py, plain_call); it stores what enqueue_task
-- stores for them, and a test compares the two. It carries only the _lib.lua helpers it
-- names (lua.py): defining all of them took a fifth of an enqueue.lua call.
--
-- KEYS[1] task hash         KEYS[2] pending zset     KEYS[3] sequence counter
-- ARGV[1] now ("" = TIME)  ARGV[2] wake-up channel
-- ARGV[3] task id           ARGV[4] type             ARGV[5] payload
-- ARGV[6] max_retry         ARGV[7] timeout ("" = none)
-- ARGV[8] retention ("" = none, kept 0)
-- Returns <the clock it read> (created) | false: a hash holds the task id, nothing was
-- written, and the client sends enqueue.lua, which decides (a conflict, or a completed task
-- past its retention that no longer counts).
-- Complexity: O(log n) in the size of the pending zset.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local now_s = clock(ARGV[1])
local id = ARGV[3]
local m = string.format('%016x', redis.call('INCR', KEYS[3])) .. id
local f = {
  'id', id, 'type', ARGV[4], 'state', 'pending', 'max_retry', ARGV[6], 'npa', now_s,
  'enqueued_at', now_s, 'm', m,
}
local n = 14
if ARGV[8] ~= '' then f[n + 1] = 'retention'; f[n + 2] = ARGV[8]; n = n + 2 end
if ARGV[7] ~= '' then f[n + 1] = 'timeout'; f[n + 2] = ARGV[7]; n = n + 2 end
n = add_chunked(f, n, 'p', ARGV[5])
redis.call('HSET', KEYS[1], unpack(f, 1, n))
redis.call('ZADD', KEYS[2], now_s, m)
wake_workers(ARGV[2])
return now_s
