"""The worker: one module per long-running service, wired by :mod:`durq.worker.server`."""

from durq.worker.server import Worker

__all__ = ["Worker"]
