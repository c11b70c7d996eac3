-- durq PostgreSQL schema, version 4: processed / failed per queue and minute of the broker
-- clock (epoch seconds of the minute's start), kept two days by the janitor. Every dashboard
-- draws its throughput chart from these, so the chart survives a restart.
CREATE TABLE {schema}.stats_minute (
    queue      text NOT NULL,
    minute     bigint NOT NULL CHECK (mod(minute, 60) = 0),
    processed  bigint NOT NULL DEFAULT 0,
    failed     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, minute)
);
