"""The in-memory broker: ``memory://`` (tests, notebooks, scripts)."""

from durq.brokers.memory.broker import MemoryBroker

__all__ = ["MemoryBroker"]
