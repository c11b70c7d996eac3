-- durq SQLite schema, version 19: strict sequences per key (W25).
-- A task whose limit is a sequence ([..., template, cost, 1] in `limits`) keeps that key
-- from its first start until it finishes: `kept` is 1 while a task that ended an attempt
-- without finishing (retry, snooze, wait, hand-back, rescue) still counts in the key's
-- running slot. A claim does not count it again; completing, archiving, cancelling or
-- deleting the task gives it back.
ALTER TABLE durq_tasks ADD COLUMN kept INTEGER NOT NULL DEFAULT 0 CHECK (kept IN (0, 1));
