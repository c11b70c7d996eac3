-- Every statement the SQLite broker runs, by name. Loaded once by queries.py.
-- Parameters are named (:name) and always bound; nothing is formatted into SQL.
-- Write statements run inside BEGIN IMMEDIATE, so one writer at a time across processes.

-- ---------------------------------------------------------------- schema

-- name: migrations_table
CREATE TABLE IF NOT EXISTS durq_schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at REAL    NOT NULL
);

-- name: has_migrations_table
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'durq_schema_migrations';

-- name: schema_version
SELECT coalesce(max(version), 0) FROM durq_schema_migrations;

-- name: applied_versions
SELECT version FROM durq_schema_migrations;

-- name: record_migration
INSERT INTO durq_schema_migrations (version, name, applied_at) VALUES (:version, :name, :now);

-- name: data_version
-- Changes whenever ANOTHER connection commits: the cross-process wake-up signal.
PRAGMA data_version;

-- name: wal_checkpoint
-- Copies the write-ahead log into the database file without blocking writers (checkpoint.py).
PRAGMA wal_checkpoint(PASSIVE);

-- name: synchronous_normal
PRAGMA synchronous = NORMAL;

-- ---------------------------------------------------------------- enqueue

-- name: database_list
-- Which file a caller's connection has open (E8 joins it only on the broker's own file).
PRAGMA database_list;

-- name: take_write_lock
-- Asks for the write lock and changes nothing (E8: before anything reads in the caller's
-- transaction, so SQLite still waits for the lock within the busy timeout).
DELETE FROM durq_tasks WHERE 0;

-- name: drop_expired_completed
-- E3: a completed task past its retention counts as gone; free its id before the check.
DELETE FROM durq_tasks
WHERE queue = :queue AND id = :id AND state = 'completed' AND expires_at <= :now;

-- name: release_stale_unique
-- E4: a key stops holding once its ttl passed or its task finished.
UPDATE durq_tasks SET unique_key = NULL, unique_until = NULL
WHERE unique_key = :unique_key
  AND (unique_until <= :now OR state IN ('completed', 'archived'));

-- name: find_unique
SELECT id FROM durq_tasks WHERE unique_key = :unique_key;

-- name: insert_task
-- Tried first: a free id and a free key cost this one statement. A conflict (a live holder,
-- or an expired one still in place) writes nothing and returns no row; the broker then
-- clears what only looks taken, or raises the live holder's conflict, and tries again.
-- W22: a task with a fair limit takes the next turn of its partition (durq_fair), never
-- before its template's round; the trigger durq_tasks_fair_turn records it once stored.
INSERT INTO durq_tasks (
    id, queue, type, payload, state, max_retry, timeout, deadline, next_process_at,
    enqueued_at, retention, headers, unique_key, unique_until, relative_due, priority, limits,
    waiting_for, fair_template, fair_turn
) VALUES (
    :id, :queue, :type, :payload, :state, :max_retry, :timeout, :deadline, :next_process_at,
    :now, :retention, :headers, :unique_key, :unique_until, :relative_due, :priority, :limits,
    :waiting_for, :fair_template,
    CASE WHEN :fair_template IS NOT NULL THEN 1 + (
        SELECT coalesce(max(f.turn), 0) FROM durq_fair AS f
        WHERE f.queue = :queue AND f.template = :fair_template AND f.key IN (:fair_key, '')
    ) END
)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: ensure_queue
INSERT INTO durq_queues (name, paused, created_at) VALUES (:queue, 0, :now)
ON CONFLICT (name) DO NOTHING;

-- ---------------------------------------------------------------- worker hot path

-- name: paused_queues
SELECT name FROM durq_queues WHERE paused = 1;

-- name: any_claimable
-- A read before taking the write lock: idle workers polling empty queues never contend
-- with writers (WAL readers do not block). Held tasks are not counted here: the claim
-- reads the counters of their keys (waiting_limits) and writes only if one has room.
-- Pending rows are probed through the claim index, which leaves held rows out: the planner
-- would take durq_tasks_state and step over every held row (0.5 ms per poll with 1,000).
SELECT EXISTS (
    SELECT 1 FROM durq_tasks INDEXED BY durq_tasks_claimable
    WHERE queue = :queue AND state = 'pending' AND held_by IS NULL
) OR EXISTS (
    SELECT 1 FROM durq_tasks
    WHERE queue = :queue AND state IN ('scheduled', 'retry') AND next_process_at <= :now
);

