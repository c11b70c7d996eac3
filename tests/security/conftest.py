"""Fixtures of the security tests."""

from observability.conftest import app  # noqa: F401 - a migrated SQLite app
