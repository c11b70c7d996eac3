"""Schedules, DST and declaration-time validation (P1). No broker needed."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import durq
from durq.errors import ConfigurationError
from durq.periodic import Cron, Every, parse_schedule, tick_task_id

BERLIN = ZoneInfo("Europe/Berlin")
MOSCOW = ZoneInfo("Europe/Moscow")


def ticks(spec: str, tz: str, start: datetime, n: int) -> list[str]:
    schedule = parse_schedule(spec, tz)
    zone = ZoneInfo(tz)
    ts, out = start.timestamp(), []
    for _ in range(n):
        ts = schedule.next_after(ts)
        out.append(datetime.fromtimestamp(ts, zone).strftime("%m-%d %H:%M%z"))
    return out


def test_cron_in_a_time_zone() -> None:
    start = datetime(2027, 1, 1, 0, 2, tzinfo=MOSCOW)
    assert ticks("*/5 * * * *", "Europe/Moscow", start, 3) == [
        "01-01 00:05+0300",
        "01-01 00:10+0300",
        "01-01 00:15+0300",
    ]
    # 09:00 Moscow is 06:00 UTC.
    daily = parse_schedule("0 9 * * *", "Europe/Moscow")
    tick = daily.next_after(datetime(2027, 1, 1, tzinfo=MOSCOW).timestamp())
    assert datetime.fromtimestamp(tick, ZoneInfo("UTC")).hour == 6


def test_spring_forward_fixed_time_fires_once_after_the_gap() -> None:
    # 2027-03-28: Berlin skips 02:00-03:00. 02:30 does not exist that day.
    start = datetime(2027, 3, 27, 12, 0, tzinfo=BERLIN)
    assert ticks("30 2 * * *", "Europe/Berlin", start, 3) == [
        "03-28 03:00+0200",
        "03-29 02:30+0200",
        "03-30 02:30+0200",
    ]


def test_spring_forward_hourly_skips_the_missing_hour() -> None:
    start = datetime(2027, 3, 28, 0, 30, tzinfo=BERLIN)
    assert ticks("0 * * * *", "Europe/Berlin", start, 3) == [
        "03-28 01:00+0100",
        "03-28 03:00+0200",
        "03-28 04:00+0200",
    ]


def test_fall_back_fixed_time_fires_once() -> None:
    # 2027-10-31: Berlin repeats 02:00-03:00. A daily 02:30 job runs in the first copy only.
    start = datetime(2027, 10, 30, 12, 0, tzinfo=BERLIN)
    assert ticks("30 2 * * *", "Europe/Berlin", start, 2) == [
        "10-31 02:30+0200",
        "11-01 02:30+0100",
    ]


def test_fall_back_wildcard_hour_fires_in_both_copies() -> None:
    start = datetime(2027, 10, 31, 1, 30, tzinfo=BERLIN)
    assert ticks("0 * * * *", "Europe/Berlin", start, 3) == [
        "10-31 02:00+0200",
        "10-31 02:00+0100",
        "10-31 03:00+0100",
    ]


@pytest.mark.parametrize(
    ("spec", "tz", "start"),
    [
        ("30 2 * * *", "Europe/Berlin", datetime(2027, 10, 29, tzinfo=BERLIN)),
        ("0 * * * *", "Europe/Berlin", datetime(2027, 10, 30, 22, tzinfo=BERLIN)),
        ("*/7 * * * *", "America/New_York", datetime(2027, 3, 14, tzinfo=ZoneInfo("UTC"))),
        ("15 1,2,3 * * *", "Europe/Berlin", datetime(2027, 3, 27, tzinfo=BERLIN)),
        ("*/30 2 * * *", "Europe/Berlin", datetime(2027, 10, 30, tzinfo=BERLIN)),
        ("@every 45s", "UTC", datetime(2027, 1, 1, tzinfo=ZoneInfo("UTC"))),
    ],
)
def test_latest_agrees_with_next_after(spec: str, tz: str, start: datetime) -> None:
    """``latest(now)`` is the last tick of the ``next_after`` sequence at or before now."""
    schedule = parse_schedule(spec, tz)
    sequence = [schedule.next_after(start.timestamp())]
    for _ in range(60):
        sequence.append(schedule.next_after(sequence[-1]))
    for prev, nxt in itertools.pairwise(sequence):
        assert schedule.latest(prev) == prev
        assert schedule.latest((prev + nxt) / 2) == prev
        assert schedule.latest(nxt - 0.5) == prev


def test_every_is_anchored_at_the_epoch() -> None:
    every = parse_schedule("@every 30s")
    assert isinstance(every, Every) and every.interval == 30
    assert every.latest(1_800_000_015.5) == 1_800_000_000.0
    assert every.next_after(1_800_000_000.0) == 1_800_000_030.0
    assert parse_schedule("@every 1h30m").next_after(0) == 5400.0


def test_macros_are_cron() -> None:
    assert isinstance(parse_schedule("@daily", "Europe/Berlin"), Cron)
    assert tick_task_id("reports", 1_800_000_000.0) == "periodic:reports:1800000000"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("61 * * * *", "invalid cron expression"),
        ("* * *", "invalid cron expression"),
        ("every 5 minutes", "invalid cron expression"),
        ("", "non-empty"),
        ("@reboot", "invalid cron expression"),
        ("@every", "@every 30s"),
        ("@every soon", "invalid schedule"),
        ("@every 0s", "whole number of seconds"),
        ("@every 1.5s", "whole number of seconds"),
    ],
)
def test_invalid_schedules_raise_at_declaration(spec: str, message: str) -> None:
    app = durq.App("sqlite:///unused.sqlite3")
    with pytest.raises(ConfigurationError, match=message):
        app.add_periodic(spec, "reports:refresh")
    with pytest.raises(ConfigurationError, match=message):

        @app.periodic(spec)
        def job() -> None: ...

    assert "job" not in app.tasks and len(app.schedules) == 0


def test_unknown_time_zone_raises_at_declaration() -> None:
    app = durq.App("sqlite:///unused.sqlite3")
    with pytest.raises(ConfigurationError, match="unknown time zone 'Mars/Olympus'"):
        app.add_periodic("*/5 * * * *", "reports:refresh", tz="Mars/Olympus")
    with pytest.raises(ConfigurationError, match="unknown time zone"):
        app.periodic("0 9 * * *", tz="Europe/Moskva")  # the decorator fails before decorating


def test_other_bad_declarations() -> None:
    app = durq.App("sqlite:///unused.sqlite3")
    with pytest.raises(ConfigurationError, match="missed="):
        app.add_periodic("@hourly", "reports:refresh", missed="always")
    with pytest.raises(ConfigurationError, match="JSON object"):
        app.add_periodic("@hourly", "reports:refresh", payload=[1, 2])
    with pytest.raises(ConfigurationError, match="task type"):
        app.add_periodic("@hourly", "bad type!")
    app.add_periodic("@hourly", "reports:refresh")
    with pytest.raises(ConfigurationError, match="declared twice"):
        app.add_periodic("@daily", "reports:refresh")
    app.add_periodic("@daily", "reports:refresh", name="reports:daily")
    assert [e.name for e in app.schedules] == ["reports:refresh", "reports:daily"]


def test_decorator_registers_the_task_and_the_entry() -> None:
    app = durq.App("sqlite:///unused.sqlite3")

    @app.periodic("*/5 * * * *", tz="Europe/Moscow", queue="cron", max_retry=2)
    async def refresh_rates(payload: dict[str, Any]) -> None: ...

    assert isinstance(refresh_rates, durq.TaskDef)
    assert refresh_rates.type == "refresh_rates"
    assert refresh_rates.defaults.queue == "cron" and refresh_rates.defaults.max_retry == 2
    entry = app.schedules.get("refresh_rates")
    assert entry.spec == "*/5 * * * *" and entry.tz == "Europe/Moscow" and entry.queue == "cron"

    @app.periodic("@every 30s", name="ping:fast", payload={"fast": True})
    @app.task("ping")
    def ping(payload: dict[str, Any]) -> None: ...

    assert ping.type == "ping"
    assert app.schedules.get("ping:fast").payload == {"fast": True}


@dataclasses.dataclass
class Report:
    region: str


def test_typed_payload_is_checked_at_declaration() -> None:
    app = durq.App("sqlite:///unused.sqlite3")

    @app.task("report:build")
    def build(payload: Report) -> None: ...

    app.add_periodic("@daily", "report:build", payload={"region": "eu"})
    with pytest.raises(ConfigurationError, match="periodic 'report:build:bad'"):
        app.add_periodic("@daily", "report:build", payload={"nope": 1}, name="report:build:bad")


def test_default_retention_covers_the_longest_gap() -> None:
    app = durq.App("sqlite:///unused.sqlite3")
    weekdays = app.add_periodic("0 9 * * 1-5", "report", tz="Europe/Berlin")
    # Friday 09:00 to Monday 09:00 is the longest gap: three days, plus the tolerance.
    assert weekdays.retention == 3 * 86400 + weekdays.tolerance
    fast = app.add_periodic("@every 30s", "ping", tolerance=5, retention=None)
    assert fast.retention == 35
    kept = app.add_periodic("@every 30s", "ping", name="ping2", retention="1h")
    assert kept.retention == 3600


def test_missed_policies() -> None:
    app = durq.App("sqlite:///unused.sqlite3")
    skip = app.add_periodic("0 * * * *", "a", tolerance=60)
    once = app.add_periodic("0 * * * *", "b", missed="run_once")
    hour = 1_800_000_000.0  # a whole hour
    assert skip.due(hour + 30, None) == hour  # on time (or a restart within tolerance)
    assert skip.due(hour + 600, None) is None  # ten minutes late: skipped
    assert skip.due(hour + 30, hour) is None  # already handled
    assert once.due(hour + 3 * 3600 + 600, None) == hour + 3 * 3600  # one catch-up: the latest
    assert once.due(hour + 3 * 3600 + 600, hour + 3 * 3600) is None


def test_load_toml(tmp_path: Path) -> None:
    config = tmp_path / "periodic.toml"
    config.write_text(
        """
[[periodic]]
cron = "*/5 * * * *"
type = "rates:refresh"
tz = "Europe/Moscow"
payload = { source = "cbr" }
missed = "run_once"

[[periodic]]
schedule = "@every 30s"
type = "health:ping"
name = "ping"
queue = "low"
""",
        encoding="utf-8",
    )
    app = durq.App("sqlite:///unused.sqlite3")
    entries = app.load_periodic(config)
    assert [e.name for e in entries] == ["rates:refresh", "ping"]
    assert entries[0].payload == {"source": "cbr"} and entries[0].missed == "run_once"
    assert entries[0].tz == "Europe/Moscow" and entries[1].queue == "low"

    bad = tmp_path / "bad.toml"
    bad.write_text('[[periodic]]\ncron = "*/5 * * * *"\ntype = "x"\ntz = "Nowhere/City"\n')
    with pytest.raises(ConfigurationError, match="unknown time zone"):
        app.load_periodic(bad)
    bad.write_text('[[periodic]]\ncron = "*/5 * * * *"\ntype = "x"\nevery = 3\n')
    with pytest.raises(ConfigurationError, match="unknown keys"):
        app.load_periodic(bad)
    bad.write_text("[[periodic]\n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        app.load_periodic(bad)
