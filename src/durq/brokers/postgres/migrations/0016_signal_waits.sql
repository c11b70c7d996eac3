-- durq PostgreSQL schema, version 16: a task waiting for a signal is stored "waiting" (it was
-- "scheduled"), so its state says what it does; the promoter finds the waits whose time ran
-- out (promote_due) by this index.
UPDATE {schema}.tasks SET state = 'waiting' WHERE state = 'scheduled' AND awaits IS NOT NULL;
CREATE INDEX tasks_awaits ON {schema}.tasks (next_process_at)
    WHERE state = 'waiting' AND awaits IS NOT NULL;
