-- admin_limit: set or reset an operator's override of one limit key of a queue (W23),
-- atomically with claims (which read the counter in their script). Setting creates the
-- counter of a key no claim has counted (nothing running, the bucket ARGV[6]). Either wakes
-- the queue's idle workers, whose next claim applies it (letting held tasks back if room
-- appeared).
--
-- KEYS[1] limits hash   KEYS[2] wake-up channel (and its token list)
-- ARGV[1] limit key     ARGV[2] "set" or "reset"
-- ARGV[3] concurrency   ARGV[4] rate   ARGV[5] per   ("" for a part not overridden)
-- ARGV[6] refilled_at of a new counter
-- Returns 1, or 0 for a reset of a key without an override.
-- Complexity: O(1).
local c = load_counter(KEYS[1], ARGV[1])
if ARGV[2] == 'reset' then
  if not c or (not c.oconc and not c.orate) then
    return 0
  end
  c.oconc, c.orate, c.oper = nil, nil, nil
else
  if not c then
    c = {running = 0, tokens = 0, at = tonumber(ARGV[6])}
  end
  c.oconc, c.orate, c.oper = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
end
save_counter(KEYS[1], ARGV[1], c)
wake_workers(KEYS[2])
return 1
