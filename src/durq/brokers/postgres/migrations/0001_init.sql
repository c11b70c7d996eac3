-- durq PostgreSQL schema, version 1.
--
-- Times are epoch seconds in double precision: the broker's injected clock produces floats,
-- a float8 holds a Python float exactly (timestamptz would round to microseconds), and every
-- comparison is against a parameter read from that clock, never against now().
-- {schema} is replaced by the quoted schema name when the file is loaded.

CREATE TABLE {schema}.queues (
    name        text PRIMARY KEY
                CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' AND length(name) <= 100),
    paused      boolean NOT NULL DEFAULT false
);

CREATE TABLE {schema}.tasks (
    queue            text NOT NULL
                     CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' AND length(queue) <= 100),
    id               text NOT NULL CHECK (length(id) BETWEEN 1 AND 200),
    -- Enqueue order: the tie-breaker after next_process_at when claiming and listing.
    seq              bigint GENERATED ALWAYS AS IDENTITY,
    type             text NOT NULL
                     CHECK (type ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' AND length(type) <= 100),
    payload          bytea NOT NULL,
    state            text NOT NULL
                     CHECK (state IN ('pending', 'scheduled', 'active', 'retry', 'archived',
                                      'completed')),
    max_retry        integer NOT NULL CHECK (max_retry >= 0),
    retried          integer NOT NULL DEFAULT 0,
    lost             integer NOT NULL DEFAULT 0,
    last_error       text,
    timeout          double precision,
    deadline         double precision,
    next_process_at  double precision NOT NULL,
    enqueued_at      double precision NOT NULL,
    started_at       double precision,
    completed_at     double precision,
    result           bytea,
    retention        double precision NOT NULL DEFAULT 0,
    -- completed_at + retention: after it the task counts as gone (E3) and the janitor deletes it.
    expires_at       double precision,
    headers          jsonb NOT NULL DEFAULT jsonb_build_object(),
    -- The fencing token of the current lease (W1); every mutation of an active task names it.
    lease_token      text,
    lease_expires_at double precision,
    worker_id        text,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- E4: held while unique_until has not passed and the task is neither completed nor archived.
    unique_key       text,
    unique_until     double precision,
    -- E3 in the database: one task id per queue.
    PRIMARY KEY (queue, id),
    CHECK (state <> 'active' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK (state <> 'completed' OR expires_at IS NOT NULL)
);

-- The dequeue index: only rows a worker may take are in it, so completed and archived rows
-- (the bulk of a long-lived table) never enter the claim scan.
CREATE INDEX tasks_claimable ON {schema}.tasks (queue, next_process_at, seq)
    WHERE state IN ('pending', 'scheduled', 'retry');

-- E4 in the database: a second live task with the same unique key cannot be inserted.
CREATE UNIQUE INDEX tasks_unique_key ON {schema}.tasks (unique_key)
    WHERE unique_key IS NOT NULL;

-- The rescuer's scan: active rows by lease expiry.
CREATE INDEX tasks_leases ON {schema}.tasks (lease_expires_at) WHERE state = 'active';

-- The janitor's scan: completed rows by retention expiry.
CREATE INDEX tasks_retention ON {schema}.tasks (expires_at) WHERE state = 'completed';

-- The inspector: tasks of one queue in one state, oldest first.
CREATE INDEX tasks_by_state ON {schema}.tasks (queue, state, next_process_at, seq);

-- Counters for the inspector (I1), per queue and UTC day of the broker clock.
CREATE TABLE {schema}.stats (
    queue      text NOT NULL,
    day        date NOT NULL,
    processed  bigint NOT NULL DEFAULT 0,
    failed     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, day)
);

-- Worker processes and their heartbeats (I5).
CREATE TABLE {schema}.workers (
    id              text PRIMARY KEY,
    host            text NOT NULL,
    pid             integer NOT NULL,
    queues          jsonb NOT NULL,
    concurrency     integer NOT NULL,
    strict          boolean NOT NULL DEFAULT false,
    started_at      double precision NOT NULL,
    last_heartbeat  double precision NOT NULL,
    active          integer NOT NULL DEFAULT 0
);
