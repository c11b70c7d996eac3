"""psycopg errors as durq's typed errors: the one mapping of the PostgreSQL broker."""

from __future__ import annotations

import psycopg

from durq.errors import (
    BrokerError,
    BrokerUnavailableError,
    ConfigurationError,
    InvalidNameError,
    SchemaError,
)

#: What prepared statements meet behind a transaction pooler: a session that holds another
#: client's statement of the same name, or lacks (or has another) one prepared earlier.
_POOLER_SYMPTOMS = (
    psycopg.errors.DuplicatePreparedStatement,
    psycopg.errors.InvalidSqlStatementName,
)


def pooler_symptom(exc: BaseException) -> bool:
    """Whether ``exc`` is what a prepared statement gets through a transaction pooler."""
    return isinstance(exc, _POOLER_SYMPTOMS) or (
        isinstance(exc, psycopg.errors.ProtocolViolation) and "bind message supplies" in str(exc)
    )


def pooler_error(exc: BaseException, operation: str) -> ConfigurationError:
    """The one-line error of :func:`pooler_symptom`, naming the URL option."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ConfigurationError(
        f"PostgreSQL is reached through a transaction-pooling proxy (PgBouncer "
        f"pool_mode=transaction) and the URL says pgbouncer=0: remove it or set pgbouncer=1 "
        f"({detail})",
        operation=operation,
    )


def translate(exc: BaseException, operation: str, schema: str) -> Exception | None:
    """The durq error for a driver error of ``operation`` (``"postgres.claim"``), or
    ``None`` when it is not one to map."""
    if pooler_symptom(exc):
        return pooler_error(exc, operation)
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
