"""The durable half of the task queue: the `background_tasks` table, in SQLite or PostgreSQL (`sql.py`).

This module owns the statements run against it (`schema.py` the tables; `shared.py` the leases and hosts
of a queue several hosts share). The table is the source of truth for a
task's life (queued -> running -> completed | failed); the scheduler's deques only mirror the queued rows
of the LLM types. Every call opens its own connection and keeps its transaction short, so any thread
(batch workers, free threads, the HTTP server, a CLI in another process) may call any function here.
On SQLite, WAL mode lets readers run while a writer commits; `busy_timeout` makes writers wait for each
other instead of failing with "database is locked".

Status changes that race with each other are single conditional UPDATEs (`claim_task`, `finish_task`,
`cancel_task`; a preempted attempt's way back to the queue is `preemption.requeue_preempted`), so
exactly one of "a worker starts it" and "a user cancels it" wins, and a task that a
restart already failed is never completed afterwards.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from llmswap.tasks.queue.schema import TaskDatabaseError, init_db
from llmswap.tasks.queue.sql import TaskDb, is_postgres, write_transaction
from llmswap.tasks.queue.sql import connect as sql_connect

__all__ = ["TaskDatabaseError", "init_db"]  # re-exported: callers know the queue by this module

INTERRUPTED_ERROR = "Interrupted by restart"
CANCELLED_ERROR = "cancelled"
QUEUE_FULL_ERROR = "Queue depth limit reached"
NOTIFY_CHANNEL = "llmswap_tasks"  # PostgreSQL: a task became queued (its type is the payload)

TASK_COLUMNS = (
    "id, task_type, job_id, params, status, error, result, created_at, started_at, finished_at, preemptions,"
    " host"
)


class TaskStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


ACTIVE_STATUSES = (TaskStatus.QUEUED, TaskStatus.RUNNING)
FINISHED_STATUSES = (TaskStatus.COMPLETED, TaskStatus.FAILED)


@dataclass(frozen=True)
class TaskRow:
    """One row of `background_tasks`; `params` is decoded from its JSON text, timestamps are UTC text."""

    id: int
    task_type: str
    job_id: int
    params: Any
    status: TaskStatus
    error: str | None
    result: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    preemptions: int = 0  # attempts ended by preemption, each sent back to the queue (`preemption.py`)
    host: str | None = None  # the llmswap host that claimed it last (`tasks.host`)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    def as_json(self) -> dict[str, Any]:
        """The row as the HTTP API and the CLI show it."""
        result: Any = self.result
        if isinstance(result, str):
            try:
                result = json.loads(result)
            except ValueError:
                pass
        return {
            "id": self.id,
            "type": self.task_type,
            "job_id": self.job_id,
            "status": str(self.status),
            "params": self.params,
            "result": result,
            "error": self.error,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "preemptions": self.preemptions,
            "host": self.host,
        }


def now_text() -> str:
    """UTC with microseconds, fixed width, so text order is time order (FIFO of same-second inserts)."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


@contextmanager
def connect(db: TaskDb) -> Iterator[Any]:
    """A fresh autocommit connection (`sql.connect`); a missing table says how to make it."""
    try:
        with sql_connect(db) as conn:
            yield conn
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            raise TaskDatabaseError(
                f"{db}: no background_tasks table; call llmswap.tasks.queue.db.init_db({str(db)!r}) first"
            ) from exc
        raise


def notify(conn: Any, db: TaskDb, task_type: str) -> None:
    """Wake the hosts that share a PostgreSQL queue (`shared.listen`): a `task_type` task is queued."""
    if is_postgres(db):
        conn.execute("SELECT pg_notify(?, ?)", (NOTIFY_CHANNEL, task_type))


def task_row(record: tuple[Any, ...]) -> TaskRow:
    params_text = record[3]
    return TaskRow(
        id=record[0],
        task_type=record[1],
        job_id=record[2],
        params=None if params_text is None else json.loads(params_text),
        status=TaskStatus(record[4]),
        error=record[5],
        result=record[6],
        created_at=record[7],
        started_at=record[8],
        finished_at=record[9],
        preemptions=record[10],
        host=record[11],
    )


def _params_text(task_type: str, params: Any) -> str | None:
    if params is None:
        return None
    try:
        return json.dumps(params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"params of a {task_type!r} task must be JSON-serialisable: {exc}") from exc


def _check_status(status: str) -> TaskStatus:
    try:
        return TaskStatus(status)
    except ValueError:
        allowed = ", ".join(s.value for s in TaskStatus)
        raise ValueError(f"task status {status!r} is not one of: {allowed}") from None


