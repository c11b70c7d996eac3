"""docs/integrations.md: each example of docs/examples/ runs against a real broker file
(FastAPI through its ASGI test client with the lifespan, Flask through its WSGI test client,
the script as a process)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

import durq

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def load(name: str, broker_url: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("DURQ_BROKER_URL", broker_url)
    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_completed(app: durq.App, queue: str, task_id: str) -> durq.TaskInfo:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = app.run_sync(lambda: app.inspector.get_task_info(queue, task_id))
        if info.state is durq.TaskState.COMPLETED:
            return info
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} did not complete: {info.state}")


def test_fastapi_lifespan_dependency_and_in_process_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    module = load("fastapi_app", f"sqlite:///{tmp_path / 'durq.sqlite3'}", monkeypatch)
    with TestClient(module.api) as client:  # runs the lifespan: client and worker
        answer = client.post("/emails", json={"to": "a@b.c", "id": "welcome-1"})
        assert answer.status_code == 202
        assert answer.json()["task_id"] == "welcome-1"
        again = client.post("/emails", json={"to": "a@b.c", "id": "welcome-1"})
        assert again.status_code == 200 and again.json()["status"] == "already_accepted"
        info = wait_completed(module.tasks, "default", "welcome-1")
        assert info.result == {"sent_to": "a@b.c"}
    module.tasks.close_sync()


def test_flask_extension_with_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load("flask_app", f"sqlite:///{tmp_path / 'durq.sqlite3'}", monkeypatch)
    flask_app = module.create_app(worker=True)
    answer = flask_app.test_client().post("/reports", json={"rows": 21})
    assert answer.status_code == 202
    info = wait_completed(module.tasks, "default", answer.get_json()["task_id"])
    assert info.result == {"rows": 42}
    flask_app.extensions["durq_worker"].stop()
    module.tasks.close_sync()


def test_plain_script(tmp_path: Path) -> None:
    env = {**os.environ, "DURQ_BROKER_URL": f"sqlite:///{tmp_path / 'durq.sqlite3'}"}
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "script.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "5"
