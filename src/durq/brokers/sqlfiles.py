"""The named statements and numbered migrations of the SQL brokers, read from their package.

A broker's SQL lives in ``queries.sql`` (``-- name: x`` blocks, each running until the next
name) and ``migrations/NNNN_name.sql``; runtime code holds no SQL strings. Whole-line comments
are dropped: they may hold ``%`` and braces, which psycopg and ``str.format`` would read as
placeholders. Both SQLite and PostgreSQL load theirs through this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from durq.brokers.params import (
    GroupParams,
    TaskRewrite,
    TwinReplace,
    WorkflowParams,
    follow_up_from,
    follow_up_options,
)
from durq.brokers.views import (
    GroupInfo,
    GroupMemberInfo,
    ScheduleRecord,
    WorkflowNodeInfo,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
    next_cursor,
    parse_cursor,
)
from durq.errors import WorkflowNotFoundError
from durq.states import TaskState

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$")
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered schema change: ``0001_init.sql`` is version 1."""

    version: int
    #: The file name, ``0001_init.sql``.
    file: str
    #: The script, whole-line comments dropped.
    sql: str

    @property
    def label(self) -> str:
        """The file name without ``.sql``: ``0001_init``."""
        return self.file.removesuffix(".sql")


def strip_comments(text: str) -> str:
    """``text`` without whole-line ``--`` comments and blank lines."""
    return "\n".join(
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("--")
    )


def parse_named(text: str) -> dict[str, str]:
    """``-- name: x`` blocks to ``{"x": "SQL"}`` (comments and the final ``;`` dropped).

    ValueError for a name defined twice or a block without SQL."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _NAME.match(line.strip())
        if match:
            if match.group(1) in blocks:
                raise ValueError(f"query {match.group(1)!r} is defined twice")
            current = blocks.setdefault(match.group(1), [])
        elif current is not None:
            current.append(line)
    queries = {
        name: strip_comments("\n".join(lines)).rstrip().rstrip(";").strip()
        for name, lines in blocks.items()
    }
    empty = [name for name, sql in queries.items() if not sql]
    if empty:
        raise ValueError(f"query {empty[0]!r} has no SQL")
    return queries


def load_queries(package: str) -> dict[str, str]:
    """The named statements of ``<package>/queries.sql``."""
    return parse_named(resources.files(package).joinpath("queries.sql").read_text("utf-8"))


def load_migrations(package: str) -> tuple[Migration, ...]:
    """Every migration of ``<package>/migrations/``, in version order; ValueError unless they
    start at 0001 and no number is used twice.

    A gap is allowed: it is a number held for a migration written on another branch at the
    same time. A database is migrated by version (everything above its latest), so it must
    not be migrated past a gap that is filled later; released versions have none."""
    found = [
        Migration(int(match.group(1)), entry.name, strip_comments(entry.read_text("utf-8")))
        for entry in resources.files(package).joinpath("migrations").iterdir()
        if (match := _MIGRATION.match(entry.name))
    ]
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if not found or versions[0] != 1 or len(set(versions)) != len(versions):
        raise ValueError(
            f"{package} migrations must be numbered from 0001, each number once, found {versions}"
        )
    return tuple(found)


def group_row(p: GroupParams, now: float | None) -> dict[str, Any]:
    """The parameters of both dialects' ``insert_group`` statement."""
    return {
        "queue": p.queue,
        "id": p.id,
        "total": len(p.members),
        "now": now,
        "retention": p.retention,
        "then_task": None if p.then is None else follow_up_options(p.then),
        "then_head": None if p.then is None else p.then.payload,
        "then_tail": p.tail,
        # Its follow-up is created now, waiting; the last member's step releases it.
        "then_waiting": p.then is not None,
    }


def rewrite_params(rewrite: TaskRewrite) -> dict[str, Any]:
    """The named parameters of ``rewrite_task`` (both dialects)."""
    return {
        "queue": rewrite.queue,
        "id": rewrite.id,
        "expect": TaskState(rewrite.expect).value,
        "payload": rewrite.payload,
        "result": rewrite.result,
        "new_payload": rewrite.new_payload,
        "new_result": rewrite.new_result,
    }


def twin_params(p: TwinReplace) -> dict[str, Any]:
    """The named parameters of ``replace_twin`` (both dialects; ``now`` added by each)."""
    return {
        "queue": p.queue,
        "id": p.id,
        "key": p.key,
        "payload": p.payload,
        "delay": p.delay,
        "within": p.within,
        "priority": p.priority,
    }


