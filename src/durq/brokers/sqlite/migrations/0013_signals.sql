-- durq SQLite schema, version 13: signals (ctx.wait_for, app.signal).
-- signals: the signals delivered to a task (a JSON object, name -> payload); awaits: the
-- signal its handler waits for while it is scheduled (set by the move that made it wait).
ALTER TABLE durq_tasks ADD COLUMN signals TEXT;
ALTER TABLE durq_tasks ADD COLUMN awaits TEXT;
