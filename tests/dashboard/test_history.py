"""The chart's ring of samples: per-minute rates between consecutive counter samples."""

from __future__ import annotations

import httpx

import durq
from durq.clock import FakeClock
from durq.dashboard.history import History, Sample


def test_rates_between_samples() -> None:
    history = History(durq.App("sqlite:///:memory:"), interval=10, window=60)
    history.samples.extend(
        [
            Sample(0, {"a": (0, 0)}),
            Sample(10, {"a": (5, 1), "b": (2, 0)}),  # b appears: counted from its first sample
            Sample(20, {"a": (5, 1), "b": (4, 2)}),
        ]
    )
    points = history.series()["points"]
    assert points == [
        {"t": 10, "processed": 30.0, "failed": 6.0},
        {"t": 20, "processed": 12.0, "failed": 12.0},
    ]
    assert history.series("a")["points"][1] == {"t": 20, "processed": 0.0, "failed": 0.0}
    assert history.samples.maxlen == 8  # the ring keeps one window


async def test_samples_come_from_the_inspector(app: durq.App, api: httpx.AsyncClient) -> None:
    clock = FakeClock()
    app.clock = clock
    dash = History(app, interval=10)
    await app.enqueue("email:send", {})
    await dash.sample()
    clock.advance(10)
    await dash.sample()
    assert [s.totals for s in dash.samples] == [{"default": (0, 0)}] * 2
    r = await api.get("/api/history")
    assert r.status_code == 200 and r.json()["unit"] == "tasks per minute"
    assert (await api.get("/api/queues/default/history")).status_code == 200
    assert (await api.get("/api/queues/nope/history")).status_code == 404
