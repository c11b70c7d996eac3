-- durq PostgreSQL schema, version 2: the traceback of the last failed attempt (bounded by
-- the worker), shown for one task; lists use last_error.
ALTER TABLE {schema}.tasks ADD COLUMN traceback text;
