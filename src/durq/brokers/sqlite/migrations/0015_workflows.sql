-- durq SQLite schema, version 15: workflows. A workflow's record is written by
-- enqueue_graph in the transaction that creates its nodes: its name, its nodes (task, queue,
-- the nodes each runs after), enough to redraw the graph. Nothing updates it afterwards:
-- progress is read from the nodes' tasks. The janitor drops it once its retention has passed
-- and none of its nodes' tasks is left.
CREATE TABLE durq_workflows (
    id          TEXT NOT NULL PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 90),
    name        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    retention   REAL NOT NULL CHECK (retention >= 0)
);

-- Newest first, and the age filters of a listing.
CREATE INDEX durq_workflows_created ON durq_workflows (created_at, id);

CREATE TABLE durq_workflow_nodes (
    workflow_id TEXT NOT NULL REFERENCES durq_workflows (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL CHECK (position >= 0),
    name        TEXT NOT NULL,
    queue       TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    type        TEXT NOT NULL,
    on_failure  TEXT NOT NULL CHECK (on_failure IN ('cancel', 'skip', 'continue')),
    -- The names of the nodes it runs after, a JSON array.
    after       TEXT NOT NULL,
    PRIMARY KEY (workflow_id, position)
);
