"""The package as a user installs it: built from a fresh checkout without a deprecation
warning, installed into a new virtual environment, and `durq demo` served from there."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from checkout import fresh_checkout, source_files
from insurance.kit import DemoRun
from servers import free_port

pytestmark = pytest.mark.slow

#: The environment without PYTHONPATH: a test tree on it would hide what is built and
#: installed here (this folder, ``tests/wheel``, would even stand in for the ``wheel`` package).
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``python -m build`` (sdist, then the wheel from the sdist) and its whole output."""
    src = fresh_checkout(tmp_path_factory.mktemp("checkout"))
    dist = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build backend comes from the dev environment (no download).
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    wheels = list(dist.glob("durq-*.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    return wheels[0], output


def test_build_warns_of_nothing(built: tuple[Path, str]) -> None:
    _, output = built
    warnings = [
        line
        for line in output.splitlines()
        if "warning" in line.lower() and "byte-compiling is disabled" not in line
    ]
    assert warnings == [], "\n".join(warnings)


def test_wheel_metadata_is_complete(built: tuple[Path, str]) -> None:
    wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    assert "License-Expression: MIT" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Classifier: Typing :: Typed" in meta
    assert "Project-URL: Homepage, " in meta
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    # A library depends on plain psycopg; the binary build is an opt-in extra.
    assert any(r.startswith("Requires-Dist: psycopg[pool]") for r in requires), requires
    binary = [r for r in requires if "psycopg[binary]" in r]
    assert binary and all('extra == "postgres-binary"' in r for r in binary), binary
    fastapi = [r for r in requires if r.startswith("Requires-Dist: fastapi")]
    assert fastapi and all('extra == "web"' in r for r in fastapi), fastapi  # the admin API
    # The reference service ships inside the package, with its SQL.
    assert "durq/demo/insurance/api.py" in names
    assert "durq/demo/insurance/sql/sqlite.sql" in names
    assert not any(n.startswith("examples/") for n in names)
    # Every file of the source tree is in the wheel (a new subpackage or data directory must
    # be added to the packages list in pyproject.toml).
    shipped = {
        f"durq/{name.removeprefix('src/durq/')}"
        for name in source_files()
        if name.startswith("src/durq/")
    }
    assert shipped - set(names) == set()


def test_durq_demo_runs_from_the_installed_wheel(built: tuple[Path, str], tmp_path: Path) -> None:
    wheel, _ = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=ENV)
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            check=True,
            capture_output=True,
            text=True,
            env=ENV,
        ).stdout.strip()
    )
    # The dependencies come from the dev environment (offline); durq itself only from the
    # wheel: a path line in a .pth adds that directory without running its own .pth files,
    # so the dev environment's editable durq stays out of sight.
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=120,
        env=ENV,
    )
    workdir = tmp_path / "elsewhere"  # no source tree around: nothing to import by accident
    workdir.mkdir()
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import durq.demo.insurance as m; print(m.__file__)"],
        cwd=workdir,
        check=True,
        capture_output=True,
        text=True,
        env=ENV,
    ).stdout
    assert where.startswith(str(site)), where

    port = free_port()
    demo = DemoRun(
        [str(venv / "bin" / "durq"), "demo", "--port", str(port)],
        cwd=workdir,
        env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    with demo:
        demo.wait_ready()
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        index = httpx.get(f"http://127.0.0.1:{port}/", timeout=10).json()
        assert "POST /orders" in index["endpoints"]
    assert demo.code == 0, demo.stderr()
    assert (workdir / "durq.sqlite3").exists()  # the default broker, where the user runs it


def installed_by(requirements: list[str], extra: str) -> set[str]:
    """The distributions ``pip install 'durq[extra]'`` brings: the wheel's requirements of
    the extra (and of the extras it names) with what each of those requires in turn."""
    wanted: set[str] = set()
    extras, todo = {extra}, [extra]
    while todo:
        current = todo.pop()
        for text in requirements:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": current}):
                continue
            if canonicalize_name(req.name) == "durq":
                todo += [e for e in req.extras if e not in extras]
                extras |= req.extras
            else:
                wanted.add(canonicalize_name(req.name))
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                wanted.add(canonicalize_name(req.name))
    return seen


def module_level_imports(path: Path) -> set[str]:
    """Top-level packages a module imports when it is imported (not in functions, not
    under ``if TYPE_CHECKING``), leaving out the standard library and durq."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"durq", "__future__"}


def test_the_web_extra_installs_what_the_dashboard_and_web_helpers_import(
    built: tuple[Path, str],
) -> None:
    """``pip install 'durq[web]'`` then ``durq dash`` (as the README says) must not stop
    at an import: the dev environment has every extra, so only the metadata can tell."""
    wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    requirements = [
        line.removeprefix("Requires-Dist: ")
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    brought = installed_by(requirements, "web")
    src = Path(__file__).resolve().parents[2] / "src" / "durq"
    modules = [*(src / "dashboard").glob("*.py"), *(src / "web").glob("*.py")]
    providers = importlib.metadata.packages_distributions()
    missing = {
        f"{path.relative_to(src)}: {name}"
        for path in modules
        for name in module_level_imports(path)
        if not {canonicalize_name(d) for d in providers.get(name, [name])} & brought
    }
    assert not missing, sorted(missing)