def insert_task(
    db_path: TaskDb, task_type: str, job_id: int, params: Any = None, *, dedupe: bool = True
) -> tuple[int, bool]:
    """Queue a task; returns (task_id, is_new).

    With `dedupe` (the default), a (task_type, job_id) that is already queued or running is not queued
    again: its id comes back with is_new=False. The check and the insert share one write transaction,
    so two processes (or hosts) submitting the same pair at once still make one row.
    """
    params_text = _params_text(task_type, params)
    with connect(db_path) as conn, write_transaction(conn):
        if dedupe:
            existing = conn.execute(
                "SELECT id FROM background_tasks WHERE task_type = ? AND job_id = ?"
                " AND status IN ('queued', 'running') ORDER BY id LIMIT 1",
                (task_type, job_id),
            ).fetchone()
            if existing is not None:
                return int(existing[0]), False
        task_id = _insert(conn, task_type, job_id, params_text)
        notify(conn, db_path, task_type)
    return task_id, True


def _insert(conn: Any, task_type: str, job_id: int, params_text: str | None) -> int:
    record = conn.execute(
        "INSERT INTO background_tasks (task_type, job_id, params, status, created_at)"
        " VALUES (?, ?, ?, 'queued', ?) RETURNING id",
        (task_type, job_id, params_text, now_text()),
    ).fetchone()
    return int(record[0])


def insert_tasks(db_path: TaskDb, tasks: list[tuple[str, int, Any]]) -> list[int]:
    """Queue many (task_type, job_id, params) at once, in one transaction (no dedupe); their ids in order."""
    texts = [(task_type, job_id, _params_text(task_type, params)) for task_type, job_id, params in tasks]
    with connect(db_path) as conn, write_transaction(conn):
        ids = [_insert(conn, task_type, job_id, params_text) for task_type, job_id, params_text in texts]
        for task_type in sorted({t for t, _, _ in texts}):
            notify(conn, db_path, task_type)
    return ids


def update_task_status(
    db_path: TaskDb, task_id: int, status: str, *, error: str | None = None, result: str | None = None
) -> None:
    """Set a task's status unconditionally; `running` stamps started_at, completed/failed finished_at."""
    new = _check_status(status)
    stamp = now_text()
    with connect(db_path) as conn:
        if new is TaskStatus.RUNNING:
            conn.execute(
                "UPDATE background_tasks SET status = ?, started_at = ?, error = ?, result = ? WHERE id = ?",
                (new.value, stamp, error, result, task_id),
            )
        elif new in FINISHED_STATUSES:
            conn.execute(
                "UPDATE background_tasks SET status = ?, finished_at = ?, error = ?, result = ? WHERE id = ?",
                (new.value, stamp, error, result, task_id),
            )
        else:
            conn.execute(
                "UPDATE background_tasks SET status = ?, error = ?, result = ?,"
                " started_at = NULL, finished_at = NULL WHERE id = ?",
                (new.value, error, result, task_id),
            )


def claim_task(db_path: TaskDb, task_id: int, host: str | None = None) -> TaskRow | None:
    """queued -> running (by `host`), atomically; the claimed row, or None when it is no longer queued.

    (Hosts sharing a PostgreSQL queue claim with a lease instead: `shared.claim`.)"""
    with connect(db_path) as conn:
        record = conn.execute(
            f"UPDATE background_tasks SET status = 'running', started_at = ?, host = ?"
            f" WHERE id = ? AND status = 'queued' RETURNING {TASK_COLUMNS}",
            (now_text(), host, task_id),
        ).fetchone()
    return None if record is None else task_row(record)


def finish_task(
    db_path: TaskDb, task_id: int, status: str, *, error: str | None = None, result: str | None = None,
    owner: str | None = None,
) -> bool:
    """running -> completed | failed; False when the row was no longer running (a restart failed it).

    With `owner` (a lease holder, `shared.py`), only while that lease holds it: a host whose lease
    expired, and whose task went back to the queue, cannot record a result."""
    new = _check_status(status)
    if new not in FINISHED_STATUSES:
        raise ValueError(f"finish_task needs 'completed' or 'failed', got {status!r}")
    lease, lease_args = (" AND lease_owner = ?", (owner,)) if owner is not None else ("", ())
    with connect(db_path) as conn:
        cursor = conn.execute(
            "UPDATE background_tasks SET status = ?, error = ?, result = ?, finished_at = ?,"
            f" lease_owner = NULL, lease_until = NULL WHERE id = ? AND status = 'running'{lease}",
            (new.value, error, result, now_text(), task_id, *lease_args),
        )
    return cursor.rowcount == 1


def release_task(db_path: TaskDb, task_id: int, owner: str | None = None) -> bool:
    """running -> queued, its attempt not counted: llmswap stopped it (a graceful stop cancelled the task in
    hand), not the task's fault. With `owner`, only under that lease. False when it was no longer running."""
    lease, lease_args = (" AND lease_owner = ?", (owner,)) if owner is not None else ("", ())
    with connect(db_path) as conn:
        record = conn.execute(
            "UPDATE background_tasks SET status = 'queued', started_at = NULL, lease_owner = NULL,"
            f" lease_until = NULL WHERE id = ? AND status = 'running'{lease} RETURNING task_type",
            (task_id, *lease_args),
        ).fetchone()
        if record is not None:
            notify(conn, db_path, record[0])
    return record is not None


