"""Side-by-side benchmark of durq and its Python peers on this machine (``make bench``).

Every peer gets its own virtual environment under ``benchmarks/.venv-peers/<name>`` with the
library from PyPI (their pins conflict: arq wants redis<6, taskiq-redis and celery want newer).
A peer that fails to install is skipped and the reason shown in the table. Every system,
durq included, runs through the same driver code (``peers/_common.py``; durq's driver is
``peers/bench_durq.py`` and runs in durq's own ``.venv``), one after another in this run:

* N no-op tasks enqueued by one producer one by one, by 50 concurrent callers, and (where
  offered) in bulk;
* the same N drained by the system's worker command as its docs tell users to run it (durq:
  ``durq worker APP`` with the README's defaults, and separately ``--processes auto``),
  launched as a subprocess; the clock starts at the launch and stops at the N-th handler
  completion (handlers append one byte to a file);
* M probes at a fixed rate into the idle worker: pickup latency enqueue -> handler start.

``--enqueue-only`` stops after the enqueue figures (no worker started, one durq row per broker,
``docs/benchmarks.md`` left alone).

``durq bench`` is a different tool: a quick in-process measurement of durq alone.

Medians over ``--repeats`` runs go to ``benchmarks/results/<timestamp>.md`` (with ratios
durq / fastest peer per broker), ``.json`` and a ``.png`` plot; the section between the
markers in ``docs/benchmarks.md`` is replaced with the latest table.

Redis peers use database 5 of 127.0.0.1:6379 (flushed before and after each run); PostgreSQL
peers use the database ``durq_bench`` (dropped and created again per peer, dropped at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = HERE / ".venv-peers"
RESULTS = HERE / "results"
DOC = ROOT / "docs" / "benchmarks.md"
DURQ_PY = ROOT / ".venv" / "bin" / "python"

REDIS_URL = "redis://127.0.0.1:6379/5"
PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_DB = "durq_bench"
PG_DSN = f"postgresql://postgres@127.0.0.1:5432/{PG_DB}"

#: name -> (virtual environment, pip requirements, driver module, broker)
PEERS: dict[str, tuple[str, list[str], str, str]] = {
    "huey": ("huey", ["huey", "redis"], "bench_huey", "redis"),
    "dramatiq": ("dramatiq", ["dramatiq[redis]"], "bench_dramatiq", "redis"),
    "taskiq": ("taskiq", ["taskiq", "taskiq-redis"], "bench_taskiq", "redis"),
    "saq": ("saq", ["saq[postgres]", "psycopg[binary,pool]"], "bench_saq", "redis"),
    "celery": ("celery", ["celery[redis]"], "bench_celery", "redis"),
    "streaq": ("streaq", ["streaq"], "bench_streaq", "redis"),
    "arq": ("arq", ["arq"], "bench_arq", "redis"),
    "rq": ("rq", ["rq"], "bench_rq", "redis"),
    "pgqueuer": (
        "pgqueuer",
        ["pgqueuer[asyncpg]", "psycopg[binary]"],
        "bench_pgqueuer",
        "postgresql",
    ),
    "saq-pg": ("saq", ["saq[postgres]", "psycopg[binary,pool]"], "bench_saq_pg", "postgresql"),
    "procrastinate": (
        "procrastinate",
        ["procrastinate", "psycopg[binary]"],
        "bench_procrastinate",
        "postgresql",
    ),
    "chancy": ("chancy", ["chancy", "psycopg[binary,pool]"], "bench_chancy", "postgresql"),
}
#: Every peer venv also gets what the shared driver code needs.
COMMON_REQUIREMENTS = ["redis", "psycopg[binary]"]
PLOT_VENV = "plot"

#: durq rows: the README's worker command, and the same with the flag the docs recommend for
#: throughput (labelled as such in the table).
DURQ_VARIANTS = {"durq": "", "durq --processes auto": "--processes auto"}


def log(message: str) -> None:
    sys.stderr.write(f"[bench] {message}\n")
    sys.stderr.flush()


# -- environments ---------------------------------------------------------------------------


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def ensure_venv(name: str, requirements: list[str], *, upgrade: bool = False) -> str | None:
    """Create the venv and install; ``None`` when ready, else the reason it failed."""
    stamp = VENVS / name / ".installed"
    wanted = " ".join(sorted(requirements))
    if stamp.exists() and stamp.read_text() == wanted and not upgrade:
        return None
    if not venv_python(name).exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENVS / name)], check=True)
    log(f"installing {wanted} into .venv-peers/{name}")
    proc = subprocess.run(
        [
            str(venv_python(name)),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *requirements,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "ERROR" in ln] or proc.stderr.splitlines()
        return "install failed: " + (lines[-1] if lines else f"pip exit {proc.returncode}")
    stamp.write_text(wanted)
    return None


# -- shared servers -------------------------------------------------------------------------


def reset_redis() -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.flushdb()  # database 5 only: others' keys live in other databases
    finally:
        client.close()


def recreate_pg_database(drop_only: bool = False, name: str = PG_DB) -> None:
    """Drop the benchmark database ``name`` and (unless ``drop_only``) create it empty."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        if not drop_only:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def reset_for(broker: str) -> None:
    if broker == "redis":
        reset_redis()
    elif broker == "postgresql":
        recreate_pg_database()


