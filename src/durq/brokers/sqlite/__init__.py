"""The embedded SQLite broker (the default): ``sqlite:///durq.sqlite3``."""

from durq.brokers.sqlite.broker import SQLiteBroker

__all__ = ["SQLiteBroker"]
