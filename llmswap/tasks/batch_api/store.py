"""The durable half of the OpenAI Batch API: uploaded files and batches, in the task queue's database.

A batch's requests are ordinary `background_tasks` rows (see `batches.py`): task type `batch:<model>`,
`job_id` the batch's row id. This module owns the statements on the two tables beside them (`schema.py` makes
them) — `batch_files` (uploads and the output/error files llmswap writes, content kept as a BLOB) and
`batches` (one row per batch: the OpenAI object's fields) — and the query that counts a batch's rows by
outcome. Like `db.py`, every call opens its own short-lived connection, so worker threads, the poll loop and
HTTP handlers may all call it.

Ownership: with `apiKeys`, a file or batch belongs to the key that created it (`owner`, the key's name) and
the lookups given an owner see only that owner's rows plus unowned ones (made without keys, or before rows had
owners): another key's rows look as if they did not exist. `owner=None` means no scoping.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmswap.tasks.queue.db import connect, init_db
from llmswap.tasks.queue.sql import TaskDb, is_postgres

BATCH_TYPE_PREFIX = "batch:"

# Statuses after which a batch never changes again.
FINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
_TIMESTAMPS = ("expires_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
               "cancelling_at", "cancelled_at")


def init_batch_tables(db_path: TaskDb) -> None:
    """Make the files and batches tables: they come with the queue's (`schema.init_db`)."""
    init_db(db_path)


def _scope(owner: str | None) -> tuple[str, tuple[str, ...]]:
    """The WHERE condition (to AND in) that limits rows to what `owner` may see, and its argument."""
    if owner is None:
        return "", ()
    return " AND (owner IS NULL OR owner = ?)", (owner,)


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def now_seconds() -> int:
    return int(time.time())


# ---------------------------------------------------------------------------------------------- files


@dataclass(frozen=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    owner: str | None = None  # the API key's name that uploaded it (or whose batch wrote it)

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed"}


_FILE_COLUMNS = "id, filename, purpose, bytes, created_at, owner"


def add_file(
    db_path: TaskDb, filename: str, purpose: str, content: bytes, owner: str | None = None
) -> StoredFile:
    stored = StoredFile(new_id("file-"), filename, purpose, len(content), now_seconds(), owner)
    with connect(db_path) as conn:
        conn.execute(
            "INSERT INTO batch_files (id, filename, purpose, bytes, created_at, content, owner)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (stored.id, filename, purpose, stored.bytes, stored.created_at, content, owner),
        )
    return stored


def get_file(db_path: TaskDb, file_id: str, owner: str | None = None) -> StoredFile | None:
    scope, args = _scope(owner)
    with connect(db_path) as conn:
        record = conn.execute(
            f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE id = ?{scope}", (file_id, *args)
        ).fetchone()
    return None if record is None else StoredFile(*record)


def file_content(db_path: TaskDb, file_id: str, owner: str | None = None) -> bytes | None:
    scope, args = _scope(owner)
    with connect(db_path) as conn:
        record = conn.execute(
            f"SELECT content FROM batch_files WHERE id = ?{scope}", (file_id, *args)
        ).fetchone()
    return None if record is None else bytes(record[0])


def list_files(
    db_path: TaskDb, purpose: str | None = None, limit: int = 100, owner: str | None = None
) -> list[StoredFile]:
    where, args = ("WHERE purpose = ?", (purpose,)) if purpose else ("WHERE TRUE", ())
    scope, scope_args = _scope(owner)
    with connect(db_path) as conn:
        records = conn.execute(
            f"SELECT {_FILE_COLUMNS} FROM batch_files {where}{scope}"
            " ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (*args, *scope_args, limit),
        ).fetchall()
    return [StoredFile(*r) for r in records]


def delete_file(db_path: TaskDb, file_id: str, owner: str | None = None) -> bool:
    scope, args = _scope(owner)
    with connect(db_path) as conn:
        cursor = conn.execute(f"DELETE FROM batch_files WHERE id = ?{scope}", (file_id, *args))
    return cursor.rowcount == 1


# ---------------------------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class RequestCounts:
    total: int
    completed: int  # answered with a 2xx
    failed: int  # answered with an error status, not reached, cancelled or interrupted
    pending: int  # queued or running

    def as_openai(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed}


@dataclass(frozen=True)
class StoredBatch:
    seq: int  # the integer key the batch's task rows carry as their job_id
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    times: Mapping[str, int | None]  # expires_at, in_progress_at ... cancelled_at
    output_file_id: str | None
    error_file_id: str | None
    errors: Any
    metadata: Any
    total: int
    owner: str | None = None  # the API key's name that created it; its output files get the same

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    def as_openai(self, counts: RequestCounts) -> dict[str, Any]:
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": self.errors,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, **self.times, "request_counts": counts.as_openai(),
            "metadata": self.metadata,
        }


_BATCH_COLUMNS = ("seq, id, endpoint, input_file_id, completion_window, status, created_at, "
                  + ", ".join(_TIMESTAMPS)
                  + ", output_file_id, error_file_id, errors, metadata, total, owner")


