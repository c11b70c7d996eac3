-- enqueue_many: create several tasks of one queue, each checked as by enqueue.lua (E3, E4)
-- and in the order given; one wake-up for the whole batch (E9).
--
-- KEYS[1] pending zset      KEYS[2] scheduled zset   KEYS[3] completed zset
-- KEYS[4] unique hash       KEYS[5] sequence counter
-- KEYS[5 + i] task hash of item i (i = 1..n)
-- ARGV[1] now ("" = TIME)  ARGV[2] wake-up channel
-- ARGV[3 + 15(i-1) .. 17 + 15(i-1)] the 15 task fields of item i, as ARGV[3..17] of
-- enqueue.lua (id, type, payload, max_retry, timeout, deadline, process_at, state,
-- retention, unique key, unique lock ttl, headers JSON, delay, priority, limits JSON); one
-- clock for the batch
-- Returns one reply per item, as enqueue.lua returns it: <clock> | {"conflict", <HGETALL>} |
-- {"duplicate", <task id>}.
-- Complexity: O(n log m) for n items and m tasks in the target zset.
local out = {}
local wake = false
local now = clock(ARGV[1])
for i = 1, #KEYS - 5 do
  local reply, pending = enqueue_task(KEYS[5 + i], KEYS, 0, now, ARGV, 2 + 15 * (i - 1))
  out[i] = reply
  wake = wake or pending
end
if wake then
  wake_workers(ARGV[2])
end
return out
