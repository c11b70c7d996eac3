"""A small service and its tests, shown in docs/testing.md."""