def _batch(record: tuple[Any, ...]) -> StoredBatch:
    seq, batch_id, endpoint, input_file_id, window, status, created_at = record[:7]
    times = dict(zip(_TIMESTAMPS, record[7:7 + len(_TIMESTAMPS)], strict=True))
    output_file_id, error_file_id, errors, metadata, total, owner = record[7 + len(_TIMESTAMPS):]
    return StoredBatch(
        seq, batch_id, endpoint, input_file_id, window, status, created_at, times, output_file_id,
        error_file_id, None if errors is None else json.loads(errors),
        None if metadata is None else json.loads(metadata), total, owner,
    )


def add_batch(
    db_path: TaskDb, *, endpoint: str, input_file_id: str, completion_window: str, expires_at: int,
    metadata: Any, total: int, status: str, errors: Any = None, owner: str | None = None,
) -> StoredBatch:
    created = now_seconds()
    stamp = {"in_progress_at": created} if status == "in_progress" else {"failed_at": created}
    with connect(db_path) as conn:
        record = conn.execute(
            "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, created_at,"
            " expires_at, in_progress_at, failed_at, errors, metadata, total, owner)"
            f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {_BATCH_COLUMNS}",
            (new_id("batch_"), endpoint, input_file_id, completion_window, status, created, expires_at,
             stamp.get("in_progress_at"), stamp.get("failed_at"), _json_or_none(errors),
             _json_or_none(metadata), total, owner),
        ).fetchone()
    return _batch(record)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def get_batch(db_path: TaskDb, batch_id: str, owner: str | None = None) -> StoredBatch | None:
    scope, args = _scope(owner)
    with connect(db_path) as conn:
        record = conn.execute(
            f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ?{scope}", (batch_id, *args)
        ).fetchone()
    return None if record is None else _batch(record)


def list_batches(
    db_path: TaskDb, *, after: str | None = None, limit: int = 20, owner: str | None = None
) -> list[StoredBatch]:
    """Newest first; `after` is the id of the last batch of the previous page."""
    scope, args = _scope(owner)
    with connect(db_path) as conn:
        if after:
            records = conn.execute(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE seq < (SELECT seq FROM batches WHERE id = ?)"
                f"{scope} ORDER BY seq DESC LIMIT ?", (after, *args, limit),
            ).fetchall()
        else:
            records = conn.execute(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE TRUE{scope} ORDER BY seq DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
    return [_batch(r) for r in records]


def unfinished_batches(db_path: TaskDb) -> list[StoredBatch]:
    with connect(db_path) as conn:
        records = conn.execute(
            f"SELECT {_BATCH_COLUMNS} FROM batches"
            " WHERE status IN ('in_progress', 'finalizing', 'cancelling') ORDER BY seq"
        ).fetchall()
    return [_batch(r) for r in records]


def set_batch_status(
    db_path: TaskDb, batch_id: str, status: str, *, expect: tuple[str, ...],
    output_file_id: str | None = None, error_file_id: str | None = None,
) -> bool:
    """Move a batch to `status` (stamping `<status>_at`) only from one of `expect`; False otherwise."""
    stamp_column = f"{status}_at"
    if stamp_column not in _TIMESTAMPS:
        raise ValueError(f"no timestamp for batch status {status!r}")
    marks = ", ".join("?" for _ in expect)
    with connect(db_path) as conn:
        cursor = conn.execute(
            f"UPDATE batches SET status = ?, {stamp_column} = ?,"
            " output_file_id = COALESCE(?, output_file_id), error_file_id = COALESCE(?, error_file_id)"
            f" WHERE id = ? AND status IN ({marks})",
            (status, now_seconds(), output_file_id, error_file_id, batch_id, *expect),
        )
    return cursor.rowcount == 1


def request_counts(db_path: TaskDb, seq: int, total: int) -> RequestCounts:
    """The batch's task rows by outcome: a completed row whose recorded status code is an error counts
    as failed, as OpenAI counts it."""
    code = ("CAST(CAST(result AS jsonb) ->> 'status_code' AS INTEGER)" if is_postgres(db_path)
            else "json_extract(result, '$.status_code')")
    with connect(db_path) as conn:
        completed, failed, pending = conn.execute(
            "SELECT"
            f" COALESCE(SUM(CASE WHEN status = 'completed' AND {code} < 400 THEN 1 ELSE 0 END), 0),"
            " COALESCE(SUM(CASE WHEN status = 'failed' OR (status = 'completed'"
            f"   AND {code} >= 400) THEN 1 ELSE 0 END), 0),"
            " COALESCE(SUM(CASE WHEN status IN ('queued', 'running') THEN 1 ELSE 0 END), 0)"
            " FROM background_tasks WHERE job_id = ? AND substr(task_type, 1, length(?)) = ?",
            (seq, BATCH_TYPE_PREFIX, BATCH_TYPE_PREFIX),
        ).fetchone()
    return RequestCounts(total, int(completed), int(failed), int(pending))


def batch_types_queued(db_path: TaskDb) -> set[str]:
    """The `batch:<model>` task types that have queued rows (to load back after a restart)."""
    with connect(db_path) as conn:
        records = conn.execute(
            "SELECT DISTINCT task_type FROM background_tasks"
            " WHERE status = 'queued' AND substr(task_type, 1, length(?)) = ?",
            (BATCH_TYPE_PREFIX, BATCH_TYPE_PREFIX),
        ).fetchall()
    return {r[0] for r in records}