-- name: claim_candidates
-- Pending rows of one queue in claim order (partial index durq_tasks_claimable): higher
-- priority, then due time, then enqueue order, with their limits: the claim leases those without limits and checks the others' counters.
-- Runs inside BEGIN IMMEDIATE: no other connection can write between this read and the
-- lease, so no task is handed out twice (W10) and no counter is read stale (W13).
SELECT rowid, limits, fair_template, fair_turn, kept FROM durq_tasks
WHERE queue = :queue AND state = 'pending' AND held_by IS NULL
ORDER BY priority DESC, next_process_at, rowid
LIMIT :limit;

-- name: fair_candidates
-- W22: the claimable tasks of one fair template in the order its partitions take turns:
-- priority, then turn, then enqueue order (partial index durq_tasks_fair).
SELECT rowid, limits, fair_template, fair_turn, kept FROM durq_tasks INDEXED BY durq_tasks_fair
WHERE queue = :queue AND fair_template = :template AND state = 'pending' AND held_by IS NULL
ORDER BY priority DESC, fair_turn, rowid
LIMIT :limit;

-- name: fair_round
-- W22: a claim started a task of a fair template: the template's round is at least its turn.
INSERT INTO durq_fair (queue, template, key, turn) VALUES (:queue, :template, '', :turn)
ON CONFLICT (queue, template, key) DO UPDATE SET turn = max(turn, excluded.turn);

-- name: promote_queue
-- The claim's first step: due scheduled/retry rows of one queue become pending (a bounded
-- batch, by durq_tasks_state), keeping their due time, so the claim below sees them in order.
UPDATE durq_tasks SET state = 'pending'
WHERE rowid IN (
    SELECT rowid FROM durq_tasks
    WHERE queue = :queue AND state IN ('scheduled', 'retry') AND next_process_at <= :now
    LIMIT :bound
);

-- name: claim
-- Lease the chosen rows (a JSON array of rowids), each with a fresh random fencing token.
UPDATE durq_tasks
SET state = 'active',
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = :now + :lease_seconds,
    lease_boot = :boot,
    lease_mono = :mono + :lease_seconds,
    worker_id = :worker_id,
    started_at = :now,
    cancel_requested = 0
WHERE rowid IN (SELECT value FROM json_each(:rowids))
RETURNING rowid AS seq, *;

-- name: limit_counters
-- The counters of the keys a claim looks at (a JSON array of keys).
SELECT * FROM durq_limits
WHERE queue = :queue AND key IN (SELECT value FROM json_each(:keys));

-- name: save_limit_counter
INSERT INTO durq_limits (queue, key, running, concurrency, rate, per, tokens, refilled_at,
                         waiting, need)
VALUES (:queue, :key, :running, :concurrency, :rate, :per, :tokens, :refilled_at, :waiting,
        :need)
ON CONFLICT (queue, key) DO UPDATE
SET running = excluded.running, concurrency = excluded.concurrency, rate = excluded.rate,
    per = excluded.per, tokens = excluded.tokens, refilled_at = excluded.refilled_at,
    waiting = excluded.waiting, need = excluded.need;

-- name: hold_task
-- W13: a task whose key has no room leaves the claimable index until the key has room.
UPDATE durq_tasks SET held_by = :key WHERE rowid = :rowid;

-- name: waiting_limits
-- Keys of a queue that may have held tasks (partial index durq_limits_waiting).
SELECT * FROM durq_limits WHERE queue = :queue AND waiting = 1;

-- name: let_back
-- Held tasks of a key that has room again, oldest first, as many as there is room.
UPDATE durq_tasks SET held_by = NULL
WHERE rowid IN (
    SELECT rowid FROM durq_tasks
    WHERE queue = :queue AND held_by = :key
    ORDER BY priority DESC, next_process_at, rowid
    LIMIT :room
);

