"""``durq encryption rotate`` in a real process: tasks sealed with an older key are
re-encrypted with the newest one (a dry run changes nothing), and a worker that only has the
newest key then reads them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cli.clikit import Cli

import durq
from durq import encryption as crypt
from durq.encryption import Encryption
from durq.states import TaskState

K1 = Encryption.new_key()
K2 = Encryption.new_key()

APP_MODULE = """
import durq

app = durq.App()

@app.task("doc:sign", retention=600)
def sign(payload):
    return {"signed": payload["doc"]}
"""


def stored(url: str, queue: str = "default") -> dict[str, durq.TaskInfo]:
    async def read() -> dict[str, durq.TaskInfo]:
        app = durq.App(url)
        try:
            found: dict[str, durq.TaskInfo] = {}
            for state in TaskState:
                for t in await app.inspector.list_tasks(queue, state):
                    found[t.id] = t
            return found
        finally:
            await app.close()

    return asyncio.run(read())


def test_rotate_re_encrypts_with_the_newest_key(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "signapp.py").write_text(APP_MODULE)
    cli.ok("migrate")

    async def seed() -> None:
        app = durq.App(cli.url, encryption=Encryption({"k1": K1}))
        try:
            for n in range(5):
                await app.enqueue("doc:sign", {"doc": n}, task_id=f"doc-{n}")
            await app.enqueue("doc:sign", {"doc": 9}, task_id="later", process_in=3600)
        finally:
            await app.close()
        plain = durq.App(cli.url)  # stored before encryption was turned on
        try:
            await plain.enqueue("doc:sign", {"doc": 7}, task_id="clear")
        finally:
            await plain.close()

    asyncio.run(seed())
    cli.env["DURQ_ENCRYPTION_KEYS"] = f"k2:{K2},k1:{K1}"
    before = stored(cli.url)
    dry = cli.ok("encryption", "rotate", "signapp:app", "--dry-run", "--json").json()
    assert dry["rewritten"] == 7 and dry["dry_run"] is True
    assert {k: t.raw_payload for k, t in stored(cli.url).items()} == {
        k: t.raw_payload for k, t in before.items()
    }

    report = cli.ok("encryption", "rotate", "signapp:app", "--batch", "2", "--json").json()
    assert report["rewritten"] == 7 and report["examined"] == 7 and report["newest"] == "k2"
    after = stored(cli.url)
    assert {crypt.key_id(t.raw_payload) for t in after.values()} == {"k2"}
    assert after["later"].state is TaskState.SCHEDULED  # the state is left as it was

    again = cli.ok("encryption", "rotate", "signapp:app", "--json").json()
    assert again["rewritten"] == 0 and again["current"] == 7

    shown = cli.ok("task", "get", "doc-0", "--queue", "default").out
    assert "(encrypted)" in shown and "durq:encrypted" not in shown
    listed = cli.ok("task", "ls", "--queue", "default", "--json").out
    assert '"payload_preview": "encrypted"' in listed and "durq:encrypted" not in listed

    # A worker that has only the newest key reads every task.
    cli.env["DURQ_ENCRYPTION_KEYS"] = f"k2:{K2}"
    worker = cli.spawn("worker", "signapp:app")

    async def results() -> list[object]:
        app = durq.App(cli.url, encryption=Encryption({"k2": K2}))
        try:
            ids = [f"doc-{n}" for n in range(5)] + ["clear"]
            return [await app.wait(i, timeout=20) for i in ids]
        finally:
            await app.close()

    try:
        assert asyncio.run(results()) == [{"signed": n} for n in range(5)] + [{"signed": 7}]
    finally:
        worker.terminate()
        worker.wait(20)


def test_rotate_without_keys_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "signapp.py").write_text(APP_MODULE)
    cli.env.pop("DURQ_ENCRYPTION_KEYS", None)
    result = cli("encryption", "rotate", "signapp:app")
    assert result.code == 2
    assert result.err_lines == [
        "error: signapp:app has no encryption keys (set DURQ_ENCRYPTION_KEYS)"
    ]
