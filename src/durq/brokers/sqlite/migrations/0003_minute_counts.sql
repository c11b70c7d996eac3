-- durq SQLite schema, version 3: processed / failed per queue and minute of the broker clock
-- (epoch seconds of the minute's start), kept two days by the janitor. Every dashboard
-- draws its throughput chart from these, so the chart survives a restart.
CREATE TABLE durq_stats_minute (
    queue     TEXT    NOT NULL,
    minute    INTEGER NOT NULL CHECK (minute % 60 = 0),
    processed INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, minute)
) WITHOUT ROWID;