-- name: release_limits
-- An attempt ended: each key of the task (its stored limits) gets its cost back (W24: the
-- limit's sixth item, 1 when absent); returns whether tasks wait on any of them (the
-- queue's workers should look again).
UPDATE durq_limits
SET running = max(running - (
    SELECT coalesce(json_extract(value, '$[5]'), 1) FROM json_each(:limits)
    WHERE json_extract(value, '$[0]') = durq_limits.key), 0)
WHERE queue = :queue
  AND key IN (SELECT json_extract(value, '$[0]') FROM json_each(:limits))
RETURNING waiting;

-- name: extend_lease
-- The lease runs on the monotonic clock of this boot (lease_mono); lease_expires_at is the
-- same moment on the wall clock, for people to read.
UPDATE durq_tasks
SET lease_expires_at = :now + :lease_seconds, lease_boot = :boot,
    lease_mono = :mono + :lease_seconds
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token
RETURNING cancel_requested;

-- name: complete_keep
-- Fenced: only the holder of the token finishes the task.
UPDATE durq_tasks
SET state = 'completed', completed_at = :now, result = :result, retention = :retention,
    expires_at = :now + :retention, lease_token = NULL, lease_expires_at = NULL,
    unique_key = NULL, unique_until = NULL, cancel_requested = 0, kept = 0
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token
RETURNING limits, dependents;

-- name: complete_delete
DELETE FROM durq_tasks
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token
RETURNING limits, dependents;

-- name: retry
-- Fenced by the token; with :expired_by (the rescuer) also by the lease having expired (as
-- in expired_leases). The delay counts on this machine: relative_due.
-- :snooze 1 (durq.Snooze): scheduled instead, no attempt counted, the error kept.
-- :awaits (a snooze that waits for that signal): waiting, or pending now if the signal is
-- stored already. :keep 1: the task keeps its sequences' keys (W25).
UPDATE durq_tasks
SET state = CASE WHEN :awaits IS NOT NULL AND json_type(signals, '$."' || :awaits || '"')
                      IS NOT NULL THEN 'pending'
                 WHEN :awaits IS NOT NULL THEN 'waiting'
                 WHEN :snooze THEN 'scheduled' ELSE 'retry' END,
    retried = retried + 1 - :snooze, snoozes = snoozes + :snooze, lost = lost + :lost,
    last_error = CASE WHEN :snooze THEN last_error ELSE :error END,
    traceback = CASE WHEN :snooze THEN traceback ELSE :traceback END,
    next_process_at = CASE WHEN :awaits IS NOT NULL AND json_type(signals, '$."' || :awaits
                                || '"') IS NOT NULL THEN :now ELSE :next_process_at END,
    relative_due = 1, awaits = :awaits, kept = :keep,
    lease_token = NULL, lease_expires_at = NULL, cancel_requested = 0
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token
  AND (:expired_by IS NULL
       OR CASE WHEN lease_boot IS NULL THEN lease_expires_at <= :now
               ELSE lease_boot IS NOT :boot OR lease_mono <= :mono END)
RETURNING limits;

-- name: archive
UPDATE durq_tasks
SET state = 'archived', retried = retried + :count_attempt, lost = lost + :lost,
    last_error = :error, traceback = :traceback, lease_token = NULL, lease_expires_at = NULL, unique_key = NULL,
    expires_at = :now, kept = 0,
    unique_until = NULL, cancel_requested = 0
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token
  AND (:expired_by IS NULL
       OR CASE WHEN lease_boot IS NULL THEN lease_expires_at <= :now
               ELSE lease_boot IS NOT :boot OR lease_mono <= :mono END)
RETURNING limits, dependents;

-- name: held_logs
-- A running attempt's report (durq.progress): the task's log, if the lease is still held.
SELECT logs FROM durq_tasks
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token;

-- name: report_progress
-- :progress NULL keeps the progress, '' clears it; :logs is the whole new log (appended and
-- trimmed by durq.progress.append_lines in the same transaction as held_logs).
UPDATE durq_tasks
SET progress = CASE WHEN :progress IS NULL THEN progress ELSE nullif(:progress, '') END,
    logs = :logs
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token;

-- name: read_steps
-- A running task's recorded steps (durq.steps), when a snooze is counted.
SELECT steps FROM durq_tasks
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token;

-- name: read_signals
SELECT signals FROM durq_tasks
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token;

-- name: signal_task
-- One signal, once (app.signal): stored unless the task finished or has one of that name; a
-- task waiting for this very signal is due now. The row before the write
-- (state, whether the name was there) tells the caller what happened.
SELECT state, awaits, json_type(signals, '$."' || :name || '"') IS NOT NULL AS known
FROM durq_tasks
WHERE queue = :queue AND id = :id AND NOT (state = 'completed' AND expires_at <= :now);

-- name: store_signal
UPDATE durq_tasks
SET signals = json_set(coalesce(signals, '{}'), '$."' || :name || '"', json(:payload)),
    state = CASE WHEN :wake THEN 'pending' ELSE state END,
    next_process_at = CASE WHEN :wake THEN :now ELSE next_process_at END,
    relative_due = CASE WHEN :wake THEN 1 ELSE relative_due END
WHERE queue = :queue AND id = :id;

-- name: free_unique
-- A twin in a state its durq.Unique does not block in lets its key go (:states, a JSON array).
UPDATE durq_tasks SET unique_key = NULL, unique_until = NULL
WHERE queue = :queue AND id = :id AND unique_key = :key
  AND state IN (SELECT value FROM json_each(:states));

-- name: replace_twin
-- Unique(on_conflict="replace") and durq.Debounce: a waiting twin takes the new payload; a
-- scheduled one also a new due time (:delay from now, no later than :within after its
-- enqueue) and priority.
UPDATE durq_tasks
SET payload = :payload,
    next_process_at = CASE WHEN state = 'scheduled' AND :delay IS NOT NULL
                           THEN min(:now + :delay, coalesce(enqueued_at + :within, :now + :delay))
                           ELSE next_process_at END,
    relative_due = CASE WHEN state = 'scheduled' AND :delay IS NOT NULL THEN 1
                        ELSE relative_due END,
    priority = CASE WHEN state = 'scheduled' THEN coalesce(:priority, priority) ELSE priority END
WHERE queue = :queue AND id = :id AND unique_key = :key
  AND state IN ('pending', 'scheduled', 'retry')
RETURNING *;

-- name: read_snoozes
SELECT snoozes FROM durq_tasks
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token;

-- name: record_steps
-- A running attempt recorded a step: the whole stored steps, fenced by its token.
UPDATE durq_tasks SET steps = :steps
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token;

-- name: requeue
-- Graceful shutdown (W7): back to pending, due now, without counting an attempt; :keep 1:
-- it keeps its sequences' keys (W25).
UPDATE durq_tasks
SET state = 'pending', next_process_at = :now, lease_token = NULL, lease_expires_at = NULL,
    cancel_requested = 0, kept = :keep
WHERE queue = :queue AND id = :id AND state = 'active' AND lease_token = :token
RETURNING limits;

-- name: bump_stats
INSERT INTO durq_stats (queue, day, processed, failed) VALUES (:queue, :day, :processed, :failed)
ON CONFLICT (queue, day) DO UPDATE
SET processed = processed + excluded.processed, failed = failed + excluded.failed;

-- name: bump_minute_stats
INSERT INTO durq_stats_minute (queue, minute, processed, failed)
VALUES (:queue, :minute, :processed, :failed)
ON CONFLICT (queue, minute) DO UPDATE
SET processed = processed + excluded.processed, failed = failed + excluded.failed;

-- name: prune_minute_stats
-- Janitor: per-minute counters past their keep.
DELETE FROM durq_stats_minute WHERE minute < :before;

-- name: minute_counts
-- One queue's counters per minute (:queue NULL: summed over every queue) from :since on.
SELECT minute, sum(processed) AS processed, sum(failed) AS failed
FROM durq_stats_minute
WHERE (:queue IS NULL OR queue = :queue) AND minute >= :since
GROUP BY minute
ORDER BY minute;

-- name: promote_due
-- Due scheduled/retry rows (claim takes those itself) and waits for a signal whose time ran
-- out (only this ends those: the handler then raises the timeout; tasks waiting for other
-- tasks have no awaits) become pending.
UPDATE durq_tasks SET state = 'pending'
WHERE state IN ('scheduled', 'retry') AND next_process_at <= :now
   OR state = 'waiting' AND awaits IS NOT NULL AND next_process_at <= :now
RETURNING queue;

-- name: expired_leases
-- A lease of another boot expired with it (the machine restarted); one of this boot when the
-- monotonic clock passed it, whatever the wall clock says. Leases written before schema 3
-- have no boot: the wall clock decides.
SELECT * FROM durq_tasks
WHERE state = 'active'
  AND CASE WHEN lease_boot IS NULL THEN lease_expires_at <= :now
           ELSE lease_boot IS NOT :boot OR lease_mono <= :mono END
ORDER BY lease_expires_at
LIMIT :limit;

-- name: delete_expired
-- Janitor: a bounded batch, so a large backlog never holds the write lock for long.
DELETE FROM durq_tasks
WHERE rowid IN (
    SELECT rowid FROM durq_tasks
    WHERE state = 'completed' AND expires_at <= :now
    LIMIT :limit
);

-- name: delete_archived
-- Janitor: a bounded batch of archived tasks past their queue's archived retention, counted
-- from expires_at, which holds the moment an archived task was archived. :keep is a JSON
-- object of queue -> seconds (null: kept forever); other queues keep :default (NULL: forever).
DELETE FROM durq_tasks
WHERE rowid IN (
    -- Driven by the queues table (CROSS JOIN fixes the loop order), so each queue's
    -- archived rows are read through durq_tasks_state.
    SELECT t.rowid FROM durq_queues AS q
    CROSS JOIN durq_tasks AS t
    LEFT JOIN json_each(:keep) AS k ON k.key = q.name
    WHERE t.queue = q.name AND t.state = 'archived'
      AND t.expires_at <= :now - (CASE WHEN k.key IS NULL THEN :default ELSE k.value END)
    LIMIT :limit
);

-- name: upsert_worker
INSERT INTO durq_workers (id, host, pid, queues, concurrency, started_at, last_heartbeat,
                          active, strict)
VALUES (:id, :host, :pid, :queues, :concurrency, :started_at, :now, :active, :strict)
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, queues = excluded.queues,
    concurrency = excluded.concurrency, last_heartbeat = excluded.last_heartbeat,
    active = excluded.active, strict = excluded.strict;

-- name: forget_dead_workers
-- Rows of workers that died without unregistering, long after list_workers stopped showing them.
DELETE FROM durq_workers WHERE last_heartbeat < :before;

-- name: delete_worker
DELETE FROM durq_workers WHERE id = :id;

-- ---------------------------------------------------------------- admin

-- name: get_task
-- A completed task past its retention counts as gone.
SELECT * FROM durq_tasks
WHERE queue = :queue AND id = :id
  AND NOT (state = 'completed' AND expires_at <= :now);

-- name: get_tasks
-- Several tasks of one queue by id (:ids a JSON array), as get_task reads each.
SELECT * FROM durq_tasks
WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids))
  AND NOT (state = 'completed' AND expires_at <= :now);

