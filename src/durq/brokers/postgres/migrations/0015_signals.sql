-- durq PostgreSQL schema, version 15: signals (ctx.wait_for, app.signal).
-- signals: the signals delivered to a task (name -> payload, one jsonb object, so that one
-- UPDATE adds a name without rewriting the others'); awaits: the signal its handler waits
-- for while it is scheduled (written by every retry move: NULL when it waits for none).
ALTER TABLE {schema}.tasks ADD COLUMN signals jsonb;
ALTER TABLE {schema}.tasks ADD COLUMN awaits text;
