-- durq PostgreSQL schema, version 14: durable steps and snoozes.
-- steps: the recorded steps of a task's handler (JSON text, durq.steps, kept as written so
-- their order stays); snoozes: how often its handler snoozed it (bounded by max_snoozes).
ALTER TABLE {schema}.tasks ADD COLUMN steps text;
ALTER TABLE {schema}.tasks ADD COLUMN snoozes integer NOT NULL DEFAULT 0 CHECK (snoozes >= 0);
