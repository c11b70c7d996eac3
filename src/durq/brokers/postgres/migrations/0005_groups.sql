-- durq PostgreSQL schema, version 5: groups. A group's record keeps its members' outcomes
-- (so the fan-in follow-up can be built when members were deleted on completion) and the
-- follow-up to create when the last member finishes. Completions of a group's members
-- serialise on the group's row (UPDATE ... RETURNING), so exactly one sees the last count.
CREATE TABLE {schema}.groups (
    queue       text NOT NULL,
    id          text NOT NULL CHECK (id ~ '^[A-Za-z0-9_-]+$' AND length(id) <= 100),
    total       integer NOT NULL CHECK (total > 0),
    finished    integer NOT NULL DEFAULT 0,
    created_at  double precision NOT NULL,
    finished_at double precision,
    retention   double precision NOT NULL CHECK (retention >= 0),
    -- The follow-up's options (JSON) and the bytes around its members' entries; NULL: none.
    then_task   text,
    then_head   bytea,
    then_tail   bytea,
    PRIMARY KEY (queue, id),
    CHECK (finished BETWEEN 0 AND total)
);

CREATE INDEX groups_finished ON {schema}.groups (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE {schema}.group_members (
    group_queue text NOT NULL,
    group_id    text NOT NULL,
    position    integer NOT NULL,
    queue       text NOT NULL,
    task_id     text NOT NULL,
    type        text NOT NULL,
    -- NULL until the member finished; entry holds its "deleted" entry until then.
    state       text CHECK (state IN ('completed', 'archived', 'deleted')),
    entry       bytea NOT NULL,
    PRIMARY KEY (group_queue, group_id, position),
    FOREIGN KEY (group_queue, group_id) REFERENCES {schema}.groups (queue, id) ON DELETE CASCADE
);

CREATE INDEX group_members_unfinished ON {schema}.group_members (queue, task_id)
    WHERE state IS NULL;
