"""The lifecycle demo: one process runs a worker and a producer on the same broker and shows
each task moving through its states: a success with a result, a delayed task,
a task that polls a partner with ``NotReady``, one that exhausts its retries and is archived,
and an idempotent enqueue refused by its task id."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import durq
from durq.brokers import DEFAULT_URL
from durq.observability.logging import setup_logging
from durq.states import FINISHED, TaskState

QUEUE = "demo"
#: Long enough to inspect the tasks with the CLI after the demo.
RETENTION = "1h"
#: The demo gives up (and fails) if the tasks have not all finished by then.
TIME_LIMIT = 12.0

_STYLE = {
    "pending": "cyan",
    "scheduled": "blue",
    "active": "yellow",
    "retry": "magenta",
    "archived": "red",
    "completed": "green",
}


def _state(state: str) -> str:
    return f"[{_STYLE.get(state, 'white')}]{state}[/]"


@dataclass
class Demo:
    """One run: its app, its task ids (unique per run, so runs can share a database) and
    what the console shows."""

    url: str
    console: Console
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.app = build_app(self.url, self)
        self.ids = {
            "welcome": f"welcome-{self.run_id}",
            "reminder": f"reminder-{self.run_id}",
            "partner": f"partner-check-{self.run_id}",
            "charge": f"charge-{self.run_id}",
        }

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.monotonic() - self.started:5.1f}s[/]  {text}")


def build_app(url: str, demo: Demo) -> durq.App:
    """The demo's app: four task types on queue ``demo``."""
    app = durq.App(url)

    @app.task("demo:greet", queue=QUEUE, retention=RETENTION)
    async def greet(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
        demo.say(f"  [dim]handler demo:greet runs {ctx.id}[/]")
        await asyncio.sleep(0.3)  # some work, so the task is seen active
        return {"greeting": f"hello, {payload['name']}"}

    @app.task("demo:remind", queue=QUEUE, retention=RETENTION)
    async def remind(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
        demo.say(f"  [dim]handler demo:remind runs {ctx.id}, on time[/]")
        return {"reminded": payload["who"]}

    @app.task(
        "demo:poll_partner",
        queue=QUEUE,
        retention=RETENTION,
        max_retry=10,
        retry_delay=durq.fixed(0.5),
    )
    async def poll_partner(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
        if ctx.retried < payload["ready_after"]:
            demo.say(f"  [dim]handler demo:poll_partner attempt {ctx.attempt}: not ready yet[/]")
            raise durq.NotReady(f"partner still processing (check {ctx.attempt})")
        demo.say(f"  [dim]handler demo:poll_partner attempt {ctx.attempt}: partner answered[/]")
        return {"coverage": "approved", "checks": ctx.attempt}

    @app.task(
        "demo:charge_card",
        queue=QUEUE,
        retention=RETENTION,
        max_retry=2,
        retry_delay=durq.fixed(0.5),
    )
    async def charge_card(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        demo.say(f"  [dim]handler demo:charge_card attempt {ctx.attempt}: the bank says no[/]")
        raise RuntimeError(f"card declined for {payload['amount']} EUR")

    return app


async def _enqueue_all(demo: Demo) -> None:
    app, ids, say = demo.app, demo.ids, demo.say
    info = await app.enqueue("demo:greet", {"name": "Ada"}, task_id=ids["welcome"])
    say(f"enqueued [bold]{info.id}[/] (demo:greet): {_state(info.state.value)}")
    info = await app.enqueue("demo:remind", {"who": "Grace"}, task_id=ids["reminder"], process_in=2)
    say(f"enqueued [bold]{info.id}[/] (demo:remind, process_in=2s): {_state(info.state.value)}")
    info = await app.enqueue("demo:poll_partner", {"ready_after": 3}, task_id=ids["partner"])
    say(f"enqueued [bold]{info.id}[/] (demo:poll_partner, NotReady until check 4)")
    info = await app.enqueue("demo:charge_card", {"amount": 42}, task_id=ids["charge"])
    say(f"enqueued [bold]{info.id}[/] (demo:charge_card, max_retry=2)")


async def _try_duplicate(demo: Demo) -> durq.TaskInfo | None:
    """Enqueue the welcome task again with the same id: refused, with the existing task."""
    try:
        await demo.app.enqueue("demo:greet", {"name": "Ada"}, task_id=demo.ids["welcome"])
    except durq.TaskIDConflictError as exc:
        existing = exc.existing
        state = existing.state.value if existing else "?"
        demo.say(
            f"[bold]conflict[/]: task id {demo.ids['welcome']} is taken "
            f"(existing task is {_state(state)}): TaskIDConflictError, nothing written"
        )
        return existing
    demo.say("[red]unexpected: the duplicate enqueue was accepted[/]")
    return None


async def _watch(demo: Demo) -> dict[str, durq.TaskInfo]:
    """Print every change of state (or attempt count) until all tasks are finished."""
    seen: dict[str, tuple[TaskState, int]] = {}
    latest: dict[str, durq.TaskInfo] = {}
    while True:
        for task_id in demo.ids.values():
            info = await demo.app.inspector.get_task_info(QUEUE, task_id)
            latest[task_id] = info
            key = (info.state, info.retried)
            if seen.get(task_id) == key:
                continue
            seen[task_id] = key
            extra = ""
            if info.state is TaskState.RETRY:
                extra = f" attempt {info.retried}/{info.max_retry + 1} failed: {escape(info.last_error or '')}"
            elif info.state is TaskState.ARCHIVED:
                extra = f" after {info.retried} attempts: {escape(info.last_error or '')}"
            elif info.state is TaskState.COMPLETED:
                extra = f" result={escape(json.dumps(info.result))}"
            demo.say(f"[bold]{task_id}[/] -> {_state(info.state.value)}{extra}")
        if all(i.state in FINISHED for i in latest.values()):
            return latest
        await asyncio.sleep(0.1)


def _final_table(demo: Demo, tasks: dict[str, durq.TaskInfo]) -> Table:
    table = Table(title=f"final states (queue {QUEUE})", title_justify="left")
    for name in ("task id", "type", "state", "attempts", "result / last error"):
        table.add_column(name)
    for info in tasks.values():
        if info.state is TaskState.COMPLETED:
            detail, attempts = json.dumps(info.result), info.retried + 1
        else:  # archiving counted the last attempt already
            detail, attempts = info.last_error or "", info.retried
        table.add_row(info.id, info.type, _state(info.state.value), str(attempts), escape(detail))
    return table


async def run(url: str, *, console: Console, broker_flag: str = "") -> bool:
    """Run the demo; True when every outcome was the expected one."""
    setup_logging("ERROR")  # keep the worker quiet except for the archive alert (W4)
    demo = Demo(url, console)
    title = "[bold]durq demo: the task lifecycle"
    if console.is_terminal:
        console.rule(title)
    else:  # piped: a rule would span the whole (unbounded) width
        console.print(title)
    console.print(
        f"broker {escape(url)}, queue [bold]{QUEUE}[/], run {demo.run_id}: "
        "a worker and a producer in this one process\n"
    )
    worker = demo.app.worker(
        queues={QUEUE: 1}, concurrency=4, poll_interval=0.2, promote_interval=0.2
    )
    await worker.start()
    try:
        await _enqueue_all(demo)
        first = await _try_duplicate(demo)
        try:
            tasks = await asyncio.wait_for(_watch(demo), TIME_LIMIT)
        except TimeoutError:
            console.print(f"[red]the tasks did not all finish within {TIME_LIMIT:.0f} s[/]")
            return False
        second = await _try_duplicate(demo)  # still refused once completed (retention)
    finally:
        await worker.stop(timeout=2)
        await demo.app.close()

    console.print()
    console.print(_final_table(demo, tasks))
    states = {k: tasks[v].state for k, v in demo.ids.items()}
    ok = (
        states["welcome"] is TaskState.COMPLETED
        and states["reminder"] is TaskState.COMPLETED
        and states["partner"] is TaskState.COMPLETED
        and states["charge"] is TaskState.ARCHIVED
        and first is not None
        and second is not None
    )
    console.print(
        "\noutcomes: [green]completed[/] 3, [red]archived[/] 1, "
        f"[bold]conflict[/] 2 (refused while {first.state.value if first else '?'} "
        f"and while {second.state.value if second else '?'})"
    )
    flag = f" --broker {broker_flag}" if broker_flag else ""
    console.print("\nInspect it with the CLI:")
    for line in (
        f"durq queue ls{flag}",
        f"durq task ls --queue {QUEUE} --state completed{flag}",
        f"durq task ls --queue {QUEUE} --state archived{flag}",
        f"durq task get {demo.ids['charge']} --queue {QUEUE}{flag}",
        f"durq task run {demo.ids['charge']} --queue {QUEUE}{flag}   (try the archived one again)",
    ):
        console.print(f"  [bold]{escape(line)}[/]")
    if url == DEFAULT_URL:
        console.print("\nThe tasks live in ./durq.sqlite3 for the next hour (their retention).")
    return ok