-- name: get_outcomes
-- get_tasks narrowed to what a workflow node reads of its dependencies (Admin.get_outcomes).
SELECT id, state, result, last_error, headers FROM durq_tasks
WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids))
  AND NOT (state = 'completed' AND expires_at <= :now);

-- name: get_queue
SELECT name, paused FROM durq_queues WHERE name = :queue;

-- name: all_queues
SELECT name, paused FROM durq_queues ORDER BY name;

-- name: queue_sizes
SELECT state, count(*) AS n FROM durq_tasks
WHERE queue = :queue AND NOT (state = 'completed' AND expires_at <= :now)
GROUP BY state;

-- name: oldest_ready
-- When the oldest claimable-now task became ready (I1 "oldest pending age").
SELECT min(next_process_at) FROM durq_tasks
WHERE queue = :queue AND state IN ('pending', 'scheduled', 'retry') AND next_process_at <= :now;

-- name: queue_counters
SELECT coalesce(sum(CASE WHEN day = :day THEN processed END), 0),
       coalesce(sum(CASE WHEN day = :day THEN failed END), 0),
       coalesce(sum(processed), 0),
       coalesce(sum(failed), 0)
FROM durq_stats WHERE queue = :queue;

-- name: queue_unique_keys
-- Unique keys (E4) the queue's tasks hold now (durq_tasks_unique: only rows with a key).
SELECT count(*) FROM durq_tasks
WHERE unique_key IS NOT NULL AND queue = :queue
  AND (unique_until IS NULL OR unique_until > :now);

