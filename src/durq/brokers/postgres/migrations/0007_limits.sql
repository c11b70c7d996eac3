-- durq PostgreSQL schema, version 7: flow-control limits.
-- A task's limits as stored at enqueue ([[key, concurrency, rate, per], ...]; NULL for none)
-- and the key it is held on while that key has no room (then it is out of the claim index).
ALTER TABLE {schema}.tasks ADD COLUMN limits jsonb;
ALTER TABLE {schema}.tasks ADD COLUMN held_by text;

DROP INDEX {schema}.tasks_claimable;
CREATE INDEX tasks_claimable ON {schema}.tasks (queue, priority DESC, next_process_at, seq)
    WHERE state = 'pending' AND held_by IS NULL;

-- Letting a key's held tasks back, oldest first.
CREATE INDEX tasks_held ON {schema}.tasks (queue, held_by, priority DESC, next_process_at, seq)
    WHERE held_by IS NOT NULL;

-- One row per key of a queue that a claim has counted: attempts running, the token bucket,
-- the last limit a task of it carried, and whether tasks may be held on it.
CREATE TABLE {schema}.limits (
    queue       text NOT NULL,
    key         text NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    running     integer NOT NULL DEFAULT 0 CHECK (running >= 0),
    concurrency integer,
    rate        integer,
    per         double precision,
    tokens      double precision NOT NULL DEFAULT 0,
    refilled_at double precision NOT NULL DEFAULT 0,
    waiting     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (queue, key)
);
CREATE INDEX limits_waiting ON {schema}.limits (queue) WHERE waiting;
