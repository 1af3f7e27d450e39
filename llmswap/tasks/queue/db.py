"""The durable half of the task queue: the `background_tasks` table in SQLite.

This module owns the schema and every statement run against it. The table is the source of truth for a
task's life (queued -> running -> completed | failed); the scheduler's deques only mirror the queued rows
of the LLM types. Every call opens its own connection and keeps its transaction short, so any thread
(batch workers, free threads, the HTTP server, a CLI in another process) may call any function here.
WAL mode lets readers run while a writer commits; `busy_timeout` makes writers wait for each other
instead of failing with "database is locked".

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
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_MS = 10_000
INTERRUPTED_ERROR = "Interrupted by restart"
CANCELLED_ERROR = "cancelled"
QUEUE_FULL_ERROR = "Queue depth limit reached"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS background_tasks (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_type   TEXT    NOT NULL,
    job_id      INTEGER NOT NULL DEFAULT 0,
    params      TEXT,
    status      TEXT    NOT NULL DEFAULT 'queued',
    error       TEXT,
    result      TEXT,
    created_at  TEXT    NOT NULL,
    started_at  TEXT,
    finished_at TEXT,
    preemptions INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idx_background_tasks_status_type ON background_tasks (status, task_type);
"""

_COLUMNS = (
    "id, task_type, job_id, params, status, error, result, created_at, started_at, finished_at, preemptions"
)


class TaskStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


ACTIVE_STATUSES = (TaskStatus.QUEUED, TaskStatus.RUNNING)
FINISHED_STATUSES = (TaskStatus.COMPLETED, TaskStatus.FAILED)


class TaskDatabaseError(RuntimeError):
    """The database file cannot serve the task queue (missing table, unreadable file)."""


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

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


