-- durq SQLite schema, version 8: periodic schedules kept in the database.
-- One row per stored schedule (app.stored_schedules, `durq schedule`); the payload is JSON
-- text, and every write is fenced by the version it read.
CREATE TABLE durq_schedules (
    name       TEXT    PRIMARY KEY,
    spec       TEXT    NOT NULL,
    type       TEXT    NOT NULL,
    payload    TEXT    NOT NULL DEFAULT '{}',
    queue      TEXT,
    tz         TEXT    NOT NULL DEFAULT 'UTC',
    overlap    TEXT    NOT NULL DEFAULT 'allow',
    paused     INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    updated_at REAL    NOT NULL,
    version    INTEGER NOT NULL CHECK (version >= 1)
);
