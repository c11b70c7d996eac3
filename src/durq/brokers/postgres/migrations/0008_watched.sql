-- durq PostgreSQL schema, version 8: tasks whose end someone waits for.
-- Set by App.wait (watch_end) before it reads the task; a completion announces the end of
-- such a task only, instead of one NOTIFY per batch of completions whether or not anyone
-- listens. A constant default: adding the column rewrites no row.
ALTER TABLE {schema}.tasks ADD COLUMN watched boolean NOT NULL DEFAULT false;
