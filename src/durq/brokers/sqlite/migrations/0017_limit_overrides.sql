-- durq SQLite schema, version 17: overrides of a key's limit at run time (W23).
-- An operator's concurrency and rate for a key (NULL: the limit tasks carry applies), beside
-- the last limit a task carried, which a reset goes back to. Concurrency 0 starts none.
ALTER TABLE durq_limits ADD COLUMN override_concurrency INTEGER
    CHECK (override_concurrency >= 0);
ALTER TABLE durq_limits ADD COLUMN override_rate INTEGER CHECK (override_rate >= 1);
ALTER TABLE durq_limits ADD COLUMN override_per REAL
    CHECK ((override_rate IS NULL) = (override_per IS NULL));
