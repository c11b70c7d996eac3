-- _lib.lua: helpers prepended, whole, to every script of this directory (lua.py); not an
-- operation itself.
--
-- Conventions shared by all scripts:
--   * times are epoch seconds on the broker's clock: `now` arguments are "" and the script
--     reads the server's TIME (see clock below), or a test's injected clock; relative times
--     (delays, ttls, retention, lease lengths) arrive in seconds and are added here;
--   * absolute times arrive as strings in ARGV; Lua compares them (tonumber) and stores the
--     strings unchanged; sums are written with %.17g, so no precision is lost;
--   * every state zset member is "<16 hex digits of the enqueue sequence><task id>", so equal
--     scores sort in enqueue order; the task hash keeps its member in field "m";
--   * the pending zset's score is the ready score (below): priority first, then ready time;
--     the other zsets are scored by a time;
--   * replies never carry Lua numbers that are not integers (Redis would truncate them);
--   * payload, headers and result are stored in chunks "<tag>:0", "<tag>:1", ... (see below).

-- The broker's clock as a string: `now_s` when a test injects a clock, else the server's
-- TIME. Redis (5 and newer) replicates a script's effects, not the script, so reading TIME
-- before writing is allowed and every replica stores the same moments.
local function clock(now_s)
  if now_s ~= '' then
    return now_s
  end
  local t = redis.call('TIME')
  return t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

-- `seconds` (a string) after the moment `now_s`, as a string that reads back exactly.
local function later(now_s, seconds)
  return string.format('%.17g', tonumber(now_s) + tonumber(seconds))
end

-- The earlier of two moments given as strings (the rescuer's fence and the clock's now).
local function earliest(a, b)
  if tonumber(a) <= tonumber(b) then
    return a
  end
  return b
end

-- Lua's stack holds about 8,000 values (LUAI_MAXCSTACK): `unpack` of a longer list fails
-- ("too many results to unpack"), and a script that fails keeps the writes it made before.
-- Lists that grow with a group's size go to Redis in slices of SLICE values (even: HSET
-- pairs stay whole).
local SLICE = 500

