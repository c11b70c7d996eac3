"""sqlite3 errors as durq's typed errors: the one mapping of the SQLite broker."""

from __future__ import annotations

import sqlite3

from durq.errors import BrokerError, BrokerUnavailableError, DurqError


def map_error(
    exc: sqlite3.Error, operation: str, path: str, busy_timeout: float, *, caller: bool = False
) -> DurqError:
    """The durq error for ``exc`` raised by ``operation`` (``"sqlite.claim"``) on ``path``;
    ``caller``: it happened in the caller's transaction, whose connection has its own busy
    timeout."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError):
        return BrokerError(f"SQLite refused the operation: {text}", operation=operation)
    if caller and ("locked" in text or "busy" in text):
        text = (
            f"{text} (the caller's transaction waited for the write lock for its "
            "connection's timeout, or had read before writing: begin it with BEGIN "
            "IMMEDIATE)"
        )
    elif "locked" in text or "busy" in text:
        text = f"{text} (another connection held the write lock for {busy_timeout:g} s)"
    return BrokerUnavailableError(f"SQLite database {path}: {text}", operation=operation)
