"""The PostgreSQL broker (``postgresql://…?schema=durq``), on psycopg 3."""

from durq.brokers.postgres.broker import PostgresBroker

__all__ = ["PostgresBroker"]
