-- durq SQLite schema, version 6: per-task priority within a queue (higher is claimed first).
-- The claim index now serves pending rows only, in claim order; a claim first moves its
-- queue's due scheduled/retry rows to pending (by durq_tasks_state), so rows waiting for a
-- later time never lie in the scan ahead of due ones.
ALTER TABLE durq_tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -100 AND 100);

DROP INDEX durq_tasks_claimable;
CREATE INDEX durq_tasks_claimable ON durq_tasks (queue, priority DESC, next_process_at)
    WHERE state = 'pending';