-- name: list_tasks
SELECT * FROM durq_tasks
WHERE queue = :queue AND state = :state AND NOT (state = 'completed' AND expires_at <= :now)
ORDER BY next_process_at, rowid
LIMIT :limit OFFSET :offset;

-- name: search_tasks
-- Tasks of one queue and state that pass a search (TaskFilter): :type exact; when :content,
-- the error and payload conditions by durq_search_match(last_error, payload), the function
-- the admin registers for this search (durq.brokers.search). The first column counts every
-- match; the page's columns are NULL when the page is empty.
WITH hits AS (
    SELECT rowid AS seq_, * FROM durq_tasks
    WHERE queue = :queue AND state = :state AND NOT (state = 'completed' AND expires_at <= :now)
      AND (:type IS NULL OR type = :type)
      AND (NOT :content OR durq_search_match(last_error, payload))
)
SELECT (SELECT count(*) FROM hits) AS total_, page.*
FROM (SELECT 1) LEFT JOIN (
    SELECT * FROM hits ORDER BY next_process_at, seq_ LIMIT :limit OFFSET :offset
) AS page ON 1
ORDER BY page.next_process_at, page.seq_;

-- name: run_task
-- The inspector's moves are fenced by the state the move was decided on (:expect).
-- A held task goes back to the claimable set (the next claim holds it again if need be).
-- An archived task released its dependents when it was archived: it starts with none.
UPDATE durq_tasks
SET state = 'pending', next_process_at = :now, lost = 0, cancel_requested = 0, held_by = NULL,
    dependents = CASE WHEN state = 'archived' THEN NULL ELSE dependents END
WHERE queue = :queue AND id = :id AND state = :expect
RETURNING *;

-- name: archive_task
UPDATE durq_tasks
SET state = 'archived', last_error = coalesce(:error, last_error),
    unique_key = NULL, unique_until = NULL, held_by = NULL, expires_at = :now, kept = 0
WHERE queue = :queue AND id = :id AND state = :expect
RETURNING *;

-- name: rewrite_task
-- durq encryption rotate: new payload and result bytes, fenced by the state and by the
-- bytes the new ones were made from (a task that moved or was rewritten meanwhile is left).
UPDATE durq_tasks
SET payload = :new_payload, result = :new_result
WHERE queue = :queue AND id = :id AND state = :expect AND state <> 'active'
  AND payload = :payload AND result IS :result
  AND NOT (state = 'completed' AND expires_at <= :now);

