"""Which broker an app and the command line use: the one given, else ``DURQ_BROKER_URL``, else
an SQLite file in the working directory (O5). Real SQLite files; the CLI runs in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

import durq
from durq.cli import run as cli


async def _enqueue_one(app: durq.App) -> None:
    async with app:
        await app.enqueue("mail:send", {"to": "a@b.c"})


async def test_O5_app_without_broker_uses_the_default_file_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DURQ_BROKER_URL", raising=False)
    await _enqueue_one(durq.App())
    assert (tmp_path / "durq.sqlite3").is_file()


async def test_O5_environment_chooses_the_broker_and_an_argument_wins_over_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DURQ_BROKER_URL", f"sqlite:///{tmp_path / 'from-env.sqlite3'}")
    await _enqueue_one(durq.App())
    assert (tmp_path / "from-env.sqlite3").is_file()

    await _enqueue_one(durq.App(f"sqlite:///{tmp_path / 'given.sqlite3'}"))
    assert (tmp_path / "given.sqlite3").is_file()
    assert not (tmp_path / "durq.sqlite3").exists()


def test_O5_cli_broker_flag_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DURQ_BROKER_URL", f"sqlite:///{tmp_path / 'from-env.sqlite3'}")
    flag = f"sqlite:///{tmp_path / 'from-flag.sqlite3'}"
    assert cli(["enqueue", "mail:send", "--task-id", "m-1", "--broker", flag]) == 0
    assert (tmp_path / "from-flag.sqlite3").is_file()
    assert not (tmp_path / "from-env.sqlite3").exists()

    assert cli(["enqueue", "mail:send", "--task-id", "m-1"]) == 0  # the environment's broker
    assert (tmp_path / "from-env.sqlite3").is_file()
