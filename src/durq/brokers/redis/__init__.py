"""The Redis broker (``redis://``, ``rediss://``, ``unix://``); needs ``durq[redis]``."""

from durq.brokers.redis.broker import RedisBroker

__all__ = ["RedisBroker"]
