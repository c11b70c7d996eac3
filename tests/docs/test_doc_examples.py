"""The Python blocks of the README and the guides run as written, so they cannot rot.

A block whose first line is ``# name.py`` starts a new script, run as ``__main__`` in an empty
directory on the default SQLite broker; a block without that line continues the script before
it, like a session of ``python -m asyncio`` (top-level ``await`` allowed). A block named after
a file of the repository registers the same tasks, with the same options, as that file. A script
named ``test_*.py`` is a test file a reader runs with pytest: its ``test_*`` functions are run."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import durq

ROOT = Path(__file__).resolve().parents[2]
#: Documents whose Python blocks are complete scripts (or continue the script before them).
RUNNABLE = [
    "README.md",
    "docs/web.md",
    "docs/groups.md",
    "docs/results.md",
    "docs/dependencies.md",
    "docs/durable.md",
    "docs/workflows.md",
]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
SCRIPT_NAME = re.compile(r"^# ([\w/.-]+\.py)$")


def blocks(doc: str) -> list[str]:
    return BLOCK.findall((ROOT / doc).read_text(encoding="utf-8"))


def load_file(path: Path) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location(f"readme_ref_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def apps_in(namespace: dict[str, Any]) -> list[durq.App]:
    return [value for value in namespace.values() if isinstance(value, durq.App)]


def run_block(source: str, name: str, namespace: dict[str, Any], loop: Any) -> None:
    code = compile(source, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)  # a block with top-level await gives a coroutine
    if inspect.iscoroutine(result):
        loop.run_until_complete(result)


@pytest.mark.parametrize("doc", RUNNABLE)
def test_the_first_block_names_its_script(doc: str) -> None:
    assert blocks(doc)
    assert SCRIPT_NAME.match(blocks(doc)[0].splitlines()[0]), "the first block must name its file"


@pytest.mark.parametrize("doc", RUNNABLE)
def test_python_blocks_run_as_written(
    doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DURQ_BROKER_URL", raising=False)
    monkeypatch.delenv("DURQ_WEBHOOK_SECRET", raising=False)
    scripts: list[tuple[str, dict[str, Any]]] = []
    loop = asyncio.new_event_loop()
    try:
        for number, source in enumerate(blocks(doc), 1):
            named = SCRIPT_NAME.match(source.splitlines()[0])
            if named:
                scripts.append((named.group(1), {"__name__": "__main__"}))
            name, namespace = scripts[-1]
            run_block(source, f"{doc} block {number} ({name})", namespace, loop)
        for name, namespace in scripts:
            if Path(name).name.startswith("test_"):
                run_tests(namespace, loop)
        for name, namespace in scripts:
            for app in apps_in(namespace):
                # A schedule whose type no handler serves retries forever ("no handler").
                unserved = [e.type for e in app.schedules if e.type not in app.tasks]
                assert not unserved, f"{name}: schedules without a handler: {unserved}"
            if (ROOT / name).is_file():
                same_tasks_as_the_file(name, namespace)
    finally:
        for _, namespace in scripts:
            for app in apps_in(namespace):
                loop.run_until_complete(app.close())
                app.close_sync()
        loop.close()


def run_tests(namespace: dict[str, Any], loop: Any) -> None:
    tests = [f for n, f in namespace.items() if n.startswith("test_") and callable(f)]
    assert tests, "a test file without tests"
    for test in tests:
        result = test()
        if inspect.iscoroutine(result):
            loop.run_until_complete(result)


def same_tasks_as_the_file(name: str, namespace: dict[str, Any]) -> None:
    shown = {t: d.defaults for app in apps_in(namespace) for t, d in app.tasks.items()}
    real = {t: d.defaults for app in apps_in(load_file(ROOT / name)) for t, d in app.tasks.items()}
    assert shown, name
    for task_type, defaults in shown.items():
        assert real.get(task_type) == defaults, (
            f"{name} as shown differs from the file: {task_type}"
        )
