-- durq SQLite schema, version 1.
-- Table names carry a durq_ prefix so the tables can live in an application's own database.

CREATE TABLE durq_tasks (
    id               TEXT    NOT NULL CHECK (length(id) BETWEEN 1 AND 200),
    queue            TEXT    NOT NULL CHECK (length(queue) BETWEEN 1 AND 100
                                             AND queue NOT GLOB '*[^A-Za-z0-9_.:-]*'),
    type             TEXT    NOT NULL CHECK (length(type) BETWEEN 1 AND 100
                                             AND type NOT GLOB '*[^A-Za-z0-9_.:-]*'),
    payload          BLOB    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'scheduled', 'active',
                                                       'retry', 'archived', 'completed')),
    max_retry        INTEGER NOT NULL CHECK (max_retry >= 0),
    retried          INTEGER NOT NULL DEFAULT 0 CHECK (retried >= 0),
    last_error       TEXT,
    timeout          REAL,
    deadline         REAL,
    -- When the task may run: now for pending, its time for scheduled/retry.
    next_process_at  REAL    NOT NULL,
    enqueued_at      REAL    NOT NULL,
    completed_at     REAL,
    result           BLOB,
    retention        REAL    NOT NULL DEFAULT 0,
    -- completed_at + retention: the janitor deletes completed tasks past it.
    expires_at       REAL,
    lost             INTEGER NOT NULL DEFAULT 0,
    headers          TEXT    NOT NULL DEFAULT '{}',
    started_at       REAL,
    -- Fencing token of the current lease: every mutation of an active task names it.
    lease_token      TEXT,
    lease_expires_at REAL,
    worker_id        TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    -- E4: set while the task holds its uniqueness; cleared on completion/archive.
    unique_key       TEXT,
    unique_until     REAL,
    PRIMARY KEY (queue, id),
    CHECK ((state = 'active') = (lease_token IS NOT NULL))
);

-- claim: due claimable rows of one queue, in (next_process_at, rowid) order.
CREATE INDEX durq_tasks_claimable ON durq_tasks (queue, next_process_at)
    WHERE state IN ('pending', 'scheduled', 'retry');

-- rescue_expired: active rows whose lease ran out.
CREATE INDEX durq_tasks_lease ON durq_tasks (lease_expires_at) WHERE state = 'active';

-- delete_expired: completed rows past their retention.
CREATE INDEX durq_tasks_expiry ON durq_tasks (expires_at) WHERE state = 'completed';

-- promote_due: scheduled/retry rows of every queue by time.
CREATE INDEX durq_tasks_due ON durq_tasks (next_process_at) WHERE state IN ('scheduled', 'retry');

-- list_queues / list_tasks: counts and pages by state.
CREATE INDEX durq_tasks_state ON durq_tasks (queue, state, next_process_at);

-- E4 enforced by the database: one live holder per unique key.
CREATE UNIQUE INDEX durq_tasks_unique ON durq_tasks (unique_key) WHERE unique_key IS NOT NULL;

CREATE TABLE durq_queues (
    name       TEXT    PRIMARY KEY,
    paused     INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    created_at REAL    NOT NULL
);

-- Inspector counters (I1), per queue and UTC day of the broker clock.
CREATE TABLE durq_stats (
    queue     TEXT    NOT NULL,
    day       TEXT    NOT NULL,
    processed INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, day)
);

CREATE TABLE durq_workers (
    id             TEXT    PRIMARY KEY,
    host           TEXT    NOT NULL,
    pid            INTEGER NOT NULL,
    queues         TEXT    NOT NULL,
    concurrency    INTEGER NOT NULL,
    started_at     REAL    NOT NULL,
    last_heartbeat REAL    NOT NULL,
    active         INTEGER NOT NULL DEFAULT 0,
    strict         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX durq_workers_heartbeat ON durq_workers (last_heartbeat);