-- `cmd key v1 v2 ...` for the values of `list`, one call per slice.
local function call_in_slices(cmd, key, list)
  for i = 1, #list, SLICE do
    redis.call(cmd, key, unpack(list, i, math.min(i + SLICE - 1, #list)))
  end
end

-- HMGET of any number of fields (false for a missing one), one call per slice.
local function hmget_all(key, fields)
  local out = {}
  for i = 1, #fields, SLICE do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + SLICE - 1, #fields)))
    for j = 1, #part do
      out[#out + 1] = part[j]
    end
  end
  return out
end

-- The task id inside a zset member.
local function member_id(m)
  return string.sub(m, 17)
end

-- The queue's key prefix ("P:{Q}") of a key of it: the part up to the hash tag's closing
-- brace (the same slot: ":pending", ":scheduled", ":waiting", ":fair"... follow it).
local function queue_base(task_key)
  return string.sub(task_key, 1, string.find(task_key, '}', 1, true))
end

-- W22 fair limits. A task whose first limit is fair stores its template ("fg") and its turn
-- ("ft"), given by enqueue_task from the queue's turns zset ("P:{Q}:turns": member
-- "<template>\0<key>" scored with the last turn of a partition, "<template>\0" with the
-- template's round, the turn of the latest of its tasks a claim started: ZADD GT). While pending and not held it has an
-- entry "<template>\0<band><turn>\0<member>" (score 0) in the fair zset ("P:{Q}:fair"):
-- by lex order a template's tasks by priority (band 100 - priority, 3 digits), then turn
-- (15 digits), then enqueue order. Entries are added where a task becomes pending and taken
-- out where a claim takes or holds it; one whose task is no longer pending is dropped when a
-- claim meets it (claim.lua), and a claim adds the entry of a fair task it pops.
local function fair_entry(template, prio, turn, m)
  return template .. '\0' .. string.format('%03d%015d', 100 - tonumber(prio or 0), tonumber(turn))
    .. '\0' .. m
end

-- A task that became pending joins its template's line, if it has a fair limit.
local function fair_join(task_key, m)
  local f = redis.call('HMGET', task_key, 'fg', 'ft', 'prio')
  if f[1] then
    redis.call('ZADD', queue_base(task_key) .. ':fair', 0, fair_entry(f[1], f[3], f[2], m))
  end
end

-- Tell idle workers that `queue_notify` (a queue's "P:{Q}:notify") has tasks to claim: a
-- message on that channel for the workers that subscribe, and a token in the list of the same
-- name for one worker blocked on it (BLPOP, with its claim queued behind). One token at most
-- (while one waits, the next is not needed): a claim that leaves tasks behind puts it back for
-- the next worker (see claim.lua).
local function wake_workers(queue_notify)
  redis.call('PUBLISH', queue_notify, '1')
  if redis.call('EXISTS', queue_notify) == 0 then
    redis.call('LPUSH', queue_notify, '1')
  end
end

-- The pending zset orders by priority, then ready time (next_process_at), then enqueue order
-- (the member). Priority p (-100..100, stored as field "prio" when not 0) moves the score by
-- whole bands of 2^32 s, wider than any epoch time to 2106: score = time - p * 2^32, so a
-- higher priority sorts first and, within one priority, the earlier time does. At |p| = 100
-- the score keeps the time to about 0.1 ms (a double's 53 bits); ties go to enqueue order.
-- Priority 0 (the default) stores the time string itself, unchanged.
local BAND = 4294967296
local function ready_score(npa, prio)
  if not prio or prio == '' or prio == '0' then
    return npa
  end
  return string.format('%.17g', tonumber(npa) - tonumber(prio) * BAND)
end

-- The ready time a pending score holds (the inverse of ready_score).
local function ready_time(score)
  local s = tonumber(score)
  return s - math.floor(s / BAND) * BAND
end

-- Whether task `id` owns the lock on unique key `key` (a later task may have taken it once
-- its ttl passed; the task's own hash still names the key).
local function holds(unique_hash, key, id)
  local owner = redis.call('HGET', unique_hash, key)
  return owner ~= false and id ~= false and string.sub(owner, 1, #id + 1) == id .. '|'
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

-- Add to the processed/failed counters of the queue (total, UTC day, I1) and of the minute
-- of `now_s` (fields p:<minute> and f:<minute>, the minute's start in epoch seconds, of a
-- hash per UTC day, kept minute_ttl seconds).
local function count(stats_key, day_key, day_ttl, processed, failed, minute_key, now_s,
                     minute_ttl)
  local minute = string.format('%d', math.floor(tonumber(now_s) / 60) * 60)
  if processed > 0 then
    redis.call('HINCRBY', stats_key, 'processed', processed)
    redis.call('HINCRBY', day_key, 'processed', processed)
    redis.call('HINCRBY', minute_key, 'p:' .. minute, processed)
  end
  if failed > 0 then
    redis.call('HINCRBY', stats_key, 'failed', failed)
    redis.call('HINCRBY', day_key, 'failed', failed)
    redis.call('HINCRBY', minute_key, 'f:' .. minute, failed)
  end
  if processed > 0 or failed > 0 then
    redis.call('EXPIRE', day_key, day_ttl)
    redis.call('EXPIRE', minute_key, minute_ttl)
  end
end

-- Move up to `bound` members of zset `src` whose score (a time) is <= now into `pending` at
-- their ready score, marking their hashes pending. Returns how many moved.
local function forward_due(src, pending, task_prefix, now, bound)
  local due = redis.call('ZRANGEBYSCORE', src, '-inf', now, 'WITHSCORES', 'LIMIT', 0, bound)
  local moved = 0
  for i = 1, #due, 2 do
    local m, score = due[i], due[i + 1]
    redis.call('ZREM', src, m)
    local key = task_prefix .. member_id(m)
    local f = redis.call('HMGET', key, 'prio', 'fg', 'ft')
    local prio = f[1]
    if prio or f[2] or redis.call('EXISTS', key) == 1 then
      redis.call('HSET', key, 'state', 'pending')
      redis.call('ZADD', pending, ready_score(score, prio), m)
      if f[2] then  -- W22: into its template's line
        redis.call('ZADD', queue_base(pending) .. ':fair', 0, fair_entry(f[2], prio, f[3], m))
      end
      moved = moved + 1
    end
  end
  return moved
end

-- A hash field value longer than 64 bytes (hash-max-listpack-value) turns the whole task hash
-- from a compact listpack into a hashtable, about three times the memory. So payload ("p"),
-- headers ("h") and result ("r") are stored as 64-byte chunks while the hash stays within the
-- listpack entry limit; larger values are kept whole (the hash is a hashtable anyway then).
-- (benchmarks/redis_memory.py --payload 200: 748 bytes per task with chunks, 1,210 without.)
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

-- A value set_chunked stored, and how many chunks it took (nil, 0: none).
local function read_chunked(key, tag)
  local parts = {}
  while true do
    local part = redis.call('HGET', key, tag .. ':' .. #parts)
    if not part then
      break
    end
    parts[#parts + 1] = part
  end
  if #parts == 0 then
    return nil, 0
  end
  return table.concat(parts), #parts
end

-- Drop the n chunks of a value set_chunked stored.
local function drop_chunked(key, tag, n)
  for i = 0, n - 1 do
    redis.call('HDEL', key, tag .. ':' .. i)
  end
end

-- Append `value` to the HSET field list `f` (n entries so far) as "<tag>:0", "<tag>:1", ...
-- chunks, like set_chunked, so a task is written with one HSET. Returns the new length.
local function add_chunked(f, n, tag, value)
  if #value <= CHUNK or #value > MAX_CHUNKED then
    f[n + 1] = tag .. ':0'
    f[n + 2] = value
    return n + 2
  end
  local c = 0
  for i = 1, #value, CHUNK do
    f[n + 1] = tag .. ':' .. c
    f[n + 2] = string.sub(value, i, i + CHUNK - 1)
    n = n + 2
    c = c + 1
  end
  return n
end

-- Whether a task hash holds a live task (a completed one past its retention is gone).
local function taken_by(task_key, now)
  if redis.call('EXISTS', task_key) == 0 then
    return false
  end
  local cur = redis.call('HMGET', task_key, 'state', 'expires_at')
  return not (cur[1] == 'completed' and cur[2] and tonumber(cur[2]) <= now)
end

-- The id of the task whose lock on unique key `unique` (in unique hash `unique_hash`)
-- still holds at `now`; false when none does.
local function unique_holder(unique_hash, unique, now)
  local owner = redis.call('HGET', unique_hash, unique)
  if owner then
    local sep = string.find(owner, '|', 1, true)
    if sep and tonumber(string.sub(owner, sep + 1)) > now then
      return string.sub(owner, 1, sep - 1)
    end
  end
  return false
end

-- The refusal of task `i` of a batch whose id or unique lock a live task holds:
-- {"conflict", i, <HGETALL of that task>} | {"duplicate", i, <its id>}; nil when free.
local function refusal(i, task_key, unique_hash, unique, now)
  if taken_by(task_key, now) then
    return {'conflict', i, redis.call('HGETALL', task_key)}
  end
  local holder = unique ~= '' and unique_holder(unique_hash, unique, now)
  if holder then
    return {'duplicate', i, holder}
  end
  return nil
end

-- Create one task: the body of enqueue.lua and enqueue_many.lua, shared with the
-- follow-ups of complete.lua, archive.lua and admin_move.lua. `qk` is the queue's keys at qk[qo+1..qo+5]:
-- pending, scheduled, completed, unique hash, sequence counter. The task's 12 fields are
-- a[ao+1..ao+12]: id, type, payload, max_retry, timeout (""), deadline (""),
-- process_at ("" = now), state (pending | scheduled), retention, unique key (""),
-- unique lock ttl in seconds (""), headers JSON (""), then a[ao+13] the delay in seconds
-- ("" = none: process_at holds; the delay and the ttl count from the broker's clock) and
-- a[ao+14] the priority ("0" = default);
-- a[ao+15] the limits JSON ("" = none; stored as field "L", W13).
-- Returns <the clock it read> (created) | {"conflict", <HGETALL of the existing task>} |
-- {"duplicate", <task id>}, and whether the task is pending now (the caller publishes the
-- wake-up).
local function enqueue_task(task_key, qk, qo, now_s, a, ao)
  now_s = clock(now_s)
  local now = tonumber(now_s)
  local id = a[ao + 1]

  if redis.call('EXISTS', task_key) == 1 then
    local cur = redis.call('HMGET', task_key, 'state', 'expires_at', 'm')
    -- A completed task past its retention counts as gone even before the janitor runs.
    if cur[1] == 'completed' and cur[2] and tonumber(cur[2]) <= now then
      redis.call('ZREM', qk[qo + 3], cur[3])
      redis.call('DEL', task_key)
    else
      return {'conflict', redis.call('HGETALL', task_key)}, false
    end
  end

  local unique = a[ao + 10]
  if unique ~= '' then
    local holder = unique_holder(qk[qo + 4], unique, now)
    if holder then
      return {'duplicate', holder}, false
    end
    redis.call('HSET', qk[qo + 4], unique, id .. '|' .. later(now_s, a[ao + 11]))
  end

  local seq = redis.call('INCR', qk[qo + 5])
  local m = string.format('%016x', seq) .. id
  local state, npa = a[ao + 8], a[ao + 7]
  if a[ao + 13] ~= '' then
    npa = later(now_s, a[ao + 13])
  elseif npa == '' then
    npa = now_s
  end
  local f = {
    'id', id, 'type', a[ao + 2], 'state', state, 'max_retry', a[ao + 4], 'npa', npa,
    'enqueued_at', now_s, 'm', m,
  }
  local n = 14
  -- Defaults (retried 0, retention 0, no timeout...) are not stored: smaller hashes.
  if a[ao + 9] ~= '0' and tonumber(a[ao + 9]) > 0 then
    f[n + 1] = 'retention'; f[n + 2] = a[ao + 9]; n = n + 2
  end
  if a[ao + 5] ~= '' then f[n + 1] = 'timeout'; f[n + 2] = a[ao + 5]; n = n + 2 end
  if a[ao + 6] ~= '' then f[n + 1] = 'deadline'; f[n + 2] = a[ao + 6]; n = n + 2 end
  if unique ~= '' then  -- "uu": until when it holds the key, for the inspector
    f[n + 1] = 'unique_key'; f[n + 2] = unique
    f[n + 3] = 'uu'; f[n + 4] = later(now_s, a[ao + 11]); n = n + 4
  end
  local prio = a[ao + 14]
  if prio ~= '0' then f[n + 1] = 'prio'; f[n + 2] = prio; n = n + 2 end
  n = add_chunked(f, n, 'p', a[ao + 3])
  if a[ao + 12] ~= '' then n = add_chunked(f, n, 'h', a[ao + 12]) end
  local fair, turn = nil, nil
  if a[ao + 15] ~= '' then
    f[n + 1] = 'L'; f[n + 2] = a[ao + 15]; n = n + 2
    -- W22: a fair limit is the first, the only one with a string after a comma (its
    -- template): one turn after its partition's last, never before the template's round.
    if string.find(a[ao + 15], ',"', 1, true) then
      local spec = cjson.decode(a[ao + 15])[1]
      fair = spec[5]
      local turns = queue_base(task_key) .. ':turns'
      local part = fair .. '\0' .. spec[1]
      local t = redis.call('ZMSCORE', turns, part, fair .. '\0')
      turn = string.format('%d', math.max(tonumber(t[1] or 0), tonumber(t[2] or 0)) + 1)
      redis.call('ZADD', turns, turn, part)
      f[n + 1] = 'fg'; f[n + 2] = fair; f[n + 3] = 'ft'; f[n + 4] = turn; n = n + 4
    end
  end
  redis.call('HSET', task_key, unpack(f, 1, n))

  if state == 'pending' then
    redis.call('ZADD', qk[qo + 1], ready_score(npa, prio), m)
    if fair then
      redis.call('ZADD', queue_base(task_key) .. ':fair', 0, fair_entry(fair, prio, turn, m))
    end
    return now_s, true
  end
  redis.call('ZADD', qk[qo + 2], npa, m)
  return now_s, false
end

-- Create the follow-up tasks passed after a script's own keys and arguments:
-- groups of 6 KEYS from index nk + 1 and of 17 ARGV from index na + 1, laid out as KEYS and
-- ARGV of enqueue.lua. A follow-up whose id or unique key is taken is skipped.
-- On a Redis Cluster a follow-up into another hash slot comes with its 6 KEYS all naming
-- this queue's outbox hash: its 17 ARGV are kept there (netstrings, field "<channel> <id>")
-- and the client runs them as enqueue.lua in the other slot, then deletes the field.
local function enqueue_follow_ups(nk, na)
  local n = (#KEYS - nk) / 6
  for i = 0, n - 1 do
    local ko, ao = nk + 6 * i, na + 17 * i
    if KEYS[ko + 1] == KEYS[ko + 2] then
      local parts = {}
      for j = 1, 17 do
        local v = ARGV[ao + j]
        parts[j] = #v .. ':' .. v
      end
      redis.call('HSET', KEYS[ko + 1], ARGV[ao + 2] .. ' ' .. ARGV[ao + 3], table.concat(parts))
    else
      local _, pending = enqueue_task(KEYS[ko + 1], KEYS, ko + 1, ARGV[ao + 1], ARGV, ao + 2)
      if pending then
        wake_workers(ARGV[ao + 2])
      end
    end
  end
end

-- Dependencies (enqueue after=, see enqueue_after.lua). A dependency's hash lists the
-- waiting tasks it holds back in field "D" (a JSON array of their task hash names); a
-- waiting task counts the dependencies it still waits for in field "wf" and sits in its
-- queue's waiting zset, named after its task hash as keys.py names them: the part up to the
-- closing brace of the hash tag, then ":waiting" (and ":pending", ":scheduled", ":notify").

-- A waiting task waits no more: out of the waiting zset, pending (its workers woken) or
-- scheduled while its due time is ahead (durq.states.released).
local function release_waiting(wkey, now_s)
  local w = redis.call('HMGET', wkey, 'npa', 'm', 'prio')
  local base = queue_base(wkey)
  redis.call('HDEL', wkey, 'wf')
  redis.call('ZREM', base .. ':waiting', w[2])
  if tonumber(w[1]) > tonumber(now_s) then
    redis.call('HSET', wkey, 'state', 'scheduled')
    redis.call('ZADD', base .. ':scheduled', w[1], w[2])
  else
    redis.call('HSET', wkey, 'state', 'pending')
    redis.call('ZADD', base .. ':pending', ready_score(w[1], w[3]), w[2])
    fair_join(wkey, w[2])
    wake_workers(base .. ':notify')
  end
end

-- Replace a value stored by set_chunked (every old chunk goes: the new one may have fewer).
local function reset_chunked(key, tag, value)
  local i = 0
  while redis.call('HDEL', key, tag .. ':' .. i) == 1 do
    i = i + 1
  end
  set_chunked(key, tag, value)
end

-- Groups. A member's task hash holds its group's hash key ("g") and its position ("gp"). The
-- group hash: total, finished, retention, and its follow-up as enqueue.lua's KEYS (k1..k6)
-- and ARGV (a1..a17; a5 is the payload's head), with "tail" closing the payload; g..':e'
-- maps position -> entry (first the member's "deleted" entry), g..':s' position -> final
-- state. These keys are read from the task hash: one slot when the group and its members
-- share a queue, several (single node only) otherwise. Field "w" (groups made since the
-- follow-up exists from the start): the follow-up k1 was created waiting with the members.
--
-- Record a member's first final outcome (entry "" keeps the stored "deleted" entry), count
-- it, and when it was the last release the follow-up with its payload (a group without "w":
-- create it), exactly once: HSETNX on the state.
-- Call before the task hash is deleted.
local function finish_member(task_key, state, entry, now_s)
  now_s = clock(now_s)
  local at = redis.call('HMGET', task_key, 'g', 'gp')
  local g, pos = at[1], at[2]
  if not g or redis.call('HSETNX', g .. ':s', pos, state) == 0 then
    return
  end
  if entry ~= '' then
    redis.call('HSET', g .. ':e', pos, entry)
  end
  local finished = redis.call('HINCRBY', g, 'finished', 1)
  local head = redis.call('HMGET', g, 'total', 'retention', 'a5', 'tail')
  local total = tonumber(head[1])
  if finished < total then
    return
  end
  redis.call('HSET', g, 'finished_at', now_s)
  if head[3] then
    local fields = {}
    for i = 0, total - 1 do
      fields[#fields + 1] = tostring(i)
    end
    local entries = hmget_all(g .. ':e', fields)
    local k = redis.call('HMGET', g, 'k1', 'k2', 'k3', 'k4', 'k5', 'k6', 'w')
    if k[7] then
      -- Created waiting with the group: its payload now, and released (unless it was
      -- cancelled or deleted meanwhile: then it never runs).
      if redis.call('HGET', k[1], 'state') == 'waiting' then
        reset_chunked(k[1], 'p', head[3] .. table.concat(entries, ',') .. head[4])
        release_waiting(k[1], now_s)
      end
    else
      -- A group created before its follow-up waited: the follow-up is created now.
      local a = redis.call('HMGET', g, 'a1', 'a2', 'a3', 'a4', 'a5', 'a6', 'a7', 'a8', 'a9',
        'a10', 'a11', 'a12', 'a13', 'a14', 'a15', 'a16', 'a17')
      -- Due now (no process_at, no delay), pending, the members' entries between head and tail.
      a[1] = now_s
      a[5] = head[3] .. table.concat(entries, ',') .. head[4]
      a[9] = ''
      a[10] = 'pending'
      a[15] = ''
      local _, pending = enqueue_task(k[1], k, 1, now_s, a, 2)
      if pending then
        wake_workers(a[2])
      end
    end
  end
  -- The record stays for the group's retention, then Redis drops it.
  local ms = math.floor(tonumber(head[2]) * 1000)
  for _, key in ipairs({g, g .. ':e', g .. ':s'}) do
    if ms > 0 then
      redis.call('PEXPIRE', key, ms)
    else
      redis.call('DEL', key)
    end
  end
end

-- A task the inspector deletes: an unfinished group member finishes as deleted.
local function forget_member(task_key, now_s)
  local state = redis.call('HGET', task_key, 'state')
  if state ~= 'completed' and state ~= 'archived' then
    finish_member(task_key, 'deleted', '', now_s)
  end
end

-- W13 flow control. A key's counter is one field of the queue's limits hash, the string
-- "running|concurrency|rate|per|tokens|refilled_at|need|o_concurrency|o_rate|o_per" (empty
-- for none): what runs, the token bucket, the last limit a task of the key carried, (W24)
-- the largest cost of the tasks held on it ("need", absent in counters written before it,
-- read as 1) and (W23) an operator's override of the limit (absent in counters written
-- before it: a part set wins over every task's own). brokers/limiter.py does the same in
-- Python. Tasks held on a key are members "<key>\0<member>" (score 0) of the held zset;
-- keys with held tasks are in the waiting set. A task's limits are its field "L" (JSON).
local function load_counter(hash, key)
  local raw = redis.call('HGET', hash, key)
  if not raw then
    return nil
  end
  local f = {}
  for part in string.gmatch(raw .. '|', '([^|]*)|') do
    f[#f + 1] = part
  end
  return {running = tonumber(f[1]) or 0, conc = tonumber(f[2]), rate = tonumber(f[3]),
    per = tonumber(f[4]), tokens = tonumber(f[5]) or 0, at = tonumber(f[6]) or 0,
    need = tonumber(f[7] or '') or 1, oconc = tonumber(f[8] or ''),
    orate = tonumber(f[9] or ''), oper = tonumber(f[10] or '')}
end

local function save_counter(hash, key, c)
  local function opt(v)
    if v == nil then return '' end
    return string.format('%.17g', v)
  end
  redis.call('HSET', hash, key, table.concat({string.format('%d', c.running), opt(c.conc),
    opt(c.rate), opt(c.per), string.format('%.17g', c.tokens), string.format('%.17g', c.at),
    string.format('%d', c.need or 1), opt(c.oconc), opt(c.orate), opt(c.oper)}, '|'))
end

-- How long ago the bucket of a key no claim counted was refilled: twice the longest period
-- of a rate (durq.task.MAX_RATE_PER), so it is full at any rate.
local FRESH_AGE = 2 * 86400 * 366

-- W23: a limit as the claim applies it: each part of the key's override replaces the
-- limit's own (limiter.in_force); `s` is a task's limit or the counter itself.
local function in_force(s, c)
  local conc, rate, per = s.conc, s.rate, s.per
  -- W25: a sequence runs one at a time; an override may pause it, not widen it.
  if c.oconc and not (s.seq and conc and conc < c.oconc) then conc = c.oconc end
  if c.orate then rate, per = c.orate, c.oper end
  return conc, rate, per
end

-- Tokens in the bucket at `now`, refilled at rate/per (the key's in force when not given).
local function bucket_at(c, now, rate, per)
  if not rate or not per then
    local _
    _, rate, per = in_force(c, c)
  end
  if not rate or not per then
    return nil
  end
  local elapsed = now - c.at
  if elapsed < 0 then elapsed = 0 end
  return math.min(rate, c.tokens + elapsed * rate / per)
end

-- W24: the units the tasks held on a key wait for, at most what its limit in force holds.
local function needed(c)
  local need = c.need or 1
  local conc, rate = in_force(c, c)
  if conc and conc < need then need = conc end
  if rate and rate < need then need = rate end
  if need < 1 then return 1 end
  return need
end

-- How many held tasks of the key may come back at `now` (none until their need is free).
local function room_of(c, now)
  local conc = in_force(c, c)
  local room = 1000000000
  if conc then room = conc - c.running end
  local tokens = bucket_at(c, now)
  if tokens then room = math.min(room, math.floor(tokens + 1e-9)) end
  if room < needed(c) then return 0 end
  return room
end

-- When the tokens its held tasks need come, if only the bucket holds the key back (nil
-- otherwise).
local function next_room_at(c, now)
  local need = needed(c)
  local conc, rate, per = in_force(c, c)
  if conc and c.running + need > conc then return nil end
  local tokens = bucket_at(c, now)
  if not tokens then return nil end
  if tokens >= need then return now end
  return now + (need - tokens) * per / rate
end

-- One limit of a task, from its JSON [key, concurrency, rate, per, template, cost,
-- sequence] (cjson.null -> nil; cost 1 and no sequence when absent).
local function spec_of(item)
  local function v(x) if x == cjson.null then return nil end return x end
  return {key = item[1], conc = v(item[2]), rate = v(item[3]), per = v(item[4]),
    cost = v(item[6]) or 1, seq = item[7] == 1}
end

-- An attempt of the task ended: each of its keys gets its cost back. W25: with which
-- "keep" (an end that is not final, decided by the caller's broker), its sequences' keys
-- stay counted and the task is marked as holding them (field "K"); with "kept", only those
-- are given back (the task leaves without running). Returns whether tasks are held on one
-- of the keys given back (the caller wakes the queue's workers).
local function release_limits(task_key, limits_hash, waiting_set, which)
  local raw = redis.call('HGET', task_key, 'L')
  if not raw then
    return false
  end
  local wake, kept = false, false
  for _, item in ipairs(cjson.decode(raw)) do
    local s = spec_of(item)
    if which == 'keep' and s.seq then
      kept = true
    elseif which ~= 'kept' or s.seq then
      local c = load_counter(limits_hash, s.key)
      if c then
        c.running = math.max(0, c.running - s.cost)
        save_counter(limits_hash, s.key, c)
      end
      if redis.call('SISMEMBER', waiting_set, s.key) == 1 then
        wake = true
      end
    end
  end
  if kept then
    redis.call('HSET', task_key, 'K', '1')
  else
    redis.call('HDEL', task_key, 'K')
  end
  return wake
end

-- W25: a task leaving without running (the inspector's archive, cancel or delete) gives
-- back the sequences' keys it kept, if it kept them. Returns whether to wake the workers.
local function give_back_kept(task_key, limits_hash, waiting_set)
  if redis.call('HEXISTS', task_key, 'K') == 0 then
    return false
  end
  return release_limits(task_key, limits_hash, waiting_set, 'kept')
end

-- The held zset ("P:{Q}:held", every score 0) orders each limit key's tasks as a claim takes
-- them: its members are "<key>\0<rank>\0<member>", the rank being the task's pending score
-- (priority, then ready time) as fixed-width text, raised by 2^40 so that the lowest score a
-- priority gives (100 bands of 2^32 s below zero) is still positive; ties go to the member
-- (enqueue order). Entries written before the rank existed read "<key>\0<member>".
local HELD_RAISE = 1099511627776
local function held_entry(key, score, m)
  return key .. '\0' .. string.format('%020.6f', tonumber(score) + HELD_RAISE) .. '\0' .. m
end

-- The pending member inside a held entry (either layout).
local function held_member(entry)
  return string.match(entry, '%z([^%z]*)$')
end

-- Forget the held entry of a task leaving the held set by another way (inspector moves).
local function unhold(task_key, held_zset, m)
  local cur = redis.call('HMGET', task_key, 'held_by', 'hs')
  if cur[1] then
    redis.call('ZREM', held_zset, held_entry(cur[1], cur[2], m), cur[1] .. '\0' .. m)
    redis.call('HDEL', task_key, 'held_by', 'hs')
  end
end


-- `task_key` finished (completed, archived) or is deleted before it finished: each task it
-- holds back counts it; one at zero is released, pending (its workers woken) or scheduled
-- while its due time is ahead (durq.states.released). The list is forgotten, so a task
-- archived, run again and finished again counts nothing twice. `raw`: the field "D" if the
-- caller read it (false or nil: none). Call before the task hash is deleted.
local function release_dependents(task_key, raw, now_s)
  if not raw then
    return
  end
  redis.call('HDEL', task_key, 'D')
  now_s = clock(now_s)
  for _, wkey in ipairs(cjson.decode(raw)) do
    local w = redis.call('HMGET', wkey, 'state', 'wf')
    if w[1] == 'waiting' then
      local left = (tonumber(w[2]) or 1) - 1
      if left > 0 then
        redis.call('HSET', wkey, 'wf', left)
      else
        release_waiting(wkey, now_s)
      end
    end
  end
end