def group_info(group: Mapping[str, Any], members: Iterable[Mapping[str, Any]]) -> GroupInfo:
    """A group as both SQL dialects read it: its ``groups`` row and its ``group_members``
    rows joined with the members' tasks (``task_state``), in group order."""
    then = None if group["then_task"] is None else follow_up_from(group["then_task"], b"")
    return GroupInfo(
        id=group["id"],
        queue=group["queue"],
        total=group["total"],
        finished=group["finished"],
        created_at=group["created_at"],
        finished_at=group["finished_at"],
        then_id=then.id if then else None,
        then_queue=then.queue if then else None,
        members=tuple(
            GroupMemberInfo(
                m["task_id"],
                m["queue"],
                m["type"],
                m["state"] or m["task_state"],
                m["state"] is not None,
            )
            for m in members
        ),
    )


def schedule_row(record: ScheduleRecord, now: float | None) -> dict[str, Any]:
    """The parameters of ``create_schedule`` / ``update_schedule`` for ``record``."""
    return {
        "name": record.name,
        "spec": record.spec,
        "type": record.type,
        "payload": record.payload,
        "queue": record.queue,
        "tz": record.tz,
        "overlap": record.overlap,
        "paused": record.paused,
        "version": record.version,
        "now": now,
    }


def schedule_record(row: Mapping[str, Any]) -> ScheduleRecord:
    """A ``schedules`` row as a :class:`ScheduleRecord`."""
    return ScheduleRecord(
        name=row["name"],
        spec=row["spec"],
        type=row["type"],
        payload=row["payload"],
        queue=row["queue"],
        tz=row["tz"],
        overlap=row["overlap"],
        paused=bool(row["paused"]),
        updated_at=float(row["updated_at"]),
        version=int(row["version"]),
    )


def workflow_node_rows(p: WorkflowParams) -> list[dict[str, Any]]:
    """The rows of ``insert_workflow_node`` (SQLite; PostgreSQL sends them as arrays)."""
    return [
        {
            "workflow_id": p.id,
            "position": i,
            "name": n.name,
            "queue": n.queue,
            "task_id": n.task_id,
            "type": n.type,
            "on_failure": n.on_failure,
            "after": json.dumps(list(n.after)),
        }
        for i, n in enumerate(p.nodes)
    ]


def workflow_query_params(query: WorkflowQuery) -> dict[str, Any]:
    """The parameters of both dialects' ``list_workflows``."""
    at, after_id = (None, None) if query.cursor is None else parse_cursor(query.cursor)
    return {
        "created_after": query.created_after,
        "created_before": query.created_before,
        "at": at,
        "after_id": after_id,
        "limit": query.limit,
    }


def workflow_records(
    heads: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]]
) -> list[WorkflowRecord]:
    """Records from rows of ``get_workflow``/``list_workflows`` and of ``workflow_nodes``
    (ordered by workflow, then position), in the order of ``heads``."""
    by_id: dict[str, list[WorkflowNodeInfo]] = {}
    for n in nodes:
        state = n["state"]
        by_id.setdefault(n["workflow_id"], []).append(
            WorkflowNodeInfo(
                name=n["name"],
                queue=n["queue"],
                task_id=n["task_id"],
                type=n["type"],
                on_failure=n["on_failure"],
                after=tuple(json.loads(n["after"])),
                state=None if state is None else TaskState(state),
                retried=n["retried"] or 0,
                last_error=n["last_error"],
            )
        )
    return [
        WorkflowRecord(
            h["id"], h["name"], h["created_at"], h["retention"], tuple(by_id.get(h["id"], ()))
        )
        for h in heads
    ]


def one_workflow(records: Sequence[WorkflowRecord], workflow_id: str) -> WorkflowRecord:
    """The record ``get_workflow`` read; WorkflowNotFoundError when there was none."""
    if not records:
        raise WorkflowNotFoundError(f"no workflow {workflow_id!r}")
    return records[0]


def workflow_page(records: Sequence[WorkflowRecord], query: WorkflowQuery) -> WorkflowPage:
    """The page ``list_workflows`` read, with the cursor of the next one."""
    return WorkflowPage(tuple(records), next_cursor(records, query.limit))
