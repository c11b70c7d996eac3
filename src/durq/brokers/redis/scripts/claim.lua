-- claim: lease up to ARGV[2] claimable tasks from one or more queues, filling from the queues
-- in the order given and, in each, in pending-score order (priority, then ready time, then
-- enqueue order). Due scheduled/retry tasks are forwarded to pending first (bounded), so they
-- are claimable without waiting for a promoter.
-- W13: a task with limits ("L") is leased only if each key has room, counting it; one
-- without room is held (moved from pending to the held zset) and the claim goes on. First,
-- held tasks of keys with room again go back to pending, as many as there is room.
-- Several queues in one call need a single node (their keys are in different hash slots); a
-- cluster calls it once per queue.
--
-- KEYS[1] pending zset   KEYS[2] scheduled zset   KEYS[3] retry zset
-- KEYS[4] active zset    KEYS[5] paused flag      KEYS[6] limits hash
-- KEYS[7] held zset      KEYS[8] waiting set (keys with held tasks)
-- and the same eight for each further queue (KEYS[9..16] for the second, and so on).
-- ARGV[1] now ("" = TIME) ARGV[2] limit           ARGV[3] lease length (s)
-- ARGV[4] worker id      ARGV[5] token base (a fresh random string per call)
-- ARGV[6] forward bound  ARGV[7] how many tasks one call may hold at most
-- Per queue q (0-based): ARGV[8 + 2q] its task key prefix ("P:{Q}:t:"), ARGV[9 + 2q] its
--   wake-up channel, whose list of the same name holds the token of blocked workers (see
--   wake_workers): put back while tasks are left, else removed.
-- Returns {leases, wake_at}: leases one list per queue, of {token, <HGETALL of the task as
-- now active>} in claim order; wake_at "" or when a token comes for a key with held tasks.
-- Complexity: O((f + k + h) log n) for f forwarded, k claimed and h held or let back.
local now, limit, bound = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[6])
local expires = later(now, ARGV[3])
local t = tonumber(now)
local hold_bound = tonumber(ARGV[7])
local n, held_now, taken = 0, 0, 0
local wake_at = nil

-- Lease up to `want` tasks of the queue whose keys follow offset o into `out`.
local function claim_queue(o, prefix, want, out)
  forward_due(KEYS[o + 2], KEYS[o + 1], prefix, now, bound)
  forward_due(KEYS[o + 3], KEYS[o + 1], prefix, now, bound)

  local counters, dirty = {}, {}
  local function counter(key)
    local c = counters[key]
    if c == nil then
      c = load_counter(KEYS[o + 6], key) or false
      counters[key] = c
    end
    return c or nil
  end

  -- Let held tasks back where their key has room.
  if redis.call('SCARD', KEYS[o + 8]) > 0 then
    for _, key in ipairs(redis.call('SMEMBERS', KEYS[o + 8])) do
      local c = counter(key)
      local room = c and room_of(c, t) or 1000000000
      if room > 0 then
        local lo, hi = '[' .. key .. '\0', '(' .. key .. '\1'
        local held = redis.call('ZRANGEBYLEX', KEYS[o + 7], lo, hi, 'LIMIT', 0, room)
        for _, h in ipairs(held) do
          redis.call('ZREM', KEYS[o + 7], h)
          local m = held_member(h)
          local task = prefix .. member_id(m)
          local cur = redis.call('HMGET', task, 'state', 'held_by', 'hs')
          if cur[1] == 'pending' and cur[2] == key then
            redis.call('HDEL', task, 'held_by', 'hs')
            redis.call('ZADD', KEYS[o + 1], cur[3], m)
          end
        end
        if #held < room then
          redis.call('SREM', KEYS[o + 8], key)
        end
      end
    end
  end

  while #out < want and held_now < hold_bound do
    local popped = redis.call('ZPOPMIN', KEYS[o + 1], want - #out)
    if #popped == 0 then
      break
    end
    local held_here = 0
    for i = 1, #popped, 2 do
      local m, score = popped[i], popped[i + 1]
      local key = prefix .. member_id(m)
      local cur = redis.call('HMGET', key, 'state', 'L')  -- one call: exists, and its limits
      if cur[1] then
        local raw = cur[2]
        local full = nil
        local specs = {}
        if raw then
          for _, item in ipairs(cjson.decode(raw)) do
            local s = spec_of(item)
            specs[#specs + 1] = s
            if full == nil then
              local c = counter(s.key)
              if c then
                if s.conc and c.running >= s.conc then full = s.key end
                local tokens = s.rate and bucket_at(c, t, s.rate, s.per)
                if tokens and tokens < 1 - 1e-9 then full = s.key end
              end
            end
          end
        end
        if full then
          redis.call('HSET', key, 'held_by', full, 'hs', score)
          redis.call('ZADD', KEYS[o + 7], 0, held_entry(full, score, m))
          redis.call('SADD', KEYS[o + 8], full)
          held_here = held_here + 1
        else
          for _, s in ipairs(specs) do
            local c = counter(s.key)
            if not c then
              c = {running = 0, tokens = s.rate or 0, at = t}
              counters[s.key] = c
            end
            c.conc = s.conc
            if s.rate then
              c.tokens = bucket_at(c, t, s.rate, s.per) - 1
              c.rate, c.per, c.at = s.rate, s.per, t
            else
              c.rate, c.per = nil, nil
            end
            c.running = c.running + 1
            dirty[s.key] = true
          end
          n = n + 1
          local token = ARGV[5] .. '.' .. tostring(n)
          redis.call('HSET', key, 'state', 'active', 'token', token, 'started_at', now,
            'lease_expires_at', expires, 'worker_id', ARGV[4])
          redis.call('HDEL', key, 'cancel')
          redis.call('ZADD', KEYS[o + 4], expires, m)
          table.insert(out, {token, redis.call('HGETALL', key)})
        end
      end
    end
    held_now = held_now + held_here
    if held_here == 0 then
      break
    end
  end
  for key in pairs(dirty) do
    save_counter(KEYS[o + 6], key, counters[key])
  end

  if redis.call('SCARD', KEYS[o + 8]) > 0 then
    for _, key in ipairs(redis.call('SMEMBERS', KEYS[o + 8])) do
      local c = counter(key)
      local at = c and next_room_at(c, t)
      if at and (wake_at == nil or at < wake_at) then wake_at = at end
    end
  end
end

local leases = {}
for q = 0, #KEYS / 8 - 1 do
  local o = 8 * q
  local out = {}
  leases[q + 1] = out
  if redis.call('EXISTS', KEYS[o + 5]) == 0 then  -- a paused queue gives nothing
    if taken < limit and held_now < hold_bound then
      claim_queue(o, ARGV[8 + 2 * q], limit - taken, out)
      taken = taken + #out
    end
    local channel = ARGV[9 + 2 * q]
    if redis.call('ZCARD', KEYS[o + 1]) > 0 then
      if redis.call('EXISTS', channel) == 0 then
        redis.call('LPUSH', channel, '1')  -- tasks are left: the next blocked worker takes over
      end
    else
      redis.call('DEL', channel)
    end
  end
end
if held_now >= hold_bound then
  wake_at = t  -- more held tasks to set aside: look again at once
end
return {leases, wake_at and string.format('%.17g', wake_at) or ''}
