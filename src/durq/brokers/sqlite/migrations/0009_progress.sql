-- durq SQLite schema, version 9: a running task's progress and log lines.
-- progress: the latest report (JSON); logs: the last lines over all attempts, one JSON
-- object per line joined by a newline (durq.progress bounds both).
ALTER TABLE durq_tasks ADD COLUMN progress TEXT;
ALTER TABLE durq_tasks ADD COLUMN logs TEXT;
