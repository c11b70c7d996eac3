"""Connection URLs put back together after durq takes its own options out of them."""

from __future__ import annotations

from urllib.parse import SplitResult


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
