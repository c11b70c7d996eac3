"""redis-py and socket errors as durq's typed errors: the one mapping of the Redis broker."""

from __future__ import annotations

from redis import exceptions as rex

from durq.errors import BrokerError, BrokerUnavailableError, DurqError


def map_error(exc: Exception, operation: str, where: str) -> Exception:
    """The durq error for a failure of ``operation`` (``"redis.claim"``) against the server
    at ``where`` (a redacted URL); ``exc`` itself when it is already durq's or not a
    driver/socket error."""
    if isinstance(exc, DurqError):
        return exc
    if isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError, rex.NoPermissionError)):
        return BrokerError(f"Redis at {where} refused the credentials: {exc}", operation=operation)
    if isinstance(exc, rex.BusyLoadingError):
        return BrokerUnavailableError(
            f"Redis at {where} is loading its data set", operation=operation
        )
    if isinstance(exc, (TimeoutError, rex.ConnectionError, rex.TimeoutError, OSError)):
        return BrokerUnavailableError(
            f"Redis at {where} is unavailable: {exc}", operation=operation
        )
    if isinstance(exc, rex.InvalidResponse):
        return BrokerError(
            f"the server at {where} does not speak the Redis protocol: {exc}", operation=operation
        )
    if isinstance(exc, rex.RedisError):
        return BrokerError(f"Redis refused {operation}: {exc}", operation=operation)
    return exc
