-- durq PostgreSQL schema, version 13: a group's follow-up exists from enqueue_group on,
-- waiting for its group, and the step that counts the last member releases it with its
-- payload. then_waiting: true for a group created so; false for one created before, whose
-- follow-up is still created by that step.
ALTER TABLE {schema}.groups ADD COLUMN then_waiting boolean NOT NULL DEFAULT false;
