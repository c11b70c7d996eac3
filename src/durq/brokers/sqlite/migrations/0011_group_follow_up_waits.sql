-- durq SQLite schema, version 11: a group's follow-up exists from enqueue_group on, waiting
-- for its group, and the step that counts the last member releases it with its payload.
-- then_waiting: 1 for a group created so; 0 for one created before, whose follow-up is
-- still created by that step.
ALTER TABLE durq_groups ADD COLUMN then_waiting INTEGER NOT NULL DEFAULT 0
    CHECK (then_waiting IN (0, 1));
