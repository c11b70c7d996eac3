"""Shared test constants and types (importable from any test package)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import durq

# 2027-01-15 09:00:00 UTC: a Friday, clear of DST changes; a multiple of 60 s.
START = 1_800_003_600.0

AppFactory = Callable[..., Awaitable[durq.App]]
