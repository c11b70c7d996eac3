-- enqueue: create one task, checking its id (E3) and its uniqueness lock (E4) atomically.
--
-- KEYS[1] task hash         KEYS[2] pending zset     KEYS[3] scheduled zset
-- KEYS[4] completed zset    KEYS[5] unique hash      KEYS[6] sequence counter
-- ARGV[1] now ("" = TIME)  ARGV[2] wake-up channel
-- ARGV[3] task id           ARGV[4] type             ARGV[5] payload
-- ARGV[6] max_retry         ARGV[7] timeout ("" = none)                ARGV[8] deadline ("")
-- ARGV[9] process_at ("")   ARGV[10] state: pending | scheduled        ARGV[11] retention
-- ARGV[12] unique key ("")  ARGV[13] unique lock ttl, s ("")           ARGV[14] headers JSON ("")
-- ARGV[15] delay, s ("" = none): next_process_at is then now + delay
-- ARGV[16] priority ("0" = default)
-- ARGV[17] limits JSON ("" = none)
-- Returns <the clock it read> (created) | {"conflict", <HGETALL of the existing task>} |
-- {"duplicate", <task id>}.
-- Complexity: O(log n) in the size of the target zset.
local reply, pending = enqueue_task(KEYS[1], KEYS, 1, ARGV[1], ARGV, 2)
if pending then
  wake_workers(ARGV[2])
end
return reply
