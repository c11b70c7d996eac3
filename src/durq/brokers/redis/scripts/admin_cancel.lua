-- admin_cancel: flag an active task (W12); its worker sees the flag on its next heartbeat,
-- cancels the handler and archives it "cancelled".
--
-- KEYS[1] task hash
-- ARGV[1] the flag's value ("1"; the heartbeat script reads it)
-- Returns {"ok", <HGETALL after>} | {"fenced"} (not active, or gone).
-- Complexity: O(1).
if redis.call('HGET', KEYS[1], 'state') ~= 'active' then
  return {'fenced'}
end
redis.call('HSET', KEYS[1], 'cancel', ARGV[1])
return {'ok', redis.call('HGETALL', KEYS[1])}
