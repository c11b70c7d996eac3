-- durq PostgreSQL schema, version 17: workflows. A workflow's record is written by
-- enqueue_graph in the transaction that creates its nodes: its name, its nodes (task, queue,
-- the nodes each runs after), enough to redraw the graph. Nothing updates it afterwards:
-- progress is read from the nodes' tasks. The janitor drops it once its retention has passed
-- and none of its nodes' tasks is left.
CREATE TABLE {schema}.workflows (
    id          text NOT NULL PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 90),
    name        text NOT NULL,
    created_at  double precision NOT NULL,
    retention   double precision NOT NULL CHECK (retention >= 0)
);

-- Newest first, and the age filters of a listing.
CREATE INDEX workflows_created ON {schema}.workflows (created_at, id);

CREATE TABLE {schema}.workflow_nodes (
    workflow_id text NOT NULL REFERENCES {schema}.workflows (id) ON DELETE CASCADE,
    position    integer NOT NULL CHECK (position >= 0),
    name        text NOT NULL,
    queue       text NOT NULL,
    task_id     text NOT NULL,
    type        text NOT NULL,
    on_failure  text NOT NULL CHECK (on_failure IN ('cancel', 'skip', 'continue')),
    -- The names of the nodes it runs after, a JSON array.
    after       text NOT NULL,
    PRIMARY KEY (workflow_id, position)
);
