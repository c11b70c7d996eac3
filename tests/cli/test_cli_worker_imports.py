"""``durq worker`` imports what running tasks needs and not what other commands or optional
features need (people's tables, the benchmark tool, the dashboard, web clients, metrics and
tracing libraries): each of those costs start-up time on every worker launch."""

from __future__ import annotations

import json
import signal
import textwrap

from tests.cli.clikit import Cli

#: Loaded only by the commands or the options that use them.
NOT_AT_START = (
    "rich",
    "durq.bench",
    "durq.dashboard",
    "durq.web",
    "durq.observability.metrics",
    "durq.observability.tracing",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "opentelemetry",
    "prometheus_client",
)

PROBE_APP = textwrap.dedent(
    """
    import json
    import os
    import sys

    import durq

    app = durq.App("sqlite:///ignored-because-DURQ_BROKER_URL-overrides.sqlite3")

    @app.task("probe:modules")
    async def modules(payload: dict) -> None:
        with open(os.environ["PROBE_OUT"], "w") as f:
            json.dump(sorted(sys.modules), f)
    """
)


def test_worker_runs_a_task_without_the_optional_modules(cli: Cli) -> None:
    (cli.tmp_path / "probe_app.py").write_text(PROBE_APP)
    out = cli.tmp_path / "modules.json"
    cli.env["PROBE_OUT"] = str(out)
    cli.ok("enqueue", "probe:modules")
    worker = cli.spawn("worker", "probe_app:app")
    cli.wait_for(lambda: out.exists() and out.stat().st_size > 0, what="the probe task")
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=10)
    loaded = json.loads(out.read_text())
    unexpected = [m for m in loaded for p in NOT_AT_START if m == p or m.startswith(p + ".")]
    assert not unexpected, f"durq worker imported {unexpected}"
