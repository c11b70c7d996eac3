-- durq PostgreSQL schema, version 10: periodic schedules kept in the database.
-- One row per stored schedule (app.stored_schedules, `durq schedule`); the payload is JSON
-- text, and every write is fenced by the version it read.
CREATE TABLE {schema}.schedules (
    name       text             PRIMARY KEY,
    spec       text             NOT NULL,
    type       text             NOT NULL,
    payload    text             NOT NULL DEFAULT '{{}}',
    queue      text,
    tz         text             NOT NULL DEFAULT 'UTC',
    overlap    text             NOT NULL DEFAULT 'allow',
    paused     boolean          NOT NULL DEFAULT false,
    updated_at double precision NOT NULL,
    version    integer          NOT NULL CHECK (version >= 1)
);
