"""Write bytes straight into a broker's storage, behind the client's back (hostile input)."""

from __future__ import annotations

import sqlite3

from servers import PG_DSN, REDIS_URL


def write_payload(kind: str, url: str, queue: str, task_id: str, raw: bytes) -> None:
    """Replace the stored payload of one existing task with ``raw``, whatever it is."""
    if kind == "sqlite":
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            cur = conn.execute(
                "UPDATE durq_tasks SET payload = ? WHERE queue = ? AND id = ?",
                (raw, queue, task_id),
            )
            assert cur.rowcount == 1
    elif kind == "postgres":
        import psycopg
        from psycopg import sql

        schema = url.split("schema=", 1)[1]
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            cur = conn.execute(
                sql.SQL("UPDATE {}.tasks SET payload = %s WHERE queue = %s AND id = %s").format(
                    sql.Identifier(schema)
                ),
                (raw, queue, task_id),
            )
            assert cur.rowcount == 1
    elif kind == "memory":
        from durq.brokers.memory.storage import store_for

        store = store_for(url.removeprefix("memory://"))
        with store.lock:
            store.tasks[(queue, task_id)].payload = raw
    else:
        import redis

        from durq.brokers.redis.keys import QueueKeys

        prefix = url.split("prefix=", 1)[1]
        key = QueueKeys(prefix, queue).task(task_id)
        client = redis.Redis.from_url(REDIS_URL)
        try:
            assert client.exists(key)
            # The payload is stored in chunks p:0, p:1, ...; leave exactly one.
            stale = [f for f in client.hkeys(key) if f.startswith(b"p:") and f != b"p:0"]
            if stale:
                client.hdel(key, *stale)
            client.hset(key, "p:0", raw)
        finally:
            client.close()
