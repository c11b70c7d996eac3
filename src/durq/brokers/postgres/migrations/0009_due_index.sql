-- durq PostgreSQL schema, version 9: an index of the due scheduled and retry rows.
-- The promoter's scan (promote_due): due scheduled and retry rows of every queue, earliest
-- first, without reading the rest of the table. Since the claim index holds pending rows
-- only (0006), nothing else served it, and each pass read the whole table.
CREATE INDEX tasks_due ON {schema}.tasks (next_process_at)
    WHERE state IN ('scheduled', 'retry');
