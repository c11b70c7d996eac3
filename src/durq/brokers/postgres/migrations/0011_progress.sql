-- durq PostgreSQL schema, version 11: a running task's progress and log lines.
-- progress: the latest report (JSON text); logs: the last lines over all attempts, one JSON
-- object per line joined by a newline (durq.progress bounds both).
ALTER TABLE {schema}.tasks ADD COLUMN progress text;
ALTER TABLE {schema}.tasks ADD COLUMN logs text;
