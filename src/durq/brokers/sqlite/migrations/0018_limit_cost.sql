-- durq SQLite schema, version 18: the cost of a task against a limit (W24).
-- A task's limit may take more than one unit ([key, concurrency, rate, per, template, cost]
-- in `limits`); a key remembers the largest cost of the tasks held on it, and lets them
-- back only once that much is free.
ALTER TABLE durq_limits ADD COLUMN need INTEGER NOT NULL DEFAULT 1 CHECK (need >= 1);
