-- durq PostgreSQL schema, version 12: dependencies between tasks (enqueue after=).
-- A new state, waiting: a task that waits for other tasks to finish, not claimable.
-- dependents: the waiting tasks this one holds back (jsonb [[queue, id], ...]; NULL: none),
-- read by the step that finishes it; waiting_for: how many of its dependencies a waiting
-- task still waits for.
ALTER TABLE {schema}.tasks DROP CONSTRAINT tasks_state_check;
-- A looser check than the one dropped: every row holds it; NOT VALID, then VALIDATE, keeps
-- the table's lock short on a big table.
ALTER TABLE {schema}.tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('pending', 'scheduled', 'active', 'retry', 'archived', 'completed',
                     'waiting')) NOT VALID;
ALTER TABLE {schema}.tasks VALIDATE CONSTRAINT tasks_state_check;
ALTER TABLE {schema}.tasks ADD COLUMN dependents jsonb;
ALTER TABLE {schema}.tasks ADD COLUMN waiting_for integer NOT NULL DEFAULT 0
    CHECK (waiting_for >= 0);
