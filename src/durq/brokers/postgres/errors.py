"""psycopg errors as durq's typed errors: the one mapping of the PostgreSQL broker."""

from __future__ import annotations

import psycopg

from durq.errors import BrokerError, BrokerUnavailableError, InvalidNameError, SchemaError


def translate(exc: BaseException, operation: str, schema: str) -> Exception | None:
    """The durq error for a driver error of ``operation`` (``"postgres.claim"``), or
    ``None`` when it is not one to map."""
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
        return SchemaError(
            f"the durq tables are missing in schema {schema!r}: run `durq migrate` ({exc})",
            operation=operation,
        )
    if isinstance(exc, psycopg.errors.CheckViolation | psycopg.DataError):
        # The schema's CHECKs (names, ids) or a value PostgreSQL cannot store (NUL in
        # text): a caller that skipped durq.names, refused like at the edge.
        detail = getattr(exc.diag, "constraint_name", None) or str(exc).splitlines()[0]
        return InvalidNameError(f"PostgreSQL refused {operation}: {detail}", operation=operation)
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return BrokerError(
            f"PostgreSQL refused {operation}: permission denied ({exc})", operation=operation
        )
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError):
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return BrokerUnavailableError(f"PostgreSQL is unavailable: {detail}", operation=operation)
    return None