def fail_unfinished_task(db_path: TaskDb, task_id: int, error: str) -> bool:
    """queued | running -> failed; False when the task had already finished (its outcome stands)."""
    with connect(db_path) as conn:
        cursor = conn.execute(
            "UPDATE background_tasks SET status = 'failed', error = ?, finished_at = ?"
            " WHERE id = ? AND status IN ('queued', 'running')",
            (error, now_text(), task_id),
        )
    return cursor.rowcount == 1


def cancel_task(db_path: TaskDb, task_id: int, *, error: str = CANCELLED_ERROR) -> bool:
    """A queued task -> failed `error` ("cancelled"); False when it is running, finished or unknown.

    On a shared queue the hosts are told, so they drop it from their lanes before asking for its model."""
    with connect(db_path) as conn:
        record = conn.execute(
            "UPDATE background_tasks SET status = 'failed', error = ?, finished_at = ?"
            " WHERE id = ? AND status = 'queued' RETURNING task_type",
            (error, now_text(), task_id),
        ).fetchone()
        if record is not None:
            notify(conn, db_path, record[0])
    return record is not None


def reset_running_tasks(db_path: TaskDb) -> int:
    """On restart: running tasks (outcome unknown) -> failed "Interrupted by restart"; queued ones stay.

    Must run before the scheduler is built, or a row left running by a crash could be run again.
    Returns how many rows were failed.
    """
    with connect(db_path) as conn:
        cursor = conn.execute(
            "UPDATE background_tasks SET status = 'failed', error = ?, finished_at = ?"
            " WHERE status = 'running'",
            (INTERRUPTED_ERROR, now_text()),
        )
    return cursor.rowcount


def get_task(db_path: TaskDb, task_id: int) -> TaskRow | None:
    with connect(db_path) as conn:
        record = conn.execute(
            f"SELECT {TASK_COLUMNS} FROM background_tasks WHERE id = ?", (task_id,)
        ).fetchone()
    return None if record is None else task_row(record)


def list_tasks(
    db_path: TaskDb, status: str | None = None, task_type: str | None = None, limit: int = 100
) -> list[TaskRow]:
    """Newest first, optionally filtered by status and type."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    clauses: list[str] = []
    args: list[Any] = []
    if status is not None:
        clauses.append("status = ?")
        args.append(_check_status(status).value)
    if task_type is not None:
        clauses.append("task_type = ?")
        args.append(task_type)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    with connect(db_path) as conn:
        records = conn.execute(
            f"SELECT {TASK_COLUMNS} FROM background_tasks{where} ORDER BY created_at DESC, id DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
    return [task_row(r) for r in records]


def queued_tasks(db_path: TaskDb, task_types: frozenset[str] | set[str]) -> list[TaskRow]:
    """Queued rows of the given types, oldest first: what a starting scheduler loads back."""
    if not task_types:
        return []
    marks = ", ".join("?" for _ in task_types)
    with connect(db_path) as conn:
        records = conn.execute(
            f"SELECT {TASK_COLUMNS} FROM background_tasks WHERE status = 'queued' AND task_type IN ({marks})"
            " ORDER BY created_at ASC, id ASC",
            tuple(sorted(task_types)),
        ).fetchall()
    return [task_row(r) for r in records]


def job_tasks(
    db_path: TaskDb, job_id: int, type_prefix: str, status: str | None = None
) -> list[TaskRow]:
    """The rows of one job whose task type starts with `type_prefix` (a batch's requests), oldest first."""
    clause, args = (" AND status = ?", (_check_status(status).value,)) if status is not None else ("", ())
    with connect(db_path) as conn:
        records = conn.execute(
            f"SELECT {TASK_COLUMNS} FROM background_tasks"
            f" WHERE job_id = ? AND substr(task_type, 1, length(?)) = ?{clause} ORDER BY id ASC",
            (job_id, type_prefix, type_prefix, *args),
        ).fetchall()
    return [task_row(r) for r in records]


def task_stats(db_path: TaskDb) -> Mapping[str, Mapping[str, int]]:
    """task type -> status -> count, every status present (0 when none)."""
    with connect(db_path) as conn:
        records = conn.execute(
            "SELECT task_type, status, COUNT(*) FROM background_tasks GROUP BY task_type, status"
        ).fetchall()
    stats: dict[str, dict[str, int]] = {}
    for task_type, status, count in records:
        per_type = stats.setdefault(task_type, {s.value: 0 for s in TaskStatus})
        per_type[status] = count
    return stats
