-- durq PostgreSQL queries. Each block starts with `-- name: x`; whole-line comments are
-- stripped at load time and {schema} becomes the quoted schema name. Every value is a
-- parameter; times are epoch seconds on the broker's clock. {now} is that clock: the server's
-- statement time, or the %(now)s parameter when a test injects a clock. Relative times
-- (delays, ttls, retention, lease lengths) arrive in seconds and are added to {now} here, so
-- a client whose clock is off cannot move them.

-- ---------------------------------------------------------------- migrations and schema

-- name: migrate_lock
-- Serialise concurrent `durq migrate` runs on one schema (released at commit).
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: applied_migrations
SELECT version FROM {schema}.schema_migrations ORDER BY version;

-- name: record_migration
INSERT INTO {schema}.schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: schema_version
-- NULL when the schema or its migrations table does not exist.
SELECT to_regclass(%(table)s) IS NOT NULL AS present;

-- name: current_version
SELECT coalesce(max(version), 0) AS version FROM {schema}.schema_migrations;

-- name: generic_plans
-- Run on each new connection of the broker's pool (not behind PgBouncer, where statements
-- are not prepared): prepared statements keep one generic plan. Left to choose, the server
-- took custom plans for the claim after a backlog (its first executions, those it compares
-- with, were cheap) and planned it again on every call: an idle worker's claim of an empty
-- queue after 10,000 tasks took 0.85-0.93 ms instead of 0.37 (the code before the claim
-- grew: 0.33). The guard skips servers before PostgreSQL 12, which lack the setting.
SELECT set_config('plan_cache_mode', 'force_generic_plan', false) AS mode
WHERE current_setting('server_version_num')::integer >= 120000;

-- name: ping
SELECT 1 AS ok;

-- name: backend_pid
-- The server process behind a connection: behind a transaction pooler it changes from one
-- transaction to the next (see PostgresStorage.behind_transaction_pooler).
SELECT pg_backend_pid() AS pid;

-- name: server_time
-- The server's clock, for what the client computes itself (the day of a counter, reads).
SELECT extract(epoch FROM clock_timestamp())::float8 AS now;

-- ---------------------------------------------------------------- enqueue (E3, E4, E9)

-- name: enqueue_batch
-- A fragment, not run alone: spliced into enqueue and enqueue_fresh in place of
-- {enqueue_batch}. Three CTEs: "x", the batch's rows from one array per column, sent in
-- binary (%(x)b; a column whose values are all NULL comes as one NULL, which unnest pads with
-- NULLs); "clock", the statement's `now`; "known", which records the queues.
x AS (
    SELECT *
    FROM unnest(
        %(queues)b::text[], %(ids)b::text[], %(types)b::text[], %(payloads)b::bytea[],
        %(states)b::text[], %(max_retries)b::integer[], %(timeouts)b::float8[],
        %(deadlines)b::float8[], %(process_ats)b::float8[], %(process_ins)b::float8[],
        %(retentions)b::float8[], %(unique_keys)b::text[], %(unique_ttls)b::float8[],
        %(headers)b::text[], %(priorities)b::integer[], %(limits)b::text[]
    ) WITH ORDINALITY AS x(queue, id, type, payload, state, max_retry, timeout, deadline,
                           process_at, process_in, retention, unique_key, unique_ttl, headers,
                           priority, limits, ord)
),
clock AS (
    SELECT {now} AS now
),
known AS (
    INSERT INTO {schema}.queues (name)
    SELECT DISTINCT queue FROM x
    ON CONFLICT DO NOTHING
)

-- name: enqueue_insert
-- A fragment, not run alone: the insert of the rows of "x" (enqueue_batch) in batch order,
-- spliced into enqueue and enqueue_fresh, which add their conflict clause and answer.
INSERT INTO {schema}.tasks AS t (
    queue, id, type, payload, state, max_retry, timeout, deadline, next_process_at,
    enqueued_at, retention, unique_key, unique_until, headers, priority, limits
)
SELECT queue, id, type, payload, state, max_retry, timeout, deadline,
       coalesce(clock.now + process_in, process_at, clock.now),
       clock.now, retention, unique_key, clock.now + unique_ttl,
       coalesce(headers::jsonb, '{{}}'::jsonb), priority, limits::jsonb
FROM x, clock
ORDER BY ord

-- name: enqueue
-- Insert a batch in one statement. ON CONFLICT DO NOTHING covers both the primary key (E3)
-- and the unique-key index (E4); the rows not returned were refused and are looked up next.
-- The answer is one row: how many were inserted and, only when some were refused, which ones
-- (the client already knows every inserted column). The same statement records the queues.
-- With a channel it also wakes listeners of queues that got pending work, delivered when the
-- surrounding transaction commits (a rollback wakes nobody): used inside a caller's
-- transaction (E8). Without one (NULL) the broker notifies after its own commit (`notify`),
-- because a NOTIFY inside a writing transaction serialises every such commit in the cluster
-- behind one lock, WAL flush included.
WITH {enqueue_batch},
ins AS (
    {enqueue_insert}
    ON CONFLICT DO NOTHING
    RETURNING t.queue, t.id, t.state
),
woken AS (
    SELECT count(pg_notify(%(channel)s, q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins WHERE state = 'pending') AS q
    WHERE %(channel)s::text IS NOT NULL
)
SELECT count(ins.id) AS n, (SELECT now FROM clock) AS now,
       CASE WHEN count(ins.id) < %(n)s THEN array_agg(ins.queue) END AS queues,
       CASE WHEN count(ins.id) < %(n)s THEN array_agg(ins.id) END AS ids
FROM woken LEFT JOIN ins ON true;

-- name: enqueue_fresh
-- `enqueue` with a plain INSERT, for a batch that commits alone and carries no unique key:
-- it inserts every row or, at the first conflict (a unique violation), none, and the broker
-- sends the batch again as `enqueue`. Conflicts are rare there, and ON CONFLICT costs every
-- row a look-up in each unique index before its insert and one more WAL record after it (a
-- speculative insertion): a sixth of the server's time per task. The answer: the clock read.
WITH {enqueue_batch},
ins AS (
    {enqueue_insert}
)
SELECT now FROM clock;

-- name: enqueue_one
-- `enqueue` for a single task with plain parameters: one item is the common call, and it
-- skips building and unpacking thirteen one-element arrays. Same rules, same answer row.
WITH clock AS (
    SELECT {now} AS now
),
ins AS (
    INSERT INTO {schema}.tasks AS t (
        queue, id, type, payload, state, max_retry, timeout, deadline, next_process_at,
        enqueued_at, retention, unique_key, unique_until, headers, priority, limits
    )
    SELECT %(queue)s, %(id)s, %(type)s, %(payload)s, %(state)s, %(max_retry)s, %(timeout)s,
           %(deadline)s,
           coalesce(clock.now + %(process_in)s::float8, %(process_at)s::float8, clock.now),
           clock.now, %(retention)s, %(unique_key)s, clock.now + %(unique_ttl)s::float8,
           %(headers)s::jsonb, %(priority)s, %(limits)s::jsonb
    FROM clock
    ON CONFLICT DO NOTHING
    RETURNING t.queue, t.state
),
known AS (
    INSERT INTO {schema}.queues (name) VALUES (%(queue)s)
    ON CONFLICT DO NOTHING
),
woken AS (
    SELECT count(pg_notify(%(channel)s, ins.queue)) AS n
    FROM ins
    WHERE ins.state = 'pending' AND %(channel)s::text IS NOT NULL
)
SELECT count(ins.queue) AS n, (SELECT now FROM clock) AS now FROM woken LEFT JOIN ins ON true;

-- name: notify
-- Wake listeners of these queues, in a transaction of its own that writes nothing (so no
-- WAL flush happens while it holds the notification lock).
SELECT count(pg_notify(%(channel)s, q)) AS n FROM unnest(%(queues)b::text[]) AS q;

-- name: enqueue_conflicts
-- Why each refused item was refused: the row holding its task id, or the row holding its
-- unique key. Read after the refusal, never before the insert (no read-then-write race).
SELECT 'id' AS via, t.*
FROM {schema}.tasks AS t
JOIN unnest(%(queues)b::text[], %(ids)b::text[]) AS x(queue, id)
  ON t.queue = x.queue AND t.id = x.id
UNION ALL
SELECT 'key' AS via, t.*
FROM {schema}.tasks AS t
WHERE t.unique_key = ANY(%(keys)b::text[]);

-- name: enqueue_drop_stale_ids
-- A completed task past its retention counts as gone (E3): delete it so the id is free.
DELETE FROM {schema}.tasks AS t
USING unnest(%(queues)b::text[], %(ids)b::text[]) AS x(queue, id)
WHERE t.queue = x.queue AND t.id = x.id
  AND t.state = 'completed' AND t.expires_at <= {now};

-- name: enqueue_drop_stale_keys
-- Release unique keys whose ttl passed (or whose task finished) so the index accepts them.
UPDATE {schema}.tasks
SET unique_key = NULL, unique_until = NULL
WHERE unique_key = ANY(%(keys)b::text[])
  AND (unique_until <= {now} OR state IN ('completed', 'archived'));

-- ---------------------------------------------------------------- claim and leases

-- name: claim_forward
-- A claim's first step when due scheduled/retry rows are in its queues (always before
-- limited_due; before complete_claim when its last answer said so), in the same round trip
-- and transaction: they become pending, a bounded batch (through tasks_by_state, queue by
-- queue in the claim's order, earliest due first), keeping their due time, so the claim then
-- sees them in priority order. The bound holds for the whole batch too: planned without
-- statistics, a per-queue bound alone made the write a hash join over the whole table.
-- SKIP LOCKED: a row that another claim is moving is left to it. One scan per state, each
-- an equality on (queue, state) and a range on next_process_at: with "state IN (...)" the
-- planner may leave the state out of the index condition and read every row of the queue
-- (pending and held ones included) on every claim. Rows are written through their ctid
-- (see claim_lease).
WITH due AS (
    SELECT c.ctid
    FROM unnest(%(queues)b::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT t.ctid
            FROM {schema}.tasks AS t
            WHERE t.queue = q.name AND t.state = 'scheduled' AND t.next_process_at <= {now}
            ORDER BY t.next_process_at, t.seq
            LIMIT %(forward)s
            FOR UPDATE SKIP LOCKED
        ) AS s
        UNION ALL
        SELECT * FROM (
            SELECT t.ctid
            FROM {schema}.tasks AS t
            WHERE t.queue = q.name AND t.state = 'retry' AND t.next_process_at <= {now}
            ORDER BY t.next_process_at, t.seq
            LIMIT %(forward)s
            FOR UPDATE SKIP LOCKED
        ) AS r
        LIMIT %(forward)s
    ) AS c
    LIMIT %(forward)s
)
UPDATE {schema}.tasks AS t
SET state = 'pending'
FROM due
WHERE t.ctid = due.ctid;

