"""Connection URLs: put back together after durq takes its own options out of them, and
shown without their password."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from durq import ranges
from durq.errors import ConfigurationError


def unsplit(parts: SplitResult) -> str:
    """``urllib.parse.urlunsplit`` that keeps the ``//`` of an empty host.

    ``unix:///tmp/redis.sock`` and ``postgresql:///app`` (a local socket) come back as they
    were; ``urlunsplit`` gives ``unix:/tmp/redis.sock`` and ``postgresql:/app``, which
    redis-py 8 and libpq refuse."""
    url = f"{parts.scheme}://{parts.netloc}{parts.path}"
    if parts.query:
        url += f"?{parts.query}"
    if parts.fragment:
        url += f"#{parts.fragment}"
    return url


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, for messages and output."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    return unsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def check_port(parts: SplitResult) -> None:
    """ConfigurationError unless the URL's port, if it has one, is 1 to 65535."""
    host = parts.netloc.rpartition("@")[2].rpartition("]")[2]  # past user info and [IPv6]
    _, colon, port = host.rpartition(":")
    if not (colon and port):
        return
    try:
        ranges.port("the port", port)
    except ConfigurationError as exc:
        raise ConfigurationError(f"invalid URL {redact(parts.geturl())!r}: {exc}") from None
