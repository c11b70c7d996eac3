-- durq SQLite schema, version 12: durable steps and snoozes.
-- steps: the recorded steps of a task's handler (JSON text, durq.steps); snoozes: how often
-- its handler snoozed it (bounded by the task's max_snoozes).
ALTER TABLE durq_tasks ADD COLUMN steps TEXT;
ALTER TABLE durq_tasks ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0 CHECK (snoozes >= 0);
