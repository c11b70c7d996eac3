-- claim: lease up to ARGV[2] claimable tasks from one or more queues, filling from the queues
-- in the order given and, in each, in pending-score order (priority, then ready time, then
-- enqueue order). Due scheduled/retry tasks are forwarded to pending first (bounded), so they
-- are claimable without waiting for a promoter.
-- W13: a task with limits ("L") is leased only if each key has room, counting it; one
-- without room is held (moved from pending to the held zset) and the claim goes on. First,
-- held tasks of keys with room again go back to pending, as many as there is room.
-- W22: when the next task is fair, the claim takes instead its template's task whose turn
-- comes first (the first live entry of the template in the fair zset "P:{Q}:fair", next to
-- the pending zset); the next task stays first. Starting one moves the template's round on
-- (the turns zset "P:{Q}:turns"). See _lib.lua.
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
  local base = queue_base(KEYS[o + 1])
  local fair_z, turns = base .. ':fair', base .. ':turns'
  -- Members popped from pending and not yet taken or held, with their score.
  local popped_at = {}

  -- W22: the first entry of `template`'s line whose task is claimable (pending, or popped
  -- by this claim and not taken yet); entries of tasks no longer pending are dropped.
  local function fair_pick(template)
    local lo, hi = '[' .. template .. '\0', '(' .. template .. '\1'
    while true do
      local entries = redis.call('ZRANGEBYLEX', fair_z, lo, hi, 'LIMIT', 0, 16)
      if #entries == 0 then
        return nil
      end
      for _, e in ipairs(entries) do
        local m = string.match(e, '%z([^%z]*)$')
        if popped_at[m] or redis.call('ZSCORE', KEYS[o + 1], m) then
          return m, e
        end
        redis.call('ZREM', fair_z, e)
      end
    end
  end

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
          local cur = redis.call('HMGET', task, 'state', 'held_by', 'hs', 'fg', 'ft', 'prio')
          if cur[1] == 'pending' and cur[2] == key then
            redis.call('HDEL', task, 'held_by', 'hs')
            redis.call('ZADD', KEYS[o + 1], cur[3], m)
            if cur[4] then
              redis.call('ZADD', fair_z, 0, fair_entry(cur[4], cur[6], cur[5], m))
            end
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
      popped_at[popped[i]] = popped[i + 1]
    end
    local i = 1
    while i <= #popped and #out < want do
      local m = popped[i]
      local key = prefix .. member_id(m)
      -- One call: exists, its limits, (W22) its fair template, turn and priority, and
      -- (W25) whether it holds its sequences' keys already.
      local cur = popped_at[m] and redis.call('HMGET', key, 'state', 'L', 'fg', 'ft', 'prio', 'K')
      if cur and cur[1] and cur[3] then
        -- A fair task: its template's first turn goes in its place; it stays first. Its own
        -- entry is missing if it became pending by a way that adds none: then it goes in
        -- the line now, and first if its turn comes first.
        local own = fair_entry(cur[3], cur[5], cur[4], m)
        local pick, entry = fair_pick(cur[3])
        if pick ~= m then
          redis.call('ZADD', fair_z, 0, own)
          if pick == nil or own < entry then
            pick = m
          end
        end
        if pick ~= m then
          m, key = pick, prefix .. member_id(pick)
          cur = redis.call('HMGET', key, 'state', 'L', 'fg', 'ft', 'prio', 'K')
        else
          i = i + 2
        end
      else
        i = i + 2
      end
      local score = popped_at[m]
      if cur and score == nil then  -- a pick still in pending
        score = redis.call('ZSCORE', KEYS[o + 1], m)
        redis.call('ZREM', KEYS[o + 1], m)
      end
      popped_at[m] = nil
      if cur and cur[3] then
        redis.call('ZREM', fair_z, fair_entry(cur[3], cur[5], cur[4], m))
      end
      if cur and cur[1] then
        local raw = cur[2]
        local full, full_cost = nil, 1
        local specs = {}
        local kept = cur[6] == '1'
        if raw then
          for _, item in ipairs(cjson.decode(raw)) do
            local s = spec_of(item)
            specs[#specs + 1] = s
            if full == nil then
              local c = counter(s.key)
              if c then
                local conc, rate, per = in_force(s, c)  -- W23: the override's parts win
                if conc and not (kept and s.seq) and c.running + s.cost > conc then
                  full = s.key
                end
                local tokens = rate and bucket_at(c, t, rate, per)
                if tokens and tokens < s.cost - 1e-9 then full = s.key end
                if full then full_cost = s.cost end
              end
            end
          end
        end
        if full then
          -- W24: the key lets its held tasks back once the largest cost among them is free.
          local c = counter(full)
          if redis.call('SISMEMBER', KEYS[o + 8], full) == 1 then
            c.need = math.max(c.need or 1, full_cost)
          else
            c.need = full_cost
          end
          dirty[full] = true
          redis.call('HSET', key, 'held_by', full, 'hs', score)
          redis.call('ZADD', KEYS[o + 7], 0, held_entry(full, score, m))
          redis.call('SADD', KEYS[o + 8], full)
          held_here = held_here + 1
        else
          for _, s in ipairs(specs) do
            local c = counter(s.key)
            if not c then  -- a bucket full at whatever rate applies first (limiter.fresh)
              c = {running = 0, tokens = 0, at = t - FRESH_AGE}
              counters[s.key] = c
            end
            -- Its cost in tokens at the rate in force; the key keeps the task's own limit
            -- (W23: what a reset of an override goes back to).
            local _, rate, per = in_force(s, c)
            if rate then
              c.tokens = bucket_at(c, t, rate, per) - s.cost
              c.at = t
            end
            c.conc, c.rate, c.per = s.conc, s.rate, s.per
            if not (kept and s.seq) then  -- W25: a slot it kept is counted already
              c.running = c.running + s.cost
            end
            dirty[s.key] = true
          end
          if cur[3] then  -- W22: the template's round is at least this turn
            redis.call('ZADD', turns, 'GT', cur[4], cur[3] .. '\0')
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
    -- Popped and not reached (fair tasks went in their place): back where they were.
    for j = 1, #popped, 2 do
      local left = popped[j]
      if popped_at[left] then
        redis.call('ZADD', KEYS[o + 1], popped_at[left], left)
        popped_at[left] = nil
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
