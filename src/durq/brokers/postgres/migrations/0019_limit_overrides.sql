-- durq PostgreSQL schema, version 19: overrides of a key's limit at run time (W23).
-- An operator's concurrency and rate for a key (NULL: the limit tasks carry applies), beside
-- the last limit a task carried, which a reset goes back to. Concurrency 0 starts none.
ALTER TABLE {schema}.limits
    ADD COLUMN override_concurrency integer CHECK (override_concurrency >= 0),
    ADD COLUMN override_rate integer CHECK (override_rate >= 1),
    ADD COLUMN override_per double precision,
    ADD CONSTRAINT limits_override_rate CHECK ((override_rate IS NULL) = (override_per IS NULL));