def now_text() -> str:
    """UTC with microseconds, fixed width, so text order is time order (FIFO of same-second inserts)."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


@contextmanager
def connect(db_path: Path | str) -> Iterator[sqlite3.Connection]:
    """A fresh autocommit connection (transactions are explicit `BEGIN`s), closed on exit."""
    # isolation_level=None: the sqlite3 module must not open transactions behind our back, or
    # `BEGIN IMMEDIATE` in insert_task would fail with "cannot start a transaction within a transaction".
    conn = sqlite3.connect(str(db_path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # In WAL mode NORMAL still survives a killed process (kill -9 loses nothing committed); only a
        # power cut may drop the last commits. It spares an fsync per status change.
        conn.execute("PRAGMA synchronous = NORMAL")
        yield conn
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            raise TaskDatabaseError(
                f"{db_path}: no background_tasks table; "
                f"call llmswap.tasks.queue.db.init_db({str(db_path)!r}) first"
            ) from exc
        raise
    finally:
        conn.close()


def init_db(db_path: Path | str) -> None:
    """Create the table and its index if missing and switch the file to WAL mode. Idempotent."""
    path = Path(db_path)
    if not path.parent.is_dir():
        raise TaskDatabaseError(
            f"{db_path}: directory {path.parent} does not exist; create it or pick another path"
        )
    with connect(path) as conn:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise TaskDatabaseError(
                f"{db_path}: SQLite refused WAL mode (got {mode!r}); put the database on a local disk"
            )
        conn.executescript(_SCHEMA)
        _add_preemptions_column(conn)


def _add_preemptions_column(conn: sqlite3.Connection) -> None:
    """Migrate a database made before attempts could be preempted: its rows start at 0."""
    if "preemptions" in {row[1] for row in conn.execute("PRAGMA table_info(background_tasks)")}:
        return
    try:
        conn.execute("ALTER TABLE background_tasks ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0")
    except sqlite3.OperationalError as exc:
        if "duplicate column" not in str(exc):  # another process migrated it first
            raise


def _row(record: tuple[Any, ...]) -> TaskRow:
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
    db_path: Path | str, task_type: str, job_id: int, params: Any = None, *, dedupe: bool = True
) -> tuple[int, bool]:
    """Queue a task; returns (task_id, is_new).

    With `dedupe` (the default), a (task_type, job_id) that is already queued or running is not queued
    again: its id comes back with is_new=False. The check and the insert share one write transaction,
    so two processes submitting the same pair at once still make one row.
    """
    params_text = _params_text(task_type, params)
    with connect(db_path) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if dedupe:
                existing = conn.execute(
                    "SELECT id FROM background_tasks WHERE task_type = ? AND job_id = ?"
                    " AND status IN ('queued', 'running') ORDER BY id LIMIT 1",
                    (task_type, job_id),
                ).fetchone()
                if existing is not None:
                    conn.execute("COMMIT")
                    return existing[0], False
            cursor = conn.execute(
                "INSERT INTO background_tasks (task_type, job_id, params, status, created_at)"
                " VALUES (?, ?, ?, 'queued', ?)",
                (task_type, job_id, params_text, now_text()),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        assert cursor.lastrowid is not None
        return cursor.lastrowid, True


def insert_tasks(db_path: Path | str, tasks: list[tuple[str, int, Any]]) -> list[int]:
    """Queue many (task_type, job_id, params) at once, in one transaction (no dedupe); their ids in order."""
    texts = [(task_type, job_id, _params_text(task_type, params)) for task_type, job_id, params in tasks]
    ids: list[int] = []
    with connect(db_path) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for task_type, job_id, params_text in texts:
                cursor = conn.execute(
                    "INSERT INTO background_tasks (task_type, job_id, params, status, created_at)"
                    " VALUES (?, ?, ?, 'queued', ?)",
                    (task_type, job_id, params_text, now_text()),
                )
                assert cursor.lastrowid is not None
                ids.append(cursor.lastrowid)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return ids


def update_task_status(
    db_path: Path | str, task_id: int, status: str, *, error: str | None = None, result: str | None = None
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


def claim_task(db_path: Path | str, task_id: int) -> TaskRow | None:
    """queued -> running, atomically; the claimed row, or None when the task is no longer queued."""
    with connect(db_path) as conn:
        record = conn.execute(
            f"UPDATE background_tasks SET status = 'running', started_at = ?"
            f" WHERE id = ? AND status = 'queued' RETURNING {_COLUMNS}",
            (now_text(), task_id),
        ).fetchone()
    return None if record is None else _row(record)


def finish_task(
    db_path: Path | str, task_id: int, status: str, *, error: str | None = None, result: str | None = None
) -> bool:
    """running -> completed | failed; False when the row was no longer running (a restart failed it)."""
    new = _check_status(status)
    if new not in FINISHED_STATUSES:
        raise ValueError(f"finish_task needs 'completed' or 'failed', got {status!r}")
    with connect(db_path) as conn:
        cursor = conn.execute(
            "UPDATE background_tasks SET status = ?, error = ?, result = ?, finished_at = ?"
            " WHERE id = ? AND status = 'running'",
            (new.value, error, result, now_text(), task_id),
        )
    return cursor.rowcount == 1


def fail_unfinished_task(db_path: Path | str, task_id: int, error: str) -> bool:
    """queued | running -> failed; False when the task had already finished (its outcome stands)."""
    with connect(db_path) as conn:
        cursor = conn.execute(
            "UPDATE background_tasks SET status = 'failed', error = ?, finished_at = ?"
            " WHERE id = ? AND status IN ('queued', 'running')",
            (error, now_text(), task_id),
        )
    return cursor.rowcount == 1


def cancel_task(db_path: Path | str, task_id: int, *, error: str = CANCELLED_ERROR) -> bool:
    """A queued task -> failed `error` ("cancelled"); False when it is running, finished or unknown."""
    with connect(db_path) as conn:
        cursor = conn.execute(
            "UPDATE background_tasks SET status = 'failed', error = ?, finished_at = ?"
            " WHERE id = ? AND status = 'queued'",
            (error, now_text(), task_id),
        )
    return cursor.rowcount == 1


def reset_running_tasks(db_path: Path | str) -> int:
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


def get_task(db_path: Path | str, task_id: int) -> TaskRow | None:
    with connect(db_path) as conn:
        record = conn.execute(f"SELECT {_COLUMNS} FROM background_tasks WHERE id = ?", (task_id,)).fetchone()
    return None if record is None else _row(record)


def list_tasks(
    db_path: Path | str, status: str | None = None, task_type: str | None = None, limit: int = 100
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
            f"SELECT {_COLUMNS} FROM background_tasks{where} ORDER BY created_at DESC, id DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
    return [_row(r) for r in records]


def queued_tasks(db_path: Path | str, task_types: frozenset[str] | set[str]) -> list[TaskRow]:
    """Queued rows of the given types, oldest first: what a starting scheduler loads back."""
    if not task_types:
        return []
    marks = ", ".join("?" for _ in task_types)
    with connect(db_path) as conn:
        records = conn.execute(
            f"SELECT {_COLUMNS} FROM background_tasks WHERE status = 'queued' AND task_type IN ({marks})"
            " ORDER BY created_at ASC, id ASC",
            tuple(sorted(task_types)),
        ).fetchall()
    return [_row(r) for r in records]


def job_tasks(
    db_path: Path | str, job_id: int, type_prefix: str, status: str | None = None
) -> list[TaskRow]:
    """The rows of one job whose task type starts with `type_prefix` (a batch's requests), oldest first."""
    clause, args = (" AND status = ?", (_check_status(status).value,)) if status is not None else ("", ())
    with connect(db_path) as conn:
        records = conn.execute(
            f"SELECT {_COLUMNS} FROM background_tasks"
            f" WHERE job_id = ? AND substr(task_type, 1, ?) = ?{clause} ORDER BY id ASC",
            (job_id, len(type_prefix), type_prefix, *args),
        ).fetchall()
    return [_row(r) for r in records]


def task_stats(db_path: Path | str) -> Mapping[str, Mapping[str, int]]:
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