# -- one run --------------------------------------------------------------------------------


def run_json(
    cmd: list[str], timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(" | ".join(tail) or f"exit {proc.returncode}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        return dict(json.loads(proc.stdout))
    except ValueError:
        return dict(json.loads(lines[-1]))


def driver_args(args: argparse.Namespace) -> list[str]:
    return [
        "--tasks",
        str(args.tasks),
        "--latency-tasks",
        str(args.latency_tasks),
        "--latency-rate",
        str(args.latency_rate),
        "--bulk-chunk",
        str(args.bulk_chunk),
        "--concurrency",
        str(args.concurrency),
        *(["--enqueue-only"] if args.enqueue_only else []),
    ]


def signal_env(**extra: str) -> dict[str, str]:
    """A private directory for the handlers' completion files, per run."""
    directory = tempfile.mkdtemp(prefix="durq-bench-")
    return {**os.environ, "BENCH_SIGNAL_DIR": directory, **extra}


def run_durq(system: str, broker: str, args: argparse.Namespace) -> dict[str, Any]:
    """The shipped ``durq worker`` command, driven like every peer (``peers/bench_durq.py``)."""
    env = signal_env(BENCH_DURQ_BROKER=broker, BENCH_DURQ_WORKER_ARGS=DURQ_VARIANTS[system])
    cmd = [str(DURQ_PY), str(HERE / "peers" / "_common.py"), "bench_durq", *driver_args(args)]
    try:
        result = run_json(cmd, timeout=args.timeout, cwd=HERE / "peers", env=env)
    finally:
        shutil.rmtree(env["BENCH_SIGNAL_DIR"], ignore_errors=True)
    result["system"] = system
    return result


def run_peer(name: str, args: argparse.Namespace) -> dict[str, Any]:
    venv, _, module, _ = PEERS[name]
    cmd = [str(venv_python(venv)), str(HERE / "peers" / "_common.py"), module, *driver_args(args)]
    env = signal_env()
    try:
        return run_json(cmd, timeout=args.timeout, cwd=HERE / "peers", env=env)
    finally:
        shutil.rmtree(env["BENCH_SIGNAL_DIR"], ignore_errors=True)


# -- aggregation and output -----------------------------------------------------------------

NUMERIC = (
    "enqueue_per_s",
    "enqueue_concurrent_per_s",
    "enqueue_bulk_per_s",
    "process_per_s",
    "process_from_first_per_s",
    "worker_cpu_s",
)
#: The figures held against the fastest peer of the same broker, with their column titles.
COMPARED = (
    ("enqueue_per_s", "enqueue one-by-one"),
    ("enqueue_concurrent_per_s", "enqueue, 50 callers"),
    ("enqueue_bulk_per_s", "enqueue bulk"),
    ("process_per_s", "process"),
)


def is_durq(row: dict[str, Any]) -> bool:
    return str(row["system"]).startswith("durq")


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(runs[0])
    for key in NUMERIC:
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = round(statistics.median(values), 1) if values else None
    lat = [r["latency_ms"] for r in runs if r.get("latency_ms")]
    if lat:
        out["latency_ms"] = {
            k: round(statistics.median(x[k] for x in lat), 3) for k in ("p50", "p95", "p99")
        }
    out["runs"] = len(runs)
    return out


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def fmt_lat(row: dict[str, Any]) -> str:
    lat = row.get("latency_ms")
    if not lat:
        return "—"
    return f"{lat['p50']:.1f} / {lat['p95']:.1f} / {lat['p99']:.1f}"


def ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "—"
    return f"{ours / theirs:.2f}x"


def table(results: list[dict[str, Any]], failures: dict[str, str]) -> str:
    lines = [
        "| system (broker) | enqueue one-by-one /s | enqueue, 50 callers /s | enqueue bulk /s | "
        "process /s | process /s from 1st | pickup p50 / p95 / p99 ms | worker layout |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    ratios = []
    for broker in ("sqlite", "redis", "postgresql"):
        rows = [r for r in results if r["broker"] == broker]
        rows.sort(key=lambda r: -(r.get("process_per_s") or 0))
        for r in rows:
            name = f"**{r['system']}**" if is_durq(r) else r["system"]
            lines.append(
                f"| {name} ({broker}) | {fmt(r.get('enqueue_per_s'))} | "
                f"{fmt(r.get('enqueue_concurrent_per_s'))} | "
                f"{fmt(r.get('enqueue_bulk_per_s'))} | {fmt(r.get('process_per_s'))} | "
                f"{fmt(r.get('process_from_first_per_s'))} | "
                f"{fmt_lat(r)} | {r.get('layout', '')} |"
            )
        peers = [r for r in results if r["broker"] == broker and not is_durq(r)]
        for ours in (r for r in rows if is_durq(r)):
            if not peers:
                continue

            def best(key: str, peers: list[dict[str, Any]] = peers) -> dict[str, Any] | None:
                have = [p for p in peers if p.get(key)]
                return max(have, key=lambda p: p[key]) if have else None

            cells = []
            for key, _ in COMPARED:
                top = best(key)
                cells.append(f"{ratio(ours.get(key), top[key])} vs {top['system']}" if top else "—")
            lat_peers = [p for p in peers if p.get("latency_ms")]
            if lat_peers and ours.get("latency_ms"):
                top = min(lat_peers, key=lambda p: p["latency_ms"]["p99"])
                cells.append(
                    f"p99 {ours['latency_ms']['p99']:.1f} vs {top['latency_ms']['p99']:.1f} ms "
                    f"({top['system']})"
                )
            else:
                cells.append("—")
            ratios.append(f"| {ours['system']} ({broker}) | " + " | ".join(cells) + " |")
    out = "\n".join(lines)
    if ratios:
        titles = " | ".join(title for _, title in COMPARED)
        out += (
            f"\n\n| durq ÷ fastest peer | {titles} | pickup latency |\n"
            + "|---" * (len(COMPARED) + 2)
            + "|\n"
            + "\n".join(ratios)
        )
    if failures:
        out += "\n\nNot measured:\n\n" + "\n".join(
            f"- **{name}**: {reason}" for name, reason in sorted(failures.items())
        )
    return out


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, {platform.system()} {platform.release()}"


def server_versions() -> str:
    parts = []
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        parts.append(f"Redis {client.info('server')['redis_version']}")
        client.close()
    except Exception as exc:  # a missing server is reported, not fatal
        parts.append(f"Redis unavailable ({exc})")
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_DSN) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            parts.append(f"PostgreSQL {row[0].split()[0] if row else '?'}")
    except Exception as exc:
        parts.append(f"PostgreSQL unavailable ({exc})")
    return ", ".join(parts)


def update_doc(markdown: str) -> None:
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    if not DOC.exists():
        return
    text = DOC.read_text()
    if start not in text or end not in text:
        return
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    DOC.write_text(f"{head}{start}\n{markdown}\n{end}{tail}")


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tasks", type=int, default=None, help="default 20,000 (2,000 with --quick)"
    )
    parser.add_argument(
        "--latency-tasks", type=int, default=None, help="default 1,000 (300 with --quick)"
    )
    parser.add_argument("--latency-rate", type=float, default=100.0)
    parser.add_argument("--bulk-chunk", type=int, default=1_000)
    parser.add_argument(
        "--concurrency", type=int, default=100, help="passed to the drivers (informational)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument(
        "--quick", action="store_true", help="2,000 tasks, 300 latency probes, 1 repeat"
    )
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated peer names")
    parser.add_argument("--brokers", default="sqlite,redis,postgresql")
    parser.add_argument("--no-durq", action="store_true")
    parser.add_argument(
        "--enqueue-only",
        action="store_true",
        help="only the enqueue figures (one-by-one, 50 callers, bulk): no worker is started",
    )
    parser.add_argument("--upgrade", action="store_true", help="reinstall the peers")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md alone")
    args = parser.parse_args()
    quick = {"tasks": 2_000, "latency_tasks": 300, "repeats": 1}
    full = {"tasks": 20_000, "latency_tasks": 1_000, "repeats": 3}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    brokers = [b for b in args.brokers.split(",") if b]
    wanted = [p for p in args.peers.split(",") if p and PEERS[p][3] in brokers]

    VENVS.mkdir(exist_ok=True)
    RESULTS.mkdir(exist_ok=True)
    failures: dict[str, str] = {}
    ready: list[str] = []
    for name in wanted:
        venv, requirements, module, _ = PEERS[name]
        if not (HERE / "peers" / f"{module}.py").exists():
            failures[name] = "no driver script yet"
            continue
        reason = ensure_venv(venv, [*requirements, *COMMON_REQUIREMENTS], upgrade=args.upgrade)
        if reason:
            failures[name] = reason
        else:
            ready.append(name)

    systems: list[tuple[str, str]] = []  # (system, broker)
    # The enqueue figures do not depend on the worker command: one durq row per broker.
    variants = ["durq"] if args.enqueue_only else list(DURQ_VARIANTS)
    if not args.no_durq:
        systems += [(variant, b) for b in brokers for variant in variants]
    systems += [(p, PEERS[p][3]) for p in ready]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {s: [] for s in systems}
    for repeat in range(args.repeats):
        for system, broker in systems:
            log(f"run {repeat + 1}/{args.repeats}: {system} ({broker})")
            try:
                reset_for(broker)
                started = time.monotonic()
                if system in DURQ_VARIANTS:
                    result = run_durq(system, broker, args)
                else:
                    result = run_peer(system, args)
                result["broker"] = broker
                runs[(system, broker)].append(result)
                figures = (
                    f"enqueue {result.get('enqueue_per_s')}/s, 50 callers "
                    f"{result.get('enqueue_concurrent_per_s')}/s, bulk "
                    f"{result.get('enqueue_bulk_per_s')}/s"
                    if args.enqueue_only
                    else f"process {result.get('process_per_s')}/s"
                )
                log(f"  {figures} in {time.monotonic() - started:.0f}s")
            except Exception as exc:
                log(f"  failed: {exc}")
                failures[f"{system} ({broker})"] = f"run failed: {exc}"[:300]
            finally:
                try:
                    reset_for(broker)
                except Exception as exc:
                    log(f"  cleanup of {broker} failed: {exc}")
    if "postgresql" in brokers:
        try:
            recreate_pg_database(drop_only=True)
        except Exception as exc:
            log(f"could not drop database {PG_DB}: {exc}")

    results = [median_of(r) for r in runs.values() if r]
    for key in list(failures):  # a run that failed once but succeeded in another repeat
        if any(f"{r['system']} ({r['broker']})" == key for r in results):
            del failures[key]
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    command = (
        "make bench" if not sys.argv[1:] else "python benchmarks/run.py " + " ".join(sys.argv[1:])
    )
    summary = {
        "timestamp": stamp,
        "command": command,
        "machine_line": machine_line(),
        "servers": server_versions(),
        "tasks": args.tasks,
        "latency_tasks": args.latency_tasks,
        "latency_rate": args.latency_rate,
        "repeats": args.repeats,
        "results": results,
        "failures": failures,
    }
    json_path = RESULTS / f"{stamp}.json"
    json_path.write_text(json.dumps(summary, indent=2))
    png_path = RESULTS / f"{stamp}.png"
    plot_error = ensure_venv(PLOT_VENV, ["matplotlib"])
    if plot_error is None:
        proc = subprocess.run(
            [str(venv_python(PLOT_VENV)), str(HERE / "plot.py"), str(json_path), str(png_path)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            log(f"plot failed: {proc.stderr.strip().splitlines()[-1:]}")
    else:
        log(f"no plot: {plot_error}")
    markdown = (
        f"Run {stamp} (UTC) · `{command}` · {args.tasks:,} no-op tasks, "
        + (
            "enqueue figures only · "
            if args.enqueue_only
            else f"{args.latency_tasks:,} latency probes at {args.latency_rate:g}/s · "
        )
        + f"median of {args.repeats} · machine: {summary['machine_line']} · {summary['servers']}\n\n"
        + table(results, failures)
    )
    md_path = RESULTS / f"{stamp}.md"
    md_path.write_text(f"# Benchmark {stamp}\n\n{markdown}\n\n![throughput]({png_path.name})\n")
    if not args.no_doc and not args.enqueue_only:  # the doc's table has every column
        update_doc(markdown)
    print(markdown)
    log(f"wrote {md_path.relative_to(ROOT)} and {png_path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
