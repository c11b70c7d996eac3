-- durq SQLite schema, version 7: flow-control limits.
-- A task's limits as stored at enqueue (JSON [[key, concurrency, rate, per], ...]; NULL for
-- none), and the key it is held on while that key has no room (out of the claimable index).
ALTER TABLE durq_tasks ADD COLUMN limits TEXT;
ALTER TABLE durq_tasks ADD COLUMN held_by TEXT;

DROP INDEX durq_tasks_claimable;
CREATE INDEX durq_tasks_claimable ON durq_tasks (queue, priority DESC, next_process_at)
    WHERE state = 'pending' AND held_by IS NULL;

-- Letting a key's held tasks back, oldest first.
CREATE INDEX durq_tasks_held ON durq_tasks (queue, held_by, priority DESC, next_process_at)
    WHERE held_by IS NOT NULL;

-- One row per key of a queue that a claim has counted: attempts running, the token bucket,
-- the last limit a task of it carried, and whether tasks may be held on it.
CREATE TABLE durq_limits (
    queue       TEXT    NOT NULL,
    key         TEXT    NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    running     INTEGER NOT NULL DEFAULT 0 CHECK (running >= 0),
    concurrency INTEGER,
    rate        INTEGER,
    per         REAL,
    tokens      REAL    NOT NULL DEFAULT 0,
    refilled_at REAL    NOT NULL DEFAULT 0,
    waiting     INTEGER NOT NULL DEFAULT 0 CHECK (waiting IN (0, 1)),
    PRIMARY KEY (queue, key)
);
CREATE INDEX durq_limits_waiting ON durq_limits (queue) WHERE waiting = 1;
