-- durq SQLite schema, version 14: a task waiting for a signal is stored "waiting" (it was
-- "scheduled"), so its state says what it does; the promoter finds the waits whose time ran
-- out by this index.
UPDATE durq_tasks SET state = 'waiting' WHERE state = 'scheduled' AND awaits IS NOT NULL;
CREATE INDEX durq_tasks_awaits ON durq_tasks (next_process_at)
    WHERE state = 'waiting' AND awaits IS NOT NULL;
