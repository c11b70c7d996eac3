-- durq PostgreSQL schema, version 6: per-task priority within a queue (higher is claimed
-- first). The claim index now holds pending rows only, in claim order: a claim first moves
-- its queues' due scheduled/retry rows to pending (through tasks_by_state), so rows waiting
-- for a later time never lie in the scan ahead of due ones. Building it reads pending rows
-- only.
ALTER TABLE {schema}.tasks ADD COLUMN priority integer NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -100 AND 100);

DROP INDEX {schema}.tasks_claimable;
CREATE INDEX tasks_claimable ON {schema}.tasks (queue, priority DESC, next_process_at, seq)
    WHERE state = 'pending';