-- name: delete_task
DELETE FROM durq_tasks
WHERE queue = :queue AND id = :id AND state = :expect
  AND NOT (state = 'completed' AND expires_at <= :now)
RETURNING *;

-- name: request_cancel
UPDATE durq_tasks SET cancel_requested = 1
WHERE queue = :queue AND id = :id AND state = 'active'
RETURNING *;

-- name: run_all
UPDATE durq_tasks
SET state = 'pending', next_process_at = :now, lost = 0, cancel_requested = 0, held_by = NULL,
    dependents = CASE WHEN state = 'archived' THEN NULL ELSE dependents END
WHERE queue = :queue AND state = :state;

-- name: kept_limits
-- W25: the limits of the tasks an inspector's archive or delete takes that kept their
-- sequences' keys (before the move, in its transaction): their slots come back.
SELECT limits FROM durq_tasks
WHERE queue = :queue AND (:id IS NULL OR id = :id) AND state = :state AND kept;

-- name: delete_all
DELETE FROM durq_tasks WHERE queue = :queue AND state = :state;

-- name: set_paused
UPDATE durq_queues SET paused = :paused WHERE name = :queue;

-- name: live_workers
SELECT * FROM durq_workers WHERE last_heartbeat > :since ORDER BY started_at, id;

-- ---------------------------------------------------------------- the machine's clocks

-- name: clock_get
SELECT boot, wall_offset FROM durq_clock WHERE id = 1;

-- name: clock_set
INSERT INTO durq_clock (id, boot, wall_offset) VALUES (1, :boot, :wall_offset)
ON CONFLICT (id) DO UPDATE SET boot = excluded.boot, wall_offset = excluded.wall_offset;

-- name: clock_shift
-- The wall clock stepped by :by: the moments counted from a duration on this machine move
-- with it (delays of scheduled and retry tasks, unique ttls, retention, displayed lease
-- expiries), so they still come that long after they were set. A caller's process_at stays.
UPDATE durq_tasks
SET next_process_at = next_process_at
        + CASE WHEN relative_due = 1 AND (state IN ('scheduled', 'retry')
                                          OR state = 'waiting' AND awaits IS NOT NULL)
               THEN :by ELSE 0 END,
    unique_until = unique_until + :by,
    expires_at = expires_at + :by,
    lease_expires_at = lease_expires_at + :by
WHERE (relative_due = 1 AND (state IN ('scheduled', 'retry')
                             OR state = 'waiting' AND awaits IS NOT NULL))
   OR unique_until IS NOT NULL OR expires_at IS NOT NULL OR lease_expires_at IS NOT NULL;

-- name: insert_group
INSERT INTO durq_groups (queue, id, total, created_at, retention, then_task, then_head,
                         then_tail, then_waiting)
VALUES (:queue, :id, :total, :now, :retention, :then_task, :then_head, :then_tail,
        :then_waiting);

-- name: insert_group_member
INSERT INTO durq_group_members (group_queue, group_id, position, queue, task_id, type, entry)
VALUES (:group_queue, :group_id, :position, :queue, :task_id, :type, :entry);

-- name: finish_member
-- A member's first final outcome; a second one (a rerun archived member) matches no row.
UPDATE durq_group_members SET state = :state, entry = :entry
WHERE group_queue = :group_queue AND group_id = :group_id
  AND queue = :queue AND task_id = :id AND state IS NULL
RETURNING group_queue, group_id;

-- name: forget_member
-- An unfinished member deleted by the inspector keeps its stored "deleted" entry.
UPDATE durq_group_members SET state = 'deleted'
WHERE queue = :queue AND task_id = :id AND state IS NULL
RETURNING group_queue, group_id;

-- name: forget_members_in_state
-- Before deleting every task of one state: its unfinished members finish as deleted.
UPDATE durq_group_members SET state = 'deleted'
WHERE queue = :queue AND state IS NULL
  AND task_id IN (SELECT id FROM durq_tasks WHERE queue = :queue AND state = :state)
RETURNING group_queue, group_id;

-- name: count_finished
-- The fan-in check, in the transaction that recorded the outcomes.
UPDATE durq_groups
SET finished = finished + :n,
    finished_at = CASE WHEN finished + :n >= total THEN :now END
WHERE queue = :group_queue AND id = :group_id
RETURNING finished, total, then_task, then_head, then_tail, then_waiting;

-- name: release_follow_up
-- A group's last member counted: its waiting follow-up gets its payload and is released,
-- pending or scheduled while its due time is ahead (durq.states.released, in SQL);
-- cancelled or deleted meanwhile, it matches no row.
UPDATE durq_tasks
SET payload = :payload, waiting_for = 0,
    state = CASE WHEN next_process_at > :now THEN 'scheduled' ELSE 'pending' END
