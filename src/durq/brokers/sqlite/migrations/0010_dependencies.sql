-- durq SQLite schema, version 10: dependencies between tasks (enqueue after=).
-- A new state, waiting, in the state CHECK: SQLite changes a CHECK only by building the
-- table again, so durq_tasks is copied into a new one with the same columns plus:
-- dependents: the waiting tasks this one holds back (JSON [[queue, id], ...]; NULL: none);
-- waiting_for: how many of its dependencies a waiting task still waits for.
CREATE TABLE durq_tasks_new (
    id               TEXT    NOT NULL CHECK (length(id) BETWEEN 1 AND 200),
    queue            TEXT    NOT NULL CHECK (length(queue) BETWEEN 1 AND 100
                                             AND queue NOT GLOB '*[^A-Za-z0-9_.:-]*'),
    type             TEXT    NOT NULL CHECK (length(type) BETWEEN 1 AND 100
                                             AND type NOT GLOB '*[^A-Za-z0-9_.:-]*'),
    payload          BLOB    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'scheduled', 'active',
                                                       'retry', 'archived', 'completed',
                                                       'waiting')),
    max_retry        INTEGER NOT NULL CHECK (max_retry >= 0),
    retried          INTEGER NOT NULL DEFAULT 0 CHECK (retried >= 0),
    last_error       TEXT,
    timeout          REAL,
    deadline         REAL,
    next_process_at  REAL    NOT NULL,
    enqueued_at      REAL    NOT NULL,
    completed_at     REAL,
    result           BLOB,
    retention        REAL    NOT NULL DEFAULT 0,
    expires_at       REAL,
    lost             INTEGER NOT NULL DEFAULT 0,
    headers          TEXT    NOT NULL DEFAULT '{}',
    started_at       REAL,
    lease_token      TEXT,
    lease_expires_at REAL,
    worker_id        TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    unique_key       TEXT,
    unique_until     REAL,
    traceback        TEXT,
    lease_boot       TEXT,
    lease_mono       REAL,
    relative_due     INTEGER NOT NULL DEFAULT 0 CHECK (relative_due IN (0, 1)),
    priority         INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    limits           TEXT,
    held_by          TEXT,
    progress         TEXT,
    logs             TEXT,
    dependents       TEXT,
    waiting_for      INTEGER NOT NULL DEFAULT 0 CHECK (waiting_for >= 0),
    PRIMARY KEY (queue, id),
    CHECK ((state = 'active') = (lease_token IS NOT NULL))
);

-- rowid kept: claims order equal tasks by it.
INSERT INTO durq_tasks_new (
    rowid, id, queue, type, payload, state, max_retry, retried, last_error, timeout, deadline,
    next_process_at, enqueued_at, completed_at, result, retention, expires_at, lost, headers,
    started_at, lease_token, lease_expires_at, worker_id, cancel_requested, unique_key,
    unique_until, traceback, lease_boot, lease_mono, relative_due, priority, limits, held_by,
    progress, logs
)
SELECT
    rowid, id, queue, type, payload, state, max_retry, retried, last_error, timeout, deadline,
    next_process_at, enqueued_at, completed_at, result, retention, expires_at, lost, headers,
    started_at, lease_token, lease_expires_at, worker_id, cancel_requested, unique_key,
    unique_until, traceback, lease_boot, lease_mono, relative_due, priority, limits, held_by,
    progress, logs
FROM durq_tasks;

DROP TABLE durq_tasks;
ALTER TABLE durq_tasks_new RENAME TO durq_tasks;

CREATE INDEX durq_tasks_lease ON durq_tasks (lease_expires_at) WHERE state = 'active';
CREATE INDEX durq_tasks_expiry ON durq_tasks (expires_at) WHERE state = 'completed';
CREATE INDEX durq_tasks_due ON durq_tasks (next_process_at) WHERE state IN ('scheduled', 'retry');
CREATE INDEX durq_tasks_state ON durq_tasks (queue, state, next_process_at);
CREATE UNIQUE INDEX durq_tasks_unique ON durq_tasks (unique_key) WHERE unique_key IS NOT NULL;
CREATE INDEX durq_tasks_claimable ON durq_tasks (queue, priority DESC, next_process_at)
    WHERE state = 'pending' AND held_by IS NULL;
CREATE INDEX durq_tasks_held ON durq_tasks (queue, held_by, priority DESC, next_process_at)
    WHERE held_by IS NOT NULL;
