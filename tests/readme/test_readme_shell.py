"""The README's shell commands, as written, on a fresh copy of the source tree: the install
section, the tutorial and the dashboard.

Commands that install (`pip install ...`, `make install`, `make demo`, `make test`) are not
run: the environment that runs this test was made by `make install`, which `.venv` in the copy
points to, and the installed wheel is tested in tests/wheel. Every other line runs literally,
in one bash session per block, in the order written; servers (`durq demo`, `durq dash`) run
until their pages answer, then get Ctrl-C. When the port a server command uses is taken on
this machine, `--port` with a free one is added at the end (the command's only change)."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from checkout import ROOT, VENV_BIN, fresh_checkout
from insurance.kit import DemoRun, wait_for
from servers import free_port

pytestmark = pytest.mark.slow

SECTIONS = ("Install", "30-second tutorial")
#: Lines that install or build; see the module's docstring.
NOT_RUN = re.compile(r"^(pip install|make (install|demo|test)\b)")
SERVERS = re.compile(r"^durq (demo(?!.*--lifecycle)|dash)\b")


def readme_blocks() -> list[tuple[str, list[str]]]:
    """(section, lines) of each ```bash block in SECTIONS, in order."""
    text = (ROOT / "README.md").read_text()
    found = []
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title, _, body = section.partition("\n")
        if title.strip() not in SECTIONS:
            continue
        for block in re.findall(r"```bash\n(.*?)```", body, flags=re.DOTALL):
            found.append((title.strip(), [line for line in block.splitlines() if line.strip()]))
    return found


def command_of(line: str) -> str:
    """The command of a README line, without its trailing ``# comment``."""
    return re.sub(r"\s+#\s.*$", "", line).strip()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = fresh_checkout(tmp_path_factory.mktemp("clone"))
    (root / ".venv").symlink_to(VENV_BIN.parent)  # what `make install` made
    yield root


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_server(root: Path, command: str) -> str:
    """Start a server command from the README, check its pages, stop it; its output."""
    args = shlex.split(command)
    port = 8181 if args[1] == "dash" else 8000
    if "--port" in args:
        port = int(args[args.index("--port") + 1])
    if not _port_free(port):
        port = free_port()
        args += ["--port", str(port)]
    env = {"PATH": f"{root / '.venv' / 'bin'}:/usr/bin:/bin", "HOME": str(root)}
    with DemoRun(args, cwd=root, env=env) as server:
        base = f"http://127.0.0.1:{port}"
        if args[1] == "dash":
            wait_for(lambda: "access token: " in server.out, timeout=60)
            token = re.search(r"access token: (\S+)", server.out).group(1)  # type: ignore[union-attr]
            page = wait_for(lambda: _get(f"{base}/api/queues", token), timeout=30)
            assert page.status_code == 200, page.text
            assert "default" in [q["name"] for q in page.json()["queues"]], page.text
        else:
            server.wait_ready()
            assert _get(f"{base}/health").json()["status"] == "ok"
            assert "POST /orders" in _get(f"{base}/").json()["endpoints"]
    # Ctrl-C: the demo stops with 0; uvicorn (under the dashboard) re-raises the signal: 130.
    assert server.code in (0, 130), server.stderr()
    return server.out


def _get(url: str, token: str | None = None) -> httpx.Response | None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.get(url, headers=headers, timeout=10)
    except httpx.TransportError:
        return None


def run_block(root: Path, lines: list[str]) -> list[tuple[int, tuple[str, int, str]]]:
    """Run the lines in one bash session: (index, (command, exit code, output)) per
    foreground line."""
    script = ["set -u"]
    for i, line in enumerate(lines):
        if line.endswith("&"):
            script.append(line)
        else:
            script.append(f"echo '::start {i}'; {line} 2>&1; echo \"::end {i} $?\"")
    script.append("kill -TERM $(jobs -p) 2>/dev/null; wait")  # stop background workers
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "HOME": str(root)},  # `durq` only once activated
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = []
    for i, line in enumerate(lines):
        found = re.search(rf"::start {i}\n(.*?)::end {i} (\d+)\n", proc.stdout, re.DOTALL)
        if found:
            results.append((i, (line, int(found.group(2)), found.group(1))))
    return results


def test_readme_has_the_sections_this_test_follows() -> None:
    commands = [command_of(line) for _, lines in readme_blocks() for line in lines]
    assert "make install" in commands and ". .venv/bin/activate" in commands
    assert any(line.startswith("durq worker examples.quickstart:app") for line in commands)
    assert any(SERVERS.match(line) for line in commands)


def test_install_tutorial_and_dashboard_as_written(checkout: Path) -> None:
    activated = False
    for section, lines in readme_blocks():
        # A line's comment says when it must fail ("exit 1: conflict").
        commands = [(command_of(line), "exit 1" in line) for line in lines]
        commands = [c for c in commands if not NOT_RUN.match(c[0])]
        servers = [c for c, _ in commands if SERVERS.match(c)]
        batch = [c for c in commands if not SERVERS.match(c[0])]
        if activated and batch and batch[0][0] != ". .venv/bin/activate":
            batch.insert(0, (". .venv/bin/activate", False))  # the reader's shell stays so
        outcomes = run_block(checkout, [c for c, _ in batch])
        assert len(outcomes) == len([c for c, _ in batch if not c.endswith("&")]), outcomes
        for index, (command, code, out) in outcomes:
            fails_here = batch[index][1]
            assert code == (1 if fails_here else 0), f"{section}: {command} -> {code}\n{out}"
            activated |= command == ". .venv/bin/activate"
            if command.startswith("durq task get welcome-1"):
                assert "welcome-1" in out and "email:send" in out
            if command == "durq queue ls":
                assert "default" in out
            if fails_here:
                assert "already exists" in out
        for command in servers:
            run_server(checkout, command)
    assert activated