WHERE queue = :queue AND id = :id AND state = 'waiting'
RETURNING state;

-- name: group_entries
SELECT entry FROM durq_group_members
WHERE group_queue = :group_queue AND group_id = :group_id
ORDER BY position;

-- name: get_group
SELECT * FROM durq_groups
WHERE queue = :queue AND id = :id
  AND NOT (finished_at IS NOT NULL AND finished_at + retention <= :now);

-- name: group_members
SELECT m.task_id, m.queue, m.type, m.state, t.state AS task_state
FROM durq_group_members AS m
LEFT JOIN durq_tasks AS t
  ON t.queue = m.queue AND t.id = m.task_id
  AND NOT (t.state = 'completed' AND t.expires_at <= :now)
WHERE m.group_queue = :queue AND m.group_id = :id
ORDER BY m.position;

-- name: delete_expired_group_members
-- Janitor, first of two: the members of a bounded batch of finished groups past retention.
DELETE FROM durq_group_members
WHERE (group_queue, group_id) IN (
    SELECT queue, id FROM durq_groups
    WHERE finished_at IS NOT NULL AND finished_at + retention <= :now
    ORDER BY queue, id
    LIMIT :limit
);

-- name: delete_expired_groups
-- Then the same batch of groups (same order, nothing changed them in between).
DELETE FROM durq_groups
WHERE (queue, id) IN (
    SELECT queue, id FROM durq_groups
    WHERE finished_at IS NOT NULL AND finished_at + retention <= :now
    ORDER BY queue, id
    LIMIT :limit
);

-- name: list_limits
-- W13: every counted key of one queue (NULL: all), with the tasks held on it.
SELECT l.*, (SELECT count(*) FROM durq_tasks AS t
             WHERE t.queue = l.queue AND t.held_by = l.key) AS held_count
FROM durq_limits AS l
WHERE :queue IS NULL OR l.queue = :queue
ORDER BY l.queue, l.key;

-- name: set_limit_override
-- W23: an operator's limit for one key, winning over the tasks' own until reset; a key no
-- claim has counted gets its counter now (nothing running, the bucket :refilled_at).
INSERT INTO durq_limits (queue, key, tokens, refilled_at, override_concurrency, override_rate,
                         override_per)
VALUES (:queue, :key, 0, :refilled_at, :concurrency, :rate, :per)
ON CONFLICT (queue, key) DO UPDATE
SET override_concurrency = excluded.override_concurrency,
    override_rate = excluded.override_rate, override_per = excluded.override_per;

-- name: reset_limit_override
-- W23: the tasks' own limit applies again (the next claim lets held tasks back by it).
UPDATE durq_limits
SET override_concurrency = NULL, override_rate = NULL, override_per = NULL
WHERE queue = :queue AND key = :key
  AND (override_concurrency IS NOT NULL OR override_rate IS NOT NULL);

-- name: fair_partitions
-- W22: per partition of the queue's fair limits (template, resolved key), tasks waiting
-- (pending, held ones too) and running: the :top with the most tasks, then each template's
-- totals (key NULL). One pass over the queue's pending and active rows (durq_tasks_state).
WITH parts AS (
    SELECT fair_template AS template, json_extract(limits, '$[0][0]') AS key,
           sum(state = 'pending') AS pending, sum(state = 'active') AS running
    FROM durq_tasks
    WHERE queue = :queue AND state IN ('pending', 'active') AND fair_template IS NOT NULL
    GROUP BY 1, 2
)
SELECT * FROM (
    SELECT template, key, pending, running, 1 AS partitions FROM parts
    ORDER BY pending + running DESC, template, key LIMIT :top
)
UNION ALL
SELECT template, NULL, sum(pending), sum(running), count(*) FROM parts GROUP BY template;

-- name: list_unique
-- Unique keys (E4) the queue's tasks hold now, soonest due first, and how many in all (the
-- count reads only the key index's rows; a window count would read every row whole).
SELECT t.*, (SELECT count(*) FROM durq_tasks
             WHERE unique_key IS NOT NULL AND queue = :queue
               AND (unique_until IS NULL OR unique_until > :now)) AS held
FROM durq_tasks AS t
WHERE t.unique_key IS NOT NULL AND t.queue = :queue
  AND (t.unique_until IS NULL OR t.unique_until > :now)
ORDER BY t.next_process_at, t.id
LIMIT :limit;

-- name: list_schedules
SELECT * FROM durq_schedules ORDER BY name;

-- name: get_schedule
SELECT * FROM durq_schedules WHERE name = :name;

-- name: create_schedule
-- A new stored schedule, version 1; nothing when one of that name exists.
INSERT INTO durq_schedules
    (name, spec, type, payload, queue, tz, overlap, paused, updated_at, version)
