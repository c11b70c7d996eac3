-- durq SQLite schema, version 5: groups. A group's record keeps its members' outcomes (so
-- the fan-in follow-up can be built when members were deleted on completion) and the
-- follow-up to create when the last member finishes.
CREATE TABLE durq_groups (
    queue       TEXT NOT NULL,
    id          TEXT NOT NULL,
    total       INTEGER NOT NULL CHECK (total > 0),
    finished    INTEGER NOT NULL DEFAULT 0,
    created_at  REAL NOT NULL,
    finished_at REAL,
    retention   REAL NOT NULL CHECK (retention >= 0),
    -- The follow-up's options (JSON) and the bytes around its members' entries; NULL: none.
    then_task   TEXT,
    then_head   BLOB,
    then_tail   BLOB,
    PRIMARY KEY (queue, id),
    CHECK (finished BETWEEN 0 AND total)
);

CREATE INDEX durq_groups_finished ON durq_groups (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE durq_group_members (
    group_queue TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    position    INTEGER NOT NULL,
    queue       TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    type        TEXT NOT NULL,
    -- NULL until the member finished; entry holds its "deleted" entry until then.
    state       TEXT CHECK (state IN ('completed', 'archived', 'deleted')),
    entry       BLOB NOT NULL,
    PRIMARY KEY (group_queue, group_id, position)
);

CREATE INDEX durq_group_members_unfinished ON durq_group_members (queue, task_id)
    WHERE state IS NULL;
