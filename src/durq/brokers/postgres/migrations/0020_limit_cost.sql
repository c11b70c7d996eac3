-- durq PostgreSQL schema, version 20: the cost of a task against a limit (W24).
-- A task's limit may take more than one unit ([key, concurrency, rate, per, template, cost]
-- in `limits`); a key remembers the largest cost of the tasks held on it, and lets them
-- back only once that much is free.
ALTER TABLE {schema}.limits ADD COLUMN need integer NOT NULL DEFAULT 1 CHECK (need >= 1);