-- name: lease_set
-- A fragment (claim, lease_rows): an active lease with a fresh fencing token.
SET state = 'active',
    lease_token = gen_random_uuid()::text,
    lease_expires_at = {now} + %(lease_seconds)s,
    worker_id = %(worker_id)s,
    started_at = {now},
    cancel_requested = false,
    held_by = NULL;

-- name: claimed_columns
-- A fragment (claim, lease_rows): the columns of a claimed row, in the order
-- rows.CLAIM_COLUMNS names them. The steps (NULL for most tasks) spare a running attempt
-- the read at its first step (durq.worker.steps).
t.id, t.queue, t.type, t.payload, t.max_retry, t.retried, t.last_error, t.timeout,
t.deadline, t.next_process_at, t.enqueued_at, t.retention, t.lost, t.headers::text,
t.lease_token, t.seq, t.started_at, t.lease_expires_at, t.priority, t.limits::text, t.steps;

-- name: claimable_due
-- A fragment, not run alone: spliced into claim and limited_due in place of
-- {claimable_due}. Due rows per queue through the partial index (tasks_claimable; held rows
-- are out of it), locked with SKIP LOCKED so concurrent workers take different rows (W10),
-- filled from the queues in the order given, with their limits and their row's address
-- (ctid: the claim's write goes straight to the row it locked; see claim_lease).
SELECT c.queue, c.id, c.limits, c.priority, c.next_process_at, c.seq, c.ctid,
       c.fair_template, c.fair_turn, c.kept
FROM unnest(%(queues)b::text[]) WITH ORDINALITY AS q(name, ord)
CROSS JOIN LATERAL (
    SELECT t.queue, t.id, t.priority, t.next_process_at, t.seq, t.limits, t.ctid,
           t.fair_template, t.fair_turn, t.kept
    FROM {schema}.tasks AS t
    WHERE t.queue = q.name
      AND t.state = 'pending'
      AND t.held_by IS NULL
    ORDER BY t.priority DESC, t.next_process_at, t.seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS c
WHERE NOT EXISTS (SELECT 1 FROM {schema}.queues AS p WHERE p.name = q.name AND p.paused)
ORDER BY q.ord, c.priority DESC, c.next_process_at, c.seq
LIMIT %(limit)s;

-- name: claim_due
-- A fragment (claim, complete_claim): the due rows a claim may take (claimable_due), and
-- whether due scheduled/retry rows must be forwarded first. The statement then names the
-- rows it leases ("taken": ctids of due rows without limits) before claim_lease.
-- With check_due, due scheduled/retry rows
-- in these queues (not yet pending, so not in the claim index) make it lease nothing
-- ("forward_first"): the broker forwards them and claims again, so the claim order holds.
forward_first AS (
    -- One probe per state (as in claim_forward): both the queue and the state are index
    -- conditions on tasks_by_state, so pending and held rows are never read here.
    SELECT %(check_due)s::boolean AND (
        EXISTS (
            SELECT 1 FROM {schema}.tasks AS t
            WHERE t.queue = ANY(%(queues)b::text[]) AND t.state = 'scheduled'
              AND t.next_process_at <= {now}
        )
        OR EXISTS (
            SELECT 1 FROM {schema}.tasks AS t
            WHERE t.queue = ANY(%(queues)b::text[]) AND t.state = 'retry'
              AND t.next_process_at <= {now}
        )
    ) AS due
),
due AS (
    {claimable_due}
)

-- name: claim_lease
-- A fragment (claim, complete_claim), after claim_due and the statement's "taken": mark the
-- rows taken active with a fresh fencing token and lease ("leased"). Rows with limits are
-- not leased here (W13): "more" says whether some were due (limited: the broker then claims
-- them in Python) and gives the counters of keys with held tasks (held), whose room the
-- limiter reads.
-- Rows locked in this statement are written through their ctid, the address the lock was
-- taken at: a join on (queue, id) left the index to the plan, and a plan made while the
-- table was empty (prepared statements keep theirs) read every row of the queue, history
-- included, on each claim until the next ANALYZE. A row another transaction changed after
-- this statement's snapshot is locked in its new version, which the write cannot see: it
-- is not leased, and "moved" tells the broker to claim again at once.
leased AS (
    UPDATE {schema}.tasks AS t
    {lease_set}
    FROM taken
    WHERE t.ctid = taken.ctid
      AND NOT (SELECT f.due FROM forward_first AS f)
    RETURNING {claimed_columns}
),
more AS (
    SELECT EXISTS (SELECT 1 FROM due WHERE due.limits IS NOT NULL) AS limited,
        -- Counters of keys with held tasks and no running attempt in the way: the broker's
        -- limiter says whether one has room or when a token comes (limits_waiting).
        -- The concurrency in force is the override's when set (W23).
        (SELECT jsonb_agg(jsonb_build_array({now}, l.running, l.concurrency, l.rate, l.per,
                                            l.tokens, l.refilled_at, l.need,
                                            l.override_concurrency, l.override_rate,
                                            l.override_per))::text
         FROM {schema}.limits AS l
         WHERE l.queue = ANY(%(queues)b::text[]) AND l.waiting
           AND (coalesce(l.override_concurrency, l.concurrency) IS NULL
                OR l.running < coalesce(l.override_concurrency, l.concurrency))) AS held,
        -- A row locked here that another transaction changed since the snapshot was not
        -- leased: the broker claims again at once.
        NOT (SELECT f.due FROM forward_first AS f)
            AND (SELECT count(*) FROM taken) > (SELECT count(*) FROM leased) AS moved
)

-- name: claim_now
-- The claim of limited work decides in Python (durq.brokers.limiter) at this time: the
-- broker's clock as the server reads it (or a test's).
SELECT {now} AS now;

-- name: limited_due
-- The claim of limited work, first step: due rows as claim takes them (claimable_due, up to
-- %(limit)s: the free slots and a look-ahead past them), locked, with their limits.
SELECT d.queue, d.id, d.limits::text AS limits, d.priority, d.next_process_at, d.seq,
       d.ctid::text AS ctid, d.fair_template, d.fair_turn, d.kept
FROM (
    {claimable_due}
) AS d;

-- name: fair_due
-- W22, in the claim of limited work: the claimable tasks of each fair template of these
-- queues (fair_rounds, a row per template) in the order its partitions take turns:
-- priority, then turn, then enqueue order (tasks_fair), as many as the claim wants and a few
-- more (%(fair_limit)s: a template's tasks held on a full partition are skipped), locked as
-- due rows are. Queues without fair limits cost one probe of fair_rounds.
SELECT b.queue, b.id, b.limits::text AS limits, b.priority, b.next_process_at, b.seq,
       b.ctid::text AS ctid, b.fair_template, b.fair_turn, b.kept
FROM {schema}.fair AS g
CROSS JOIN LATERAL (
    SELECT t.queue, t.id, t.limits, t.priority, t.next_process_at, t.seq, t.ctid,
           t.fair_template, t.fair_turn, t.kept
    FROM {schema}.tasks AS t
    WHERE t.queue = g.queue AND t.fair_template = g.template
      AND t.state = 'pending' AND t.held_by IS NULL
    ORDER BY t.priority DESC, t.fair_turn, t.seq
    LIMIT %(fair_limit)s
    FOR UPDATE SKIP LOCKED
) AS b
WHERE g.queue = ANY(%(queues)b::text[]) AND g.key = ''
  AND NOT EXISTS (SELECT 1 FROM {schema}.queues AS p WHERE p.name = g.queue AND p.paused);

-- name: fair_rounds
-- W22: templates whose tasks a claim started: each one's round is at least the latest turn.
UPDATE {schema}.fair AS f
SET turn = greatest(f.turn, x.turn)
FROM unnest(%(queues)b::text[], %(templates)b::text[], %(turns)b::bigint[])
     AS x(queue, template, turn)
WHERE f.queue = x.queue AND f.template = x.template AND f.key = '';

-- name: waiting_limits
-- The counters of the keys of these queues that may have held tasks (limits_waiting),
-- locked in key order: outcomes lock them in the same order. The limiter reads their room.
-- A counter another transaction holds is skipped: that claim or outcome lets its held tasks
-- back (an outcome wakes the queue's workers).
SELECT l.*
FROM {schema}.limits AS l
WHERE l.queue = ANY(%(queues)b::text[]) AND l.waiting
  AND NOT EXISTS (SELECT 1 FROM {schema}.queues AS p WHERE p.name = l.queue AND p.paused)
ORDER BY l.queue, l.key
FOR UPDATE OF l SKIP LOCKED;

-- name: held_tasks
-- The oldest held tasks (tasks_held) of each key with held tasks that no running attempt
-- fills, as many as its free slots (at most %(limit)s), locked as due rows are; the limiter
-- lets back as many as the room (held tasks of a key waiting_limits skipped stay held).
SELECT b.queue, b.id, b.limits::text AS limits, b.priority, b.next_process_at, b.seq,
       b.ctid::text AS ctid, l.key AS held_on, b.fair_template, b.fair_turn, b.kept
FROM {schema}.limits AS l
CROSS JOIN LATERAL (
    SELECT t.queue, t.id, t.limits, t.priority, t.next_process_at, t.seq, t.ctid,
           t.fair_template, t.fair_turn, t.kept
    FROM {schema}.tasks AS t
    WHERE t.queue = l.queue AND t.held_by = l.key AND t.state = 'pending'
    ORDER BY t.priority DESC, t.next_process_at, t.seq
    LIMIT least(%(limit)s, coalesce(l.override_concurrency, l.concurrency) - l.running)
    FOR UPDATE SKIP LOCKED
) AS b
WHERE l.queue = ANY(%(queues)b::text[]) AND l.waiting
  AND (coalesce(l.override_concurrency, l.concurrency) IS NULL
       OR l.running < coalesce(l.override_concurrency, l.concurrency))
  AND NOT EXISTS (SELECT 1 FROM {schema}.queues AS p WHERE p.name = l.queue AND p.paused);

-- name: lock_limits
-- The counters of keys the candidates carry that waiting_limits did not lock, each looked
-- up by itself (limits_pkey). A counter another transaction holds is skipped, as in
-- waiting_limits: a claim never waits for a counter, so claims (which lock theirs in two
-- steps) and outcomes (which wait, in key order) never close a cycle. The candidates that
-- need a skipped counter stay as they are for the next claim.
SELECT l.*
FROM unnest(%(queues)b::text[], %(keys)b::text[]) AS x(queue, key)
CROSS JOIN LATERAL (
    SELECT * FROM {schema}.limits AS l WHERE l.queue = x.queue AND l.key = x.key
) AS l
ORDER BY l.queue, l.key
FOR UPDATE OF l SKIP LOCKED;

-- name: create_limits
-- Counters of keys no claim has counted yet, as the limiter makes them (nothing running, a
-- full bucket); a concurrent claim may have added one first. Only keys this statement
-- does not see are inserted: an insertion whose key matches a row another transaction
-- changes waits for that transaction (a unique index has no SKIP LOCKED), and an outcome
-- changing a counter may be waiting for this claim. A key another claim is adding is
-- waited for, but that claim waits afterwards only here, for keys later in key order: no
-- cycle.
INSERT INTO {schema}.limits AS l (queue, key, concurrency, rate, per, tokens, refilled_at)
SELECT *
FROM unnest(%(queues)b::text[], %(keys)b::text[], %(concurrencies)b::integer[],
            %(rates)b::integer[], %(pers)b::float8[], %(tokens)b::float8[],
            %(refilled)b::float8[]) AS x(queue, key, concurrency, rate, per, tokens, refilled)
WHERE NOT EXISTS (
    SELECT 1 FROM {schema}.limits AS e WHERE e.queue = x.queue AND e.key = x.key
)
ORDER BY 1, 2
ON CONFLICT (queue, key) DO NOTHING;

-- name: give_back_limits
-- Starts a claim counted for rows it could not lease (a trigger refused the write): their
-- running slots come back. Like an outcome it waits for the counters, locked in key order.
WITH back AS (
    SELECT l.queue, l.key, x.n
    FROM unnest(%(queues)b::text[], %(keys)b::text[], %(ns)b::integer[]) AS x(queue, key, n)
    JOIN {schema}.limits AS l ON l.queue = x.queue AND l.key = x.key
    ORDER BY l.queue, l.key
    FOR UPDATE OF l
)
UPDATE {schema}.limits AS l
SET running = greatest(l.running - back.n, 0)
FROM back
WHERE l.queue = back.queue AND l.key = back.key;

-- name: lease_rows
-- The rows the limiter admitted, by the address the claim locked them at: a later statement
-- of the same transaction sees the version it locked, which no one else can change.
UPDATE {schema}.tasks AS t
{lease_set}
FROM unnest(%(ctids)b::text[]) AS x(ctid)
WHERE t.ctid = x.ctid::tid AND t.state = 'pending'
RETURNING {claimed_columns};

-- name: hold_rows
-- Tasks the limiter held, each on the first of its keys without room (out of the claim
-- index until that key has room).
UPDATE {schema}.tasks AS t
SET held_by = x.key
FROM unnest(%(ctids)b::text[], %(keys)b::text[]) AS x(ctid, key)
WHERE t.ctid = x.ctid::tid AND t.state = 'pending';

-- name: save_limits
-- The counters as the limiter left them (they are locked: no one changed them since).
UPDATE {schema}.limits AS l
SET running = x.running, concurrency = x.concurrency, rate = x.rate, per = x.per,
    tokens = x.tokens, refilled_at = x.refilled_at, waiting = x.waiting, need = x.need
FROM unnest(%(queues)b::text[], %(keys)b::text[], %(running)b::integer[],
            %(concurrencies)b::integer[], %(rates)b::integer[], %(pers)b::float8[],
            %(tokens)b::float8[], %(refilled)b::float8[], %(waiting)b::boolean[],
            %(need)b::integer[])
     AS x(queue, key, running, concurrency, rate, per, tokens, refilled_at, waiting, need)
WHERE l.queue = x.queue AND l.key = x.key;

-- name: settle_limits
-- Keys where the claim found room and fewer held tasks than it looked for: their "waiting"
-- flag is cleared if no task is held on them (tasks_held). Their counters are locked, so every
-- claim that held a task on them has committed and this statement's snapshot sees it.
UPDATE {schema}.limits AS l
SET waiting = false
FROM unnest(%(queues)b::text[], %(keys)b::text[]) AS x(queue, key)
WHERE l.queue = x.queue AND l.key = x.key AND l.waiting
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.tasks AS t WHERE t.queue = l.queue AND t.held_by = l.key
  );

-- name: extend_leases
-- Heartbeat for many leases at once; the rows not returned are leases no longer held.
UPDATE {schema}.tasks AS t
SET lease_expires_at = {now} + %(lease_seconds)s
FROM unnest(%(queues)b::text[], %(ids)b::text[], %(tokens)b::text[]) AS x(queue, id, token)
WHERE t.queue = x.queue AND t.id = x.id
  AND t.state = 'active' AND t.lease_token = x.token
RETURNING t.queue, t.id, t.cancel_requested;

-- name: release_limits
-- A fragment, not run alone: the CTEs spliced into the outcome statements in place of
-- {release_limits}. W13: each limit key of the attempts that ended (CTE "ended", with
-- their limits) gives its running units back (W24: the limit's cost, its sixth item, 1 when
-- absent); counters are locked in key order, as claims lock them. "released" says for each
-- key whether tasks are held on it.
freed AS (
    SELECT f.queue, f.key, f.n
    FROM (
        SELECT d.queue, e.v ->> 0 AS key, sum(coalesce((e.v ->> 5)::integer, 1)) AS n
        FROM ended AS d CROSS JOIN LATERAL jsonb_array_elements(d.limits) AS e(v)
        GROUP BY 1, 2
    ) AS f
    JOIN {schema}.limits AS l ON l.queue = f.queue AND l.key = f.key
    ORDER BY f.queue, f.key
    FOR UPDATE OF l
),
released AS (
    UPDATE {schema}.limits AS l
    SET running = greatest(l.running - freed.n, 0)
    FROM freed
    WHERE l.queue = freed.queue AND l.key = freed.key
    RETURNING l.queue, l.waiting
);

-- name: given_back
-- A fragment, not run alone: spliced into retry and requeue in place of {given_back}, the
-- limits an end of an attempt releases: all of the task's, or with %(keep)s (W25) all but
-- its sequences (a limit's seventh item is 1), whose keys the task keeps (NULL: none).
CASE WHEN %(keep)s
     THEN (SELECT jsonb_agg(e.v) FROM jsonb_array_elements(t.limits) AS e(v)
           WHERE coalesce(e.v ->> 6, '0') <> '1')
     ELSE t.limits END;

-- name: kept_back
-- A fragment, not run alone: spliced into the inspector's archive and delete statements in
-- place of {kept_back}: the limits of a task that kept its sequences' keys (W25), whose
-- slots it gives back as it leaves without running: its sequences (NULL when it kept none).
CASE WHEN o.kept
     THEN (SELECT jsonb_agg(e.v) FROM jsonb_array_elements(o.limits) AS e(v)
           WHERE e.v ->> 6 = '1')
     END;

-- name: count_down_lock
-- A fragment, not run alone: count_down's first CTEs, which complete_claim uses with a
-- dep_released of its own. Each waiting task listed counts its dependencies that finished
-- ("dep_counts"); the waiting rows are locked in key order, with what the claim of
-- complete_claim ranks them by ("dep_locked"). A lock waited for re-reads the row, so two
-- steps finishing two dependencies of one task at the same time both count.
-- Each row is looked up by its key (a LATERAL subquery with LIMIT is never flattened into a
-- join, so the plan is always one primary-key probe per task counted, in dep_counts'
-- order): as a join, estimated at 100 rows per jsonb_array_elements, the plan read the
-- whole table for the waiting rows (1.3-8.6 ms with 3,000 rows, and growing with the
-- results kept), and prepared statements keep their plan.
dep_counts AS (
    SELECT e.v ->> 0 AS queue, e.v ->> 1 AS id, count(*) AS n
    FROM ended AS d CROSS JOIN LATERAL jsonb_array_elements(d.dependents) AS e(v)
    GROUP BY 1, 2
    ORDER BY 1, 2
),
dep_locked AS (
    SELECT w.queue, w.id, c.n, w.waiting_for, w.next_process_at, w.priority, w.seq,
           w.limits, w.held_by
    FROM dep_counts AS c
    CROSS JOIN LATERAL (
        SELECT t.queue, t.id, t.waiting_for, t.next_process_at, t.priority, t.seq,
               t.limits, t.held_by
        FROM {schema}.tasks AS t
        WHERE t.queue = c.queue AND t.id = c.id AND t.state = 'waiting'
        LIMIT 1
        FOR UPDATE
    ) AS w
)

-- name: count_down
-- A fragment, not run alone: the CTEs spliced into the statements that finish tasks (CTE
-- "ended", with their dependents), after release_limits. Each waiting task listed counts
-- its dependencies that finished (count_down_lock); at zero it is released: pending, or
-- scheduled while its due time is ahead (durq.states.released, in SQL). "dep_released"
-- holds the tasks counted down. The rows are named by key arrays as well as joined: with
-- dep_locked estimated at 100 rows (jsonb_array_elements), a plan made on a small table
-- joined by reading the whole table, and kept that plan as the table grew; an index
-- condition on the arrays is the cheaper plan at any size. Through the row's key, not the
-- ctid dep_locked could give: a row that lock waited for is a version this statement's
-- snapshot cannot see, which the update then re-reads by its key.
{count_down_lock},
dep_released AS (
    UPDATE {schema}.tasks AS w
    SET waiting_for = greatest(w.waiting_for - l.n, 0),
        state = CASE WHEN w.waiting_for - l.n > 0 THEN 'waiting'
                     WHEN w.next_process_at > {now} THEN 'scheduled'
                     ELSE 'pending' END
    FROM dep_locked AS l
    WHERE w.queue = ANY(ARRAY(SELECT b.queue FROM dep_locked AS b))
      AND w.id = ANY(ARRAY(SELECT b.id FROM dep_locked AS b))
      AND w.queue = l.queue AND w.id = l.id AND w.state = 'waiting'
    RETURNING w.queue, w.state
)

-- name: complete_work
-- A fragment (complete, complete_claim): finish many leases (task_queues, ids, tokens):
-- keep the row with its result while retention > 0, else delete it; count each as
-- processed. Fenced by state and lease token. "ended" holds the leases finished, "released"
-- the limit keys they gave a running slot back to; their dependents are counted down by the
-- statement (count_down, or complete_claim's own).
x AS (
    SELECT *
    FROM unnest(%(task_queues)b::text[], %(ids)b::text[], %(tokens)b::text[],
                %(results)b::bytea[], %(retentions)b::float8[])
         AS x(queue, id, token, result, retention)
),
kept AS (
    UPDATE {schema}.tasks AS t
    SET state = 'completed', completed_at = {now}, result = x.result,
        retention = x.retention, expires_at = {now} + x.retention,
        lease_token = NULL, lease_expires_at = NULL, kept = false,
        cancel_requested = false, unique_key = NULL, unique_until = NULL
    FROM x
    WHERE t.queue = x.queue AND t.id = x.id AND x.retention > 0
      AND t.state = 'active' AND t.lease_token = x.token
    RETURNING t.queue, t.id, t.limits, t.watched, t.dependents
),
gone AS (
    DELETE FROM {schema}.tasks AS t
    USING x
    WHERE t.queue = x.queue AND t.id = x.id AND x.retention <= 0
      AND t.state = 'active' AND t.lease_token = x.token
    RETURNING t.queue, t.id, t.limits, t.watched, t.dependents
),
ended AS (
    SELECT queue, id, limits, watched, dependents FROM kept
    UNION ALL SELECT queue, id, limits, watched, dependents FROM gone
),
{release_limits},
counted AS (
    INSERT INTO {schema}.stats AS s (queue, day, processed, failed)
    SELECT queue, %(day)s, count(*), 0 FROM ended GROUP BY queue
    ON CONFLICT (queue, day) DO UPDATE SET processed = s.processed + excluded.processed
),
counted_minute AS (
    INSERT INTO {schema}.stats_minute AS s (queue, minute, processed, failed)
    SELECT queue, (floor({now} / 60) * 60)::bigint, count(*), 0 FROM ended GROUP BY queue
    ON CONFLICT (queue, minute) DO UPDATE SET processed = s.processed + excluded.processed
);

-- name: complete
-- Finish many leases in one statement (complete_work); "watched": someone waits for the
-- task's end (App.wait), the broker announces it.
WITH {complete_work},
{count_down}
SELECT d.queue, d.id, d.watched,
       EXISTS (SELECT 1 FROM released AS r WHERE r.queue = d.queue AND r.waiting) AS wake,
       ARRAY(SELECT DISTINCT r.queue FROM dep_released AS r WHERE r.state = 'pending')
           AS released
FROM ended AS d;

-- name: complete_claim
-- The busy worker's round trip in one statement: finish its acknowledged leases
-- (complete_work) and claim (claim_due, claim_lease). The two touch different rows (active, pending)
-- and share one snapshot: a limit key freed here is seen by the next claim (the answer's
-- wake_queues make it come at once). The claim's columns come first, then the completed
-- leases (done_queues, done_ids), the queues of the freed keys that hold tasks (wake_queues)
-- and whether due scheduled/retry rows wait (forward_first), then the ids of the
-- completed tasks someone waits for (watched); after due rows, the broker runs
-- claim_forward and `claim` in one round trip. Forwarding is not part of this
-- statement: its plan would then depend on the queues' count, and the server would plan the
-- whole statement again on every claim instead of keeping one plan.
-- Waiting tasks these completions release (count_down_lock) are claimed here too: the
-- snapshot's claim cannot see them, and they were otherwise leased by one more claim after
-- this statement (a workflow's dependent: 5-28 ms more on a loaded machine). Those due now,
-- without limits, not held, in these queues (none paused) rank with the due rows in claim
-- order ("ranked", the limit's first): due rows among them are "taken" (claim_lease), the
-- released ones "dep_take". A row is written once per statement, so dep_released itself
-- leases those (lease_set's columns).
WITH {complete_work},
{claim_due},
{count_down_lock},
ranked AS (
    SELECT c.ctid, c.queue, c.id
    FROM (
        SELECT d.ctid, d.queue, d.id, q.ord, d.priority, d.next_process_at, d.seq
        FROM due AS d
        JOIN unnest(%(queues)b::text[]) WITH ORDINALITY AS q(name, ord) ON q.name = d.queue
        WHERE d.limits IS NULL
        UNION ALL
        SELECT NULL::tid, l.queue, l.id, q.ord, l.priority, l.next_process_at, l.seq
        FROM dep_locked AS l
        JOIN unnest(%(queues)b::text[]) WITH ORDINALITY AS q(name, ord) ON q.name = l.queue
        WHERE l.waiting_for - l.n <= 0 AND l.next_process_at <= {now}
          AND l.limits IS NULL AND l.held_by IS NULL
          AND NOT (SELECT f.due FROM forward_first AS f)
          AND NOT EXISTS (SELECT 1 FROM {schema}.queues AS p WHERE p.name = l.queue AND p.paused)
    ) AS c
    ORDER BY c.ord, c.priority DESC, c.next_process_at, c.seq
    LIMIT %(limit)s
),
taken AS (
    SELECT r.ctid FROM ranked AS r WHERE r.ctid IS NOT NULL
),
dep_take AS (
    SELECT r.queue, r.id FROM ranked AS r WHERE r.ctid IS NULL
),
dep_released AS (
    UPDATE {schema}.tasks AS t
    SET waiting_for = greatest(t.waiting_for - l.n, 0),
        state = CASE WHEN k.id IS NOT NULL THEN 'active'
                     WHEN t.waiting_for - l.n > 0 THEN 'waiting'
                     WHEN t.next_process_at > {now} THEN 'scheduled'
                     ELSE 'pending' END,
        lease_token = CASE WHEN k.id IS NOT NULL THEN gen_random_uuid()::text
                           ELSE t.lease_token END,
        lease_expires_at = CASE WHEN k.id IS NOT NULL THEN {now} + %(lease_seconds)s
                                ELSE t.lease_expires_at END,
        worker_id = CASE WHEN k.id IS NOT NULL THEN %(worker_id)s ELSE t.worker_id END,
        started_at = CASE WHEN k.id IS NOT NULL THEN {now} ELSE t.started_at END,
        cancel_requested = k.id IS NULL AND t.cancel_requested
    FROM dep_locked AS l
    LEFT JOIN dep_take AS k ON k.queue = l.queue AND k.id = l.id
    WHERE t.queue = ANY(ARRAY(SELECT b.queue FROM dep_locked AS b))
      AND t.id = ANY(ARRAY(SELECT b.id FROM dep_locked AS b))
      AND t.queue = l.queue AND t.id = l.id AND t.state = 'waiting'
    RETURNING t.state AS released_state, {claimed_columns}
),
{claim_lease},
done AS (
    SELECT array_agg(d.queue) AS queues, array_agg(d.id) AS ids,
           array_agg(DISTINCT d.queue) FILTER (
               WHERE EXISTS (SELECT 1 FROM released AS r WHERE r.queue = d.queue AND r.waiting)
           ) || ARRAY(SELECT DISTINCT r.queue FROM dep_released AS r
                      WHERE r.released_state = 'pending')
           AS wake,
           array_agg(d.id) FILTER (WHERE d.watched) AS watched
    FROM ended AS d
),
claimed AS (
    SELECT * FROM leased
    UNION ALL
    -- claimed_columns' names, in its order (rows.CLAIM_COLUMNS)
    SELECT r.id, r.queue, r.type, r.payload, r.max_retry, r.retried, r.last_error, r.timeout,
           r.deadline, r.next_process_at, r.enqueued_at, r.retention, r.lost, r.headers,
           r.lease_token, r.seq, r.started_at, r.lease_expires_at, r.priority, r.limits,
           r.steps
    FROM dep_released AS r
    WHERE r.released_state = 'active'
)
SELECT claimed.*, more.limited, more.held, done.queues, done.ids, done.wake,
       (SELECT f.due FROM forward_first AS f) AS due, done.watched, more.moved
FROM more CROSS JOIN done LEFT JOIN claimed ON true;

-- name: claim
-- complete_claim without completions (an idle worker's claim, the one that picks up a new
-- task): claim_due and claim_lease alone, the same answer with no completed leases. It leaves out the
-- complete CTEs: 0.27-0.34 ms and 187-208 us of client CPU per claim of an empty queue,
-- against 0.48-0.57 ms and 304-336 us (with complete_claim's text then parsed again by
-- psycopg on every call; the claims now run as raw statements, storage.RAW).
WITH {claim_due},
taken AS (
    SELECT due.ctid FROM due WHERE due.limits IS NULL
),
{claim_lease}
SELECT leased.*, more.limited, more.held, NULL::text[] AS queues, NULL::text[] AS ids,
       NULL::text[] AS wake, (SELECT f.due FROM forward_first AS f) AS due,
       NULL::text[] AS watched, more.moved
FROM more LEFT JOIN leased ON true;

-- name: retry
-- %(snooze)s (durq.Snooze): scheduled instead, no attempt counted, the error kept, not
-- counted as failed in the stats. %(awaits)s (a snooze that waits for that signal) is stored
-- (NULL: waits for none) and the task is waiting; when that signal is stored already the
-- wait is over: pending now.
-- A signal delivered meanwhile locks the row first, and this update then reads the row as
-- that signal left it (or the signal finds the task waiting): no wake-up is lost. "wake":
-- the queue's workers should claim (a freed key with held tasks, or the task pending now).
-- %(keep)s (W25): the task keeps its sequences' keys: only its other limits are released.
WITH ended AS (
    UPDATE {schema}.tasks AS t
    SET state = CASE WHEN %(snooze)s AND coalesce(t.signals ? %(awaits)s::text, false)
                     THEN 'pending'
                     WHEN %(awaits)s::text IS NOT NULL THEN 'waiting'
                     WHEN %(snooze)s THEN 'scheduled' ELSE 'retry' END,
        retried = t.retried + CASE WHEN %(snooze)s THEN 0 ELSE 1 END,
        snoozes = t.snoozes + CASE WHEN %(snooze)s THEN 1 ELSE 0 END,
        lost = t.lost + %(lost)s,
        last_error = CASE WHEN %(snooze)s THEN t.last_error ELSE %(error)s END,
        traceback = CASE WHEN %(snooze)s THEN t.traceback ELSE %(traceback)s END,
        next_process_at = CASE WHEN %(snooze)s AND coalesce(t.signals ? %(awaits)s::text, false)
                               THEN {now} ELSE {now} + %(delay)s END,
        awaits = %(awaits)s::text, kept = %(keep)s,
        lease_token = NULL, lease_expires_at = NULL, cancel_requested = false
    WHERE t.queue = %(queue)s AND t.id = %(id)s
      AND t.state = 'active' AND t.lease_token = %(token)s
      AND (%(expired_by)s::float8 IS NULL
           OR t.lease_expires_at <= least(%(expired_by)s::float8, {now}))
    RETURNING t.queue, {given_back} AS limits, t.state
),
{release_limits},
counted AS (
    INSERT INTO {schema}.stats AS s (queue, day, processed, failed)
    SELECT queue, %(day)s, 1, 1 FROM ended WHERE NOT %(snooze)s
    ON CONFLICT (queue, day) DO UPDATE
    SET processed = s.processed + 1, failed = s.failed + 1
),
counted_minute AS (
    INSERT INTO {schema}.stats_minute AS s (queue, minute, processed, failed)
    SELECT queue, (floor({now} / 60) * 60)::bigint, 1, 1 FROM ended WHERE NOT %(snooze)s
    ON CONFLICT (queue, minute) DO UPDATE
    SET processed = s.processed + 1, failed = s.failed + 1
)
SELECT count(*) AS n,
       EXISTS (SELECT 1 FROM released WHERE waiting)
           OR coalesce(bool_or(state = 'pending'), false) AS wake
FROM ended;

-- name: move_leases_lock
-- Before a batch of retry/archive moves in one transaction: the counters of all their tasks'
-- limit keys, locked in key order (each move then finds its own already locked).
SELECT l.key
FROM {schema}.limits AS l
WHERE (l.queue, l.key) IN (
    SELECT t.queue, e.v ->> 0
    FROM {schema}.tasks AS t
    JOIN unnest(%(queues)b::text[], %(ids)b::text[]) AS x(queue, id)
      ON t.queue = x.queue AND t.id = x.id
    CROSS JOIN LATERAL jsonb_array_elements(t.limits) AS e(v)
)
ORDER BY l.queue, l.key
FOR UPDATE OF l;

-- name: archive
-- Give up: the unique key is released (E4 holds only until the task completes or archives).
WITH ended AS (
    UPDATE {schema}.tasks AS t
    SET state = 'archived',
        retried = t.retried + CASE WHEN %(count_attempt)s THEN 1 ELSE 0 END,
        lost = t.lost + %(lost)s,
        last_error = %(error)s,
        traceback = %(traceback)s,
        lease_token = NULL, lease_expires_at = NULL, cancel_requested = false,
        unique_key = NULL, unique_until = NULL, expires_at = {now}, kept = false
    WHERE t.queue = %(queue)s AND t.id = %(id)s
      AND t.state = 'active' AND t.lease_token = %(token)s
      AND (%(expired_by)s::float8 IS NULL
           OR t.lease_expires_at <= least(%(expired_by)s::float8, {now}))
    RETURNING t.queue, t.limits, t.dependents
),
{release_limits},
{count_down},
counted AS (
    INSERT INTO {schema}.stats AS s (queue, day, processed, failed)
    SELECT queue, %(day)s, 1, 1 FROM ended WHERE %(count_attempt)s
    ON CONFLICT (queue, day) DO UPDATE
    SET processed = s.processed + 1, failed = s.failed + 1
),
counted_minute AS (
    INSERT INTO {schema}.stats_minute AS s (queue, minute, processed, failed)
    SELECT queue, (floor({now} / 60) * 60)::bigint, 1, 1 FROM ended WHERE %(count_attempt)s
    ON CONFLICT (queue, minute) DO UPDATE
    SET processed = s.processed + 1, failed = s.failed + 1
)
SELECT count(*) AS n, EXISTS (SELECT 1 FROM released WHERE waiting) AS wake,
       ARRAY(SELECT DISTINCT r.queue FROM dep_released AS r WHERE r.state = 'pending')
           AS released
FROM ended;

-- name: read_steps
-- A running task's recorded steps (durq.steps), when a snooze is counted.
SELECT t.steps FROM {schema}.tasks AS t
WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = 'active' AND t.lease_token = %(token)s;

-- name: read_signals
-- A running attempt's signals (ctx.wait_for): one JSON object, name -> payload.
SELECT t.signals::text AS signals FROM {schema}.tasks AS t
WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = 'active' AND t.lease_token = %(token)s;

-- name: signal
-- Deliver one signal (app.signal), once, in one statement. "task" locks the row and reads it
-- as the last writer left it (a concurrent signal or move is waited for), so two signals to
-- one task both land and a name is stored only once; the update then adds the name to that
-- version (|| keeps the others). A task waiting for this very name (awaits, set by its last
-- retry) is due now. No row: no such task (a completed one past its
-- retention counts as gone, as in get_task). The answer: the state and whether the name was
-- stored before the write, and whether this write woke the task.
WITH task AS (
    SELECT t.queue, t.id, t.state, t.expires_at,
           coalesce(t.signals ? %(name)s::text, false) AS known,
           t.state = 'waiting' AND t.awaits IS NOT DISTINCT FROM %(name)s::text AS waits
    FROM {schema}.tasks AS t
    WHERE t.queue = %(queue)s AND t.id = %(id)s
    FOR UPDATE
),
stored AS (
    UPDATE {schema}.tasks AS t
    SET signals = coalesce(t.signals, '{{}}'::jsonb)
                  || jsonb_build_object(%(name)s::text, %(payload)s::jsonb),
        state = CASE WHEN task.waits THEN 'pending' ELSE t.state END,
        next_process_at = CASE WHEN task.waits THEN {now} ELSE t.next_process_at END
    FROM task
    WHERE t.queue = task.queue AND t.id = task.id
      AND task.state NOT IN ('completed', 'archived') AND NOT task.known
    RETURNING task.waits AS woken
)
SELECT task.state, task.known, coalesce(stored.woken, false) AS woken
FROM task LEFT JOIN stored ON true
WHERE NOT (task.state = 'completed' AND task.expires_at <= {now});

-- name: free_unique
-- A twin in a state its durq.Unique does not block in lets its key go.
UPDATE {schema}.tasks SET unique_key = NULL, unique_until = NULL
WHERE queue = %(queue)s AND id = %(id)s AND unique_key = %(key)s
  AND state = ANY(%(states)s::text[]);

-- name: replace_twin
-- Unique(on_conflict="replace") and durq.Debounce: a waiting twin takes the new payload; a
-- scheduled one also a new due time (%(delay)s from now, no later than %(within)s after
-- its enqueue) and priority.
UPDATE {schema}.tasks
SET payload = %(payload)s,
    next_process_at = CASE WHEN state = 'scheduled' AND %(delay)s::float8 IS NOT NULL
                           THEN least({now} + %(delay)s::float8,
                                      coalesce(enqueued_at + %(within)s::float8,
                                               {now} + %(delay)s::float8))
                           ELSE next_process_at END,
    priority = CASE WHEN state = 'scheduled' THEN coalesce(%(priority)s::int, priority)
                    ELSE priority END
WHERE queue = %(queue)s AND id = %(id)s AND unique_key = %(key)s
  AND state IN ('pending', 'scheduled', 'retry')
RETURNING *;

-- name: read_snoozes
SELECT t.snoozes FROM {schema}.tasks AS t
WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = 'active' AND t.lease_token = %(token)s;

-- name: record_steps
-- A running attempt recorded a step: the whole stored steps, fenced by its token.
UPDATE {schema}.tasks AS t SET steps = %(steps)s
WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = 'active' AND t.lease_token = %(token)s
RETURNING 1 AS held;

-- name: record_steps_many
-- Concurrent attempts recorded steps (record_steps for each lease of task_queues, ids,
-- tokens): one statement, each row fenced by its own token; the leases that held come back.
UPDATE {schema}.tasks AS t SET steps = x.steps
FROM unnest(%(task_queues)b::text[], %(ids)b::text[], %(tokens)b::text[], %(steps)b::text[])
     AS x(queue, id, token, steps)
WHERE t.queue = x.queue AND t.id = x.id AND t.state = 'active' AND t.lease_token = x.token
RETURNING t.queue, t.id, x.token;

-- name: report_progress
-- A running attempt's report (durq.progress), fenced by its token. :progress NULL keeps the
-- progress, '' clears it; :lines (stored lines joined by a newline, NULL for none) are
-- appended and only the last :keep lines kept (durq.progress.append_lines, in SQL).
UPDATE {schema}.tasks AS t
SET progress = CASE WHEN %(progress)s::text IS NULL THEN t.progress
                    ELSE nullif(%(progress)s::text, '') END,
    logs = CASE WHEN %(lines)s::text IS NULL THEN t.logs ELSE (
        SELECT array_to_string(s.a[greatest(1, cardinality(s.a) - %(keep)s + 1):], E'\n')
        FROM (SELECT string_to_array(concat_ws(E'\n', t.logs, %(lines)s::text), E'\n') AS a) AS s
    ) END
WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = 'active' AND t.lease_token = %(token)s
RETURNING 1 AS held;

-- name: requeue
-- Graceful shutdown hands the task back (W7): due now, no attempt counted; wake workers.
-- %(keep)s (W25): it keeps its sequences' keys, as in retry.
WITH ended AS (
    UPDATE {schema}.tasks AS t
    SET state = 'pending', next_process_at = {now}, kept = %(keep)s,
        lease_token = NULL, lease_expires_at = NULL, cancel_requested = false
    WHERE t.queue = %(queue)s AND t.id = %(id)s
      AND t.state = 'active' AND t.lease_token = %(token)s
    RETURNING t.queue, {given_back} AS limits
),
{release_limits}
SELECT count(pg_notify(%(channel)s, queue)) AS n FROM ended;

-- name: promote_due
-- Flip due scheduled/retry rows to pending (for the inspector's view: claim takes those
-- itself) and waits for a signal whose time ran out (only this ends those: the handler then
-- raises the timeout; tasks waiting for other tasks have no awaits), in bounded batches,
-- skipping rows a claim holds right now.
WITH due_times AS (
    SELECT ctid
    FROM {schema}.tasks
    WHERE state IN ('scheduled', 'retry') AND next_process_at <= {now}
    ORDER BY next_process_at  -- through tasks_due
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
due_waits AS (
    SELECT ctid
    FROM {schema}.tasks
    WHERE state = 'waiting' AND awaits IS NOT NULL AND next_process_at <= {now}
    ORDER BY next_process_at  -- through tasks_awaits
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
due AS (
    SELECT ctid FROM due_times UNION ALL SELECT ctid FROM due_waits
),
moved AS (
    -- Through the locked rows' ctid, as claim_lease does.
    UPDATE {schema}.tasks AS t
    SET state = 'pending'
    FROM due
    WHERE t.ctid = due.ctid
    RETURNING t.queue
),
woken AS (
    SELECT count(pg_notify(%(channel)s, q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM moved) AS q
)
SELECT count(*) AS n FROM moved, woken;

-- name: expired_leases
-- Active rows whose lease expired: their worker is gone (W1). The rescuer decides what
-- becomes of each and moves it with retry/archive, fenced by token and expiry.
SELECT *
FROM {schema}.tasks
WHERE state = 'active' AND lease_expires_at <= {now}
ORDER BY lease_expires_at
LIMIT %(limit)s;

-- name: prune_minute_stats
-- Janitor: per-minute counters past their keep.
DELETE FROM {schema}.stats_minute WHERE minute < {now} - %(keep)s;

-- name: minute_counts
-- One queue's counters per minute (queue NULL: summed over every queue) from since on.
SELECT minute, sum(processed)::bigint AS processed, sum(failed)::bigint AS failed
FROM {schema}.stats_minute
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text) AND minute >= %(since)s
GROUP BY minute
ORDER BY minute;

-- name: delete_expired
-- Janitor: a bounded batch of completed rows past retention, so no statement holds locks on
-- a large part of a big table; SKIP LOCKED keeps two janitors out of each other's way.
WITH victims AS (
    SELECT queue, id
    FROM {schema}.tasks
    WHERE state = 'completed' AND expires_at <= {now}
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.tasks AS t
USING victims AS v
WHERE t.queue = v.queue AND t.id = v.id;

-- name: delete_archived
-- Janitor: a bounded batch of archived tasks past their queue's archived retention, counted
-- from expires_at, which holds the moment an archived task was archived. queues/keeps: the
-- queues with their own retention in seconds (NULL: kept forever); other queues keep
-- %(default)s (NULL: forever). One lookup per queue (LATERAL) reads only that queue's
-- archived rows, through tasks_by_state.
WITH victims AS (
    SELECT t.queue, t.id
    FROM {schema}.queues AS q
    LEFT JOIN unnest(%(queues)s::text[], %(keeps)s::float8[]) AS k(queue, keep)
      ON k.queue = q.name
    CROSS JOIN LATERAL (
        SELECT x.queue, x.id
        FROM {schema}.tasks AS x
        WHERE x.queue = q.name AND x.state = 'archived'
          AND x.expires_at <= {now} - (CASE WHEN k.queue IS NULL THEN %(default)s::float8
                                            ELSE k.keep END)
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS t
    LIMIT %(limit)s
)
DELETE FROM {schema}.tasks AS t
USING victims AS v
WHERE t.queue = v.queue AND t.id = v.id;

-- ---------------------------------------------------------------- workers and queues

-- name: register_worker
-- Also forgets workers silent since forget_before (stopped without unregistering).
WITH forgotten AS (
    DELETE FROM {schema}.workers WHERE last_heartbeat < %(forget_before)s
),
w AS (
    INSERT INTO {schema}.workers AS w (
        id, host, pid, queues, concurrency, strict, started_at, last_heartbeat, active
    )
    VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(strict)s,
            %(started_at)s, %(now)s, %(active)s)
    ON CONFLICT (id) DO UPDATE
    SET host = excluded.host, pid = excluded.pid, queues = excluded.queues,
        concurrency = excluded.concurrency, strict = excluded.strict,
        last_heartbeat = excluded.last_heartbeat, active = excluded.active
)
INSERT INTO {schema}.queues (name)
SELECT unnest(%(queue_names)b::text[])
ON CONFLICT DO NOTHING;

-- name: unregister_worker
DELETE FROM {schema}.workers WHERE id = %(id)s;

-- name: list_workers
SELECT * FROM {schema}.workers WHERE last_heartbeat > %(since)s ORDER BY started_at, id;

-- name: set_paused
-- Unpausing wakes the queue's idle workers: its waiting tasks are claimable again.
WITH s AS (
    UPDATE {schema}.queues SET paused = %(paused)s WHERE name = %(queue)s RETURNING name
),
woken AS (
    SELECT count(pg_notify(%(channel)s, s.name)) AS n FROM s WHERE NOT %(paused)s
)
SELECT s.name FROM s, woken;

-- name: set_limit_override
-- W23: an operator's limit for one key of a known queue, winning over the tasks' own until
-- reset; a key no claim has counted gets its counter now (nothing running, the bucket
-- %(refilled_at)s). The row lock orders it with claims, which lock the counters they use;
-- the queue's idle workers are woken to apply it.
WITH q AS (
    SELECT name FROM {schema}.queues WHERE name = %(queue)s
),
o AS (
    INSERT INTO {schema}.limits AS l (queue, key, tokens, refilled_at, override_concurrency,
                                      override_rate, override_per)
    SELECT q.name, %(key)s, 0, %(refilled_at)s, %(concurrency)s, %(rate)s, %(per)s FROM q
    ON CONFLICT (queue, key) DO UPDATE
    SET override_concurrency = excluded.override_concurrency,
        override_rate = excluded.override_rate, override_per = excluded.override_per
    RETURNING l.queue
)
SELECT o.queue, pg_notify(%(channel)s, o.queue) FROM o;

-- name: reset_limit_override
-- W23: the tasks' own limit applies again; the queue's idle workers are woken (the next
-- claim lets held tasks back by it).
WITH r AS (
    UPDATE {schema}.limits
    SET override_concurrency = NULL, override_rate = NULL, override_per = NULL
    WHERE queue = %(queue)s AND key = %(key)s
      AND (override_concurrency IS NOT NULL OR override_rate IS NOT NULL)
    RETURNING queue
)
SELECT r.queue, pg_notify(%(channel)s, r.queue) FROM r;

-- name: queue_exists
SELECT 1 AS ok FROM {schema}.queues WHERE name = %(queue)s;

-- name: queue_stats
-- Every known queue (or one): sizes per state (completed rows past retention count as gone),
-- the oldest pending task's ready time, and the counters.
WITH sizes AS (
    SELECT queue, jsonb_object_agg(state, n) AS sizes
    FROM (
        SELECT queue, state, count(*) AS n
        FROM {schema}.tasks
        WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
          AND NOT (state = 'completed' AND expires_at <= {now})
        GROUP BY queue, state
    ) AS per_state
    GROUP BY queue
),
oldest AS (
    SELECT queue, min(next_process_at) AS ready
    FROM {schema}.tasks
    WHERE state = 'pending' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    GROUP BY queue
),
uniques AS (
    -- Unique keys held now (tasks_unique_key: only rows with a key).
    SELECT queue, count(*) AS n
    FROM {schema}.tasks
    WHERE unique_key IS NOT NULL AND (unique_until IS NULL OR unique_until > {now})
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    GROUP BY queue
),
counters AS (
    SELECT queue,
           coalesce(sum(processed) FILTER (WHERE day = %(day)s), 0) AS processed_today,
           coalesce(sum(failed) FILTER (WHERE day = %(day)s), 0) AS failed_today,
           sum(processed) AS processed_total,
           sum(failed) AS failed_total
    FROM {schema}.stats
    WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
    GROUP BY queue
)
SELECT q.name, q.paused, s.sizes, o.ready,
       coalesce(c.processed_today, 0) AS processed_today,
       coalesce(c.failed_today, 0) AS failed_today,
       coalesce(c.processed_total, 0) AS processed_total,
       coalesce(c.failed_total, 0) AS failed_total,
       coalesce(u.n, 0) AS unique_keys
FROM {schema}.queues AS q
LEFT JOIN sizes AS s ON s.queue = q.name
LEFT JOIN uniques AS u ON u.queue = q.name
LEFT JOIN oldest AS o ON o.queue = q.name
LEFT JOIN counters AS c ON c.queue = q.name
WHERE %(queue)s::text IS NULL OR q.name = %(queue)s
ORDER BY q.name;

-- ---------------------------------------------------------------- inspector: tasks

-- name: list_tasks
SELECT *
FROM {schema}.tasks
WHERE queue = %(queue)s AND state = %(state)s
  AND NOT (state = 'completed' AND expires_at <= {now})
ORDER BY next_process_at, seq
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_tasks
-- Tasks of one queue and state that pass a search (TaskFilter), as durq.brokers.search
-- defines it: type exact; error (ASCII-lowered by the caller) an ASCII case-insensitive
-- substring of last_error; payload a JSON array of [strict jsonpath, text, number bounds]:
-- the value at the path (strict: through objects only, silent: NULL otherwise) is a string
-- equal to the text, a boolean whose literal is the text, or a number within the bounds
-- ([low, high, inclusive]: the decimals that round to the text's double; null when the text
-- is no number).
-- payload_json is NULL for a payload that is not JSON. total_ counts every match; the page's
-- columns are NULL when the page is empty.
WITH hits AS (
    SELECT *
    FROM {schema}.tasks AS t
    WHERE queue = %(queue)s AND state = %(state)s
      AND NOT (state = 'completed' AND expires_at <= %(now)s)
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(error)s::text IS NULL
           OR strpos(translate(last_error, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ',
                                           'abcdefghijklmnopqrstuvwxyz'), %(error)s::text) > 0)
      AND NOT EXISTS (
          SELECT 1
          FROM jsonb_array_elements(%(payload)s::jsonb) AS c(pair),
               LATERAL (SELECT jsonb_path_query_first({schema}.payload_json(t.payload),
                                                      (c.pair ->> 0)::jsonpath, '{{}}', true)
                               AS v,
                               c.pair -> 2 AS bounds) AS f
          WHERE NOT coalesce(
              CASE jsonb_typeof(f.v)
                  WHEN 'string' THEN f.v #>> ARRAY[]::text[] = c.pair ->> 1
                  WHEN 'boolean' THEN f.v #>> ARRAY[]::text[] = c.pair ->> 1
                  WHEN 'number' THEN jsonb_typeof(f.bounds) = 'array' AND CASE
                      WHEN (f.bounds ->> 2)::boolean
                      THEN f.v::numeric BETWEEN (f.bounds ->> 0)::numeric
                                            AND (f.bounds ->> 1)::numeric
                      ELSE f.v::numeric > (f.bounds ->> 0)::numeric
                           AND f.v::numeric < (f.bounds ->> 1)::numeric
                      END
                  ELSE false
              END,
              false)
      )
)
SELECT (SELECT count(*) FROM hits) AS total_, page.*
FROM (SELECT 1) AS one
LEFT JOIN (
    SELECT * FROM hits ORDER BY next_process_at, seq LIMIT %(limit)s OFFSET %(offset)s
) AS page ON true
ORDER BY page.next_process_at, page.seq;

-- name: watch_task
-- App.wait is about to read the task: mark it watched, so that its completion announces its
-- end (complete's "watched"). Written once; a task that has ended, or is gone, is left as is.
UPDATE {schema}.tasks SET watched = true
WHERE queue = %(queue)s AND id = %(id)s AND NOT watched
  AND state NOT IN ('completed', 'archived');

-- name: get_task
SELECT *
FROM {schema}.tasks
WHERE queue = %(queue)s AND id = %(id)s
  AND NOT (state = 'completed' AND expires_at <= {now});

-- name: get_tasks
-- Several tasks of one queue by id, as get_task reads each.
SELECT *
FROM {schema}.tasks
WHERE queue = %(queue)s AND id = ANY(%(ids)s)
  AND NOT (state = 'completed' AND expires_at <= {now});

-- name: get_outcomes
-- get_tasks narrowed to what a workflow node reads of its dependencies (Admin.get_outcomes):
-- a hundred whole rows took 3-5 ms of the worker's CPU to decode, these columns 0.5 ms.
SELECT id, state, result, last_error, headers::text AS headers
FROM {schema}.tasks
WHERE queue = %(queue)s AND id = ANY(%(ids)s)
  AND NOT (state = 'completed' AND expires_at <= {now});

-- name: run_task
-- The inspector's moves are fenced by the state the move was decided on (expect).
-- An archived task released its dependents when it was archived: it starts with none.
WITH r AS (
    UPDATE {schema}.tasks AS t
    SET state = 'pending', next_process_at = {now}, lost = 0, cancel_requested = false,
        held_by = NULL,
        dependents = CASE WHEN t.state = 'archived' THEN NULL ELSE t.dependents END
    WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = %(expect)s
    RETURNING t.*
),
woken AS (
    SELECT count(pg_notify(%(channel)s, queue)) AS n FROM r
)
SELECT r.* FROM r, woken;

-- name: archive_task
-- W25: a task that kept its sequences' keys gives their slots back (kept_back): the row is
-- locked first ("o", as it was), then the counters in key order, as outcomes lock them;
-- "wake": tasks are held on one of those keys.
WITH o AS (
    SELECT t.queue, t.id, t.kept, t.limits FROM {schema}.tasks AS t
    WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = %(expect)s
    FOR UPDATE
),
moved AS (
    UPDATE {schema}.tasks AS t
    SET state = 'archived', last_error = coalesce(%(error)s, t.last_error),
        unique_key = NULL, unique_until = NULL, held_by = NULL, expires_at = {now},
        kept = false
    FROM o
    WHERE t.queue = o.queue AND t.id = o.id AND t.state = %(expect)s
    RETURNING t.*
),
ended AS (
    SELECT o.queue, {kept_back} AS limits FROM o
),
{release_limits}
SELECT moved.*, EXISTS (SELECT 1 FROM released WHERE released.waiting) AS wake FROM moved;

-- name: request_cancel
-- The worker sees the flag on its next heartbeat (extend_leases) and cancels the handler.
UPDATE {schema}.tasks AS t
SET cancel_requested = true
WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = 'active'
RETURNING t.*;

-- name: rewrite_task
-- durq encryption rotate: new payload and result bytes, fenced by the state and by the
-- bytes the new ones were made from (a task that moved or was rewritten meanwhile is left).
UPDATE {schema}.tasks
SET payload = %(new_payload)s, result = %(new_result)s
WHERE queue = %(queue)s AND id = %(id)s AND state = %(expect)s AND state <> 'active'
  AND payload = %(payload)s AND result IS NOT DISTINCT FROM %(result)s::bytea
  AND NOT (state = 'completed' AND expires_at <= {now});

-- name: delete_task
-- W25: a task that kept its sequences' keys gives their slots back, as in archive_task.
WITH o AS (
    DELETE FROM {schema}.tasks AS t
    WHERE t.queue = %(queue)s AND t.id = %(id)s AND t.state = %(expect)s
      AND NOT (t.state = 'completed' AND t.expires_at <= {now})
    RETURNING t.*
),
ended AS (
    SELECT o.queue, {kept_back} AS limits FROM o
),
{release_limits}
SELECT o.*, EXISTS (SELECT 1 FROM released WHERE released.waiting) AS wake FROM o;

-- name: run_all
WITH r AS (
    UPDATE {schema}.tasks AS t
    SET state = 'pending', next_process_at = {now}, lost = 0, cancel_requested = false,
        held_by = NULL,
        dependents = CASE WHEN t.state = 'archived' THEN NULL ELSE t.dependents END
    WHERE t.queue = %(queue)s AND t.state = %(state)s
    RETURNING t.queue
),
woken AS (
    SELECT count(pg_notify(%(channel)s, q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM r) AS q
)
SELECT count(*) AS n FROM r, woken;

-- name: delete_all
-- W25: the tasks that kept their sequences' keys give their slots back, as in archive_task.
WITH o AS (
    DELETE FROM {schema}.tasks AS t
    WHERE t.queue = %(queue)s AND t.state = %(state)s
      AND NOT (t.state = 'completed' AND t.expires_at <= {now})
    RETURNING t.queue, t.kept, t.limits
),
ended AS (
    SELECT o.queue, {kept_back} AS limits FROM o WHERE o.kept
),
{release_limits}
SELECT count(*) AS n, EXISTS (SELECT 1 FROM released WHERE released.waiting) AS wake FROM o;

-- name: insert_group
INSERT INTO {schema}.groups (queue, id, total, created_at, retention, then_task, then_head,
                             then_tail, then_waiting)
VALUES (%(queue)s, %(id)s, %(total)s, {now}, %(retention)s, %(then_task)s, %(then_head)s,
        %(then_tail)s, %(then_waiting)s);

-- name: insert_group_members
-- The arrays arrive in binary (%(x)b), as in enqueue: text dumping costs several times more.
INSERT INTO {schema}.group_members (group_queue, group_id, position, queue, task_id, type,
                                    entry)
SELECT %(group_queue)s, %(group_id)s, m.position - 1, m.queue, m.task_id, m.type, m.entry
FROM unnest(%(queues)b::text[], %(ids)b::text[], %(types)b::text[], %(entries)b::bytea[])
     WITH ORDINALITY AS m (queue, task_id, type, entry, position);

-- name: finish_member
-- A member's first final outcome; a second one (a rerun archived member) matches no row.
UPDATE {schema}.group_members SET state = %(state)s, entry = %(entry)s
WHERE group_queue = %(group_queue)s AND group_id = %(group_id)s
  AND queue = %(queue)s AND task_id = %(id)s AND state IS NULL
RETURNING group_queue, group_id;

-- name: forget_member
-- An unfinished member deleted by the inspector keeps its stored "deleted" entry.
UPDATE {schema}.group_members SET state = 'deleted'
WHERE queue = %(queue)s AND task_id = %(id)s AND state IS NULL
RETURNING group_queue, group_id;

-- name: forget_members_in_state
-- Before deleting every task of one state: its unfinished members finish as deleted.
-- Each unfinished member of the queue looks its task up by primary key (a subplan, never a
-- join): right after a big group was enqueued the tables have no statistics yet, and a join
-- of the member rows with the state's tasks was planned as a nested loop over both
-- (10,000 members x 10,000 tasks: 45 s).
UPDATE {schema}.group_members AS m SET state = 'deleted'
WHERE m.queue = %(queue)s AND m.state IS NULL
  AND (SELECT t.state FROM {schema}.tasks AS t
       WHERE t.queue = m.queue AND t.id = m.task_id) = %(state)s
RETURNING m.group_queue, m.group_id;

-- name: count_finished
-- The fan-in check: the row lock makes concurrent completions of one group wait for each
-- other, and each sees the count the previous one committed.
UPDATE {schema}.groups
SET finished = finished + %(n)s,
    finished_at = CASE WHEN finished + %(n)s >= total THEN {now} END
WHERE queue = %(group_queue)s AND id = %(group_id)s
RETURNING finished, total, then_task, then_head, then_tail, then_waiting;

-- name: release_follow_up
-- A group's last member counted: its waiting follow-up gets its payload and is released,
-- pending or scheduled while its due time is ahead (durq.states.released, in SQL);
-- cancelled or deleted meanwhile, it matches no row.
UPDATE {schema}.tasks
SET payload = %(payload)s, waiting_for = 0,
    state = CASE WHEN next_process_at > {now} THEN 'scheduled' ELSE 'pending' END
WHERE queue = %(queue)s AND id = %(id)s AND state = 'waiting'
RETURNING *;

-- name: group_entries
SELECT entry FROM {schema}.group_members
WHERE group_queue = %(group_queue)s AND group_id = %(group_id)s
ORDER BY position;

-- name: get_group
SELECT * FROM {schema}.groups
WHERE queue = %(queue)s AND id = %(id)s
  AND NOT (finished_at IS NOT NULL AND finished_at + retention <= {now});

-- name: group_members
SELECT m.task_id, m.queue, m.type, m.state, t.state AS task_state
FROM {schema}.group_members AS m
LEFT JOIN {schema}.tasks AS t
  ON t.queue = m.queue AND t.id = m.task_id
  AND NOT (t.state = 'completed' AND t.expires_at <= {now})
WHERE m.group_queue = %(queue)s AND m.group_id = %(id)s
ORDER BY m.position;

-- name: delete_expired_groups
-- Janitor: finished groups past their retention (their members go by the foreign key).
WITH victims AS (
    SELECT queue, id FROM {schema}.groups
    WHERE finished_at IS NOT NULL AND finished_at + retention <= {now}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.groups AS g USING victims AS v
WHERE g.queue = v.queue AND g.id = v.id;
-- name: list_limits
-- W13: every counted key of one queue (NULL: all), with the tasks held on it.
SELECT l.*,
       (SELECT count(*) FROM {schema}.tasks AS t
        WHERE t.queue = l.queue AND t.held_by = l.key) AS held_count
FROM {schema}.limits AS l
WHERE %(queue)s::text IS NULL OR l.queue = %(queue)s::text
ORDER BY l.queue, l.key;

-- name: fair_partitions
-- W22: per partition of the queue's fair limits (template, key), tasks waiting (pending,
-- held ones too) and running: the %(top)s with the most tasks, then each template's totals
-- (key NULL). One pass over the queue's pending and active rows (tasks_by_state).
WITH parts AS (
    SELECT fair_template AS template, fair_key AS key,
           count(*) FILTER (WHERE state = 'pending') AS pending,
           count(*) FILTER (WHERE state = 'active') AS running
    FROM {schema}.tasks
    WHERE queue = %(queue)s AND state IN ('pending', 'active') AND fair_template IS NOT NULL
    GROUP BY fair_template, fair_key
)
(SELECT template, key, pending, running, 1::bigint AS partitions FROM parts
 ORDER BY pending + running DESC, template COLLATE "C", key COLLATE "C" LIMIT %(top)s)
UNION ALL
SELECT template, NULL, sum(pending)::bigint, sum(running)::bigint, count(*) FROM parts
GROUP BY template;

-- name: list_unique
-- Unique keys (E4) the queue's tasks hold now, soonest due first, and how many in all (the
-- count reads only the key index's rows; a window count would read every row whole).
SELECT t.*, (SELECT count(*) FROM {schema}.tasks
             WHERE unique_key IS NOT NULL AND queue = %(queue)s
               AND (unique_until IS NULL OR unique_until > {now})) AS held
FROM {schema}.tasks AS t
WHERE t.unique_key IS NOT NULL AND t.queue = %(queue)s
  AND (t.unique_until IS NULL OR t.unique_until > {now})
ORDER BY t.next_process_at, t.id COLLATE "C"
LIMIT %(limit)s;

-- name: list_schedules
SELECT * FROM {schema}.schedules ORDER BY name;

-- name: get_schedule
SELECT * FROM {schema}.schedules WHERE name = %(name)s;

-- name: create_schedule
-- A new stored schedule, version 1; nothing when one of that name exists.
INSERT INTO {schema}.schedules
    (name, spec, type, payload, queue, tz, overlap, paused, updated_at, version)
VALUES (%(name)s, %(spec)s, %(type)s, %(payload)s, %(queue)s, %(tz)s, %(overlap)s,
        %(paused)s, {now}, 1)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: update_schedule
-- Fenced by the version the caller read: a concurrent edit makes this change nothing.
UPDATE {schema}.schedules
SET spec = %(spec)s, type = %(type)s, payload = %(payload)s, queue = %(queue)s,
    tz = %(tz)s, overlap = %(overlap)s, paused = %(paused)s, updated_at = {now},
    version = version + 1
WHERE name = %(name)s AND version = %(version)s
RETURNING *;

-- name: delete_schedule
DELETE FROM {schema}.schedules WHERE name = %(name)s;

-- name: hold_dependents
-- enqueue after=: each dependency that has not finished lists the new task (dependent,
-- jsonb [[queue, id]]), locked in key order; a dependency finishing meanwhile is waited
-- for and then left out (it counts as done). The rows returned: the dependencies held.
WITH d AS (
    SELECT t.queue, t.id
    FROM {schema}.tasks AS t
    JOIN unnest(%(queues)s::text[], %(ids)s::text[]) AS x(queue, id)
      ON t.queue = x.queue AND t.id = x.id
    WHERE t.state NOT IN ('completed', 'archived')
    ORDER BY t.queue, t.id
    FOR UPDATE OF t
)
UPDATE {schema}.tasks AS t
SET dependents = coalesce(t.dependents, '[]'::jsonb) || %(dependent)s::jsonb
FROM d
WHERE t.queue = d.queue AND t.id = d.id AND t.state NOT IN ('completed', 'archived')
RETURNING t.queue, t.id;

-- name: set_graph
-- enqueue_graph: tasks inserted in the same transaction, each at most once: a dependent
-- waits for n (> 0) of them, a dependency lists its dependents (jsonb [[queue, id], ...],
-- NULL: none), in one statement rather than one per edge.
UPDATE {schema}.tasks AS t
SET state = CASE WHEN x.n > 0 THEN 'waiting' ELSE t.state END,
    waiting_for = CASE WHEN x.n > 0 THEN x.n ELSE t.waiting_for END,
    dependents = coalesce(x.dependents::jsonb, t.dependents)
FROM unnest(%(queues)s::text[], %(ids)s::text[], %(ns)s::int[], %(lists)s::text[])
    AS x(queue, id, n, dependents)
WHERE t.queue = x.queue AND t.id = x.id;

-- name: set_waiting
-- The task just inserted in the same transaction waits for n dependencies.
UPDATE {schema}.tasks SET state = 'waiting', waiting_for = %(n)s
WHERE queue = %(queue)s AND id = %(id)s
RETURNING *;

-- name: release_dependents
-- The inspector archived, cancelled or deleted unfinished tasks (their dependents given
-- as a jsonb array of lists): count_down in the same transaction; the queues released to.
WITH ended AS (
    SELECT d.v AS dependents FROM jsonb_array_elements(%(lists)s::jsonb) AS d(v)
),
{count_down}
SELECT DISTINCT queue FROM dep_released WHERE state = 'pending';

-- name: dependents_in_state
-- delete_all of an unfinished state: the dependents of the tasks it deletes.
SELECT dependents FROM {schema}.tasks
WHERE queue = %(queue)s AND state = %(state)s AND dependents IS NOT NULL
FOR UPDATE;

-- ---------------------------------------------------------------- workflows

-- name: insert_workflow
-- In enqueue_graph's transaction, after its nodes: a record left by an older workflow of
-- this id (all of its tasks gone, or the nodes would have been refused) is replaced.
INSERT INTO {schema}.workflows (id, name, created_at, retention)
VALUES (%(id)s, %(name)s, round(({now})::numeric, 6)::double precision, %(retention)s)
ON CONFLICT (id) DO UPDATE
SET name = excluded.name, created_at = excluded.created_at, retention = excluded.retention;

-- name: forget_workflow_nodes
DELETE FROM {schema}.workflow_nodes WHERE workflow_id = %(id)s;

-- name: insert_workflow_nodes
INSERT INTO {schema}.workflow_nodes (workflow_id, position, name, queue, task_id, type,
                                     on_failure, after)
SELECT %(workflow_id)s, n.position - 1, n.name, n.queue, n.task_id, n.type, n.on_failure,
       n.after
FROM unnest(%(names)s::text[], %(queues)s::text[], %(task_ids)s::text[], %(types)s::text[],
            %(on_failures)s::text[], %(afters)s::text[])
     WITH ORDINALITY AS n (name, queue, task_id, type, on_failure, after, position);

-- name: get_workflow
SELECT id, name, created_at, retention FROM {schema}.workflows WHERE id = %(id)s;

-- name: list_workflows
-- Newest first; at/after_id is the cursor (the last record of the previous page).
SELECT id, name, created_at, retention FROM {schema}.workflows
WHERE (%(created_after)s::double precision IS NULL OR created_at >= %(created_after)s)
  AND (%(created_before)s::double precision IS NULL OR created_at < %(created_before)s)
  AND (%(at)s::double precision IS NULL
       OR (created_at, id) < (%(at)s::double precision, %(after_id)s::text))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: workflow_nodes
-- The nodes of the workflows %(ids)s, each with its task as it is now (none: gone, or
-- completed past its retention).
SELECT n.workflow_id, n.name, n.queue, n.task_id, n.type, n.on_failure, n.after,
       t.state, t.retried, t.last_error
FROM {schema}.workflow_nodes AS n
LEFT JOIN {schema}.tasks AS t
  ON t.queue = n.queue AND t.id = n.task_id
  AND NOT (t.state = 'completed' AND t.expires_at <= {now})
WHERE n.workflow_id = ANY(%(ids)s::text[])
ORDER BY n.workflow_id, n.position;

-- name: delete_expired_workflows
-- Janitor: a bounded batch of records past their retention none of whose nodes' tasks is
-- left (their nodes go by the foreign key).
WITH victims AS (
    SELECT w.id FROM {schema}.workflows AS w
    WHERE w.created_at + w.retention <= {now}
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.workflow_nodes AS n
          JOIN {schema}.tasks AS t ON t.queue = n.queue AND t.id = n.task_id
          WHERE n.workflow_id = w.id
      )
    ORDER BY w.created_at
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)
DELETE FROM {schema}.workflows AS w USING victims AS v WHERE w.id = v.id;
