-- durq SQLite schema, version 4: leases on the machine's monotonic clock, and the wall
-- clock's offset from it, so a step of the wall clock neither expires healthy leases nor
-- makes delayed tasks run early or late.
-- lease_boot: the boot (Linux boot_id) whose monotonic clock lease_mono is read on; a lease
-- of another boot has expired (the machine restarted, its worker with it).
ALTER TABLE durq_tasks ADD COLUMN lease_boot TEXT;
ALTER TABLE durq_tasks ADD COLUMN lease_mono REAL;
-- 1 when next_process_at is a delay counted on this machine (process_in, a retry): it moves
-- with a step of the wall clock; 0 for the caller's own moment (process_at).
ALTER TABLE durq_tasks ADD COLUMN relative_due INTEGER NOT NULL DEFAULT 0
    CHECK (relative_due IN (0, 1));
-- The wall clock minus the monotonic clock of the current boot, as last seen.
CREATE TABLE durq_clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    boot TEXT NOT NULL,
    wall_offset REAL NOT NULL
);