VALUES (:name, :spec, :type, :payload, :queue, :tz, :overlap, :paused, :now, 1)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: update_schedule
-- Fenced by the version the caller read: a concurrent edit makes this change nothing.
UPDATE durq_schedules
SET spec = :spec, type = :type, payload = :payload, queue = :queue, tz = :tz,
    overlap = :overlap, paused = :paused, updated_at = :now, version = version + 1
WHERE name = :name AND version = :version
RETURNING *;

-- name: delete_schedule
DELETE FROM durq_schedules WHERE name = :name;

-- name: hold_dependent
-- enqueue after=: an unfinished dependency lists the new waiting task (the caller's write
-- transaction has found it unfinished).
UPDATE durq_tasks
SET dependents = json_insert(coalesce(dependents, '[]'), '$[#]', json_array(:w_queue, :w_id))
WHERE queue = :queue AND id = :id;

-- name: set_dependents
-- enqueue_graph: a task created in this transaction lists its dependents (JSON [[queue, id],
-- ...]) written all at once, rather than appended to one by one.
UPDATE durq_tasks SET dependents = :dependents
WHERE queue = :queue AND id = :id;

-- name: dependency_states
-- The state of each dependency named (JSON [[queue, id], ...]) that exists.
SELECT t.queue, t.id, t.state
FROM json_each(:keys) AS k
JOIN durq_tasks AS t
  ON t.queue = json_extract(k.value, '$[0]') AND t.id = json_extract(k.value, '$[1]');

-- name: waiting_task
SELECT waiting_for, next_process_at FROM durq_tasks
WHERE queue = :queue AND id = :id AND state = 'waiting';

-- name: count_down
-- A waiting task counted down (dependencies.countdown decides :waiting_for and :state).
UPDATE durq_tasks SET waiting_for = :waiting_for, state = :state
WHERE queue = :queue AND id = :id AND state = 'waiting';

-- name: dependents_in_state
-- delete_all of an unfinished state: the dependents of the tasks it deletes.
SELECT dependents FROM durq_tasks
WHERE queue = :queue AND state = :state AND dependents IS NOT NULL;

-- ---------------------------------------------------------------- workflows

-- name: insert_workflow
-- In enqueue_graph's transaction, after its nodes: a record left by an older workflow of
-- this id (all of its tasks gone, or the nodes would have been refused) is replaced.
INSERT INTO durq_workflows (id, name, created_at, retention)
VALUES (:id, :name, :now, :retention)
ON CONFLICT (id) DO UPDATE
SET name = excluded.name, created_at = excluded.created_at, retention = excluded.retention;

-- name: forget_workflow_nodes
DELETE FROM durq_workflow_nodes WHERE workflow_id = :id;

-- name: insert_workflow_node
INSERT INTO durq_workflow_nodes (workflow_id, position, name, queue, task_id, type,
                                 on_failure, after)
VALUES (:workflow_id, :position, :name, :queue, :task_id, :type, :on_failure, :after);

-- name: get_workflow
SELECT id, name, created_at, retention FROM durq_workflows WHERE id = :id;

-- name: list_workflows
-- Newest first; :at/:after_id is the cursor (the last record of the previous page).
SELECT id, name, created_at, retention FROM durq_workflows
WHERE (:created_after IS NULL OR created_at >= :created_after)
  AND (:created_before IS NULL OR created_at < :created_before)
  AND (:at IS NULL OR created_at < :at OR (created_at = :at AND id < :after_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: workflow_nodes
-- The nodes of the workflows :ids (a JSON array), each with its task as it is now (none:
-- gone, or completed past its retention).
SELECT n.workflow_id, n.name, n.queue, n.task_id, n.type, n.on_failure, n.after,
       t.state, t.retried, t.last_error
FROM durq_workflow_nodes AS n
LEFT JOIN durq_tasks AS t
  ON t.queue = n.queue AND t.id = n.task_id
  AND NOT (t.state = 'completed' AND t.expires_at <= :now)
WHERE n.workflow_id IN (SELECT value FROM json_each(:ids))
ORDER BY n.workflow_id, n.position;

-- name: delete_expired_workflows
-- Janitor: a bounded batch of records past their retention none of whose nodes' tasks is
-- left (their nodes go by the foreign key).
DELETE FROM durq_workflows
WHERE id IN (
    SELECT w.id FROM durq_workflows AS w
    WHERE w.created_at + w.retention <= :now
      AND NOT EXISTS (
          SELECT 1 FROM durq_workflow_nodes AS n
          JOIN durq_tasks AS t ON t.queue = n.queue AND t.id = n.task_id
          WHERE n.workflow_id = w.id
      )
    ORDER BY w.created_at
    LIMIT :limit
);
