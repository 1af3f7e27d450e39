"""The task queue's tables, created and migrated by llmswap, on SQLite and on PostgreSQL.

One version number covers every table (`llmswap_schema`): tasks, the Batch API's files and batches, and
on PostgreSQL the hosts that share the queue. A database at a newer version than this code knows is
refused (an older llmswap would write rows the newer one misreads); an older one is migrated in place,
under the write lock, so hosts starting together migrate it once.

Version 1 is a SQLite file from before the version table (its columns were added as they came: the
preemption count, the files' and batches' owners); version 2 adds the host that ran a task and its lease.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmswap.tasks.queue.sql import PostgresDb, TaskDb, connect, display, write_transaction

SCHEMA_VERSION = 2

_SQLITE = """
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
    preemptions INTEGER NOT NULL DEFAULT 0,
    host        TEXT,
    lease_owner TEXT,
    lease_until TEXT
);
CREATE INDEX IF NOT EXISTS idx_background_tasks_status_type ON background_tasks (status, task_type);
CREATE INDEX IF NOT EXISTS idx_background_tasks_job ON background_tasks (job_id, task_type);
CREATE TABLE IF NOT EXISTS batch_files (
    id          TEXT    PRIMARY KEY,
    filename    TEXT    NOT NULL,
    purpose     TEXT    NOT NULL,
    bytes       INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    content     BLOB    NOT NULL,
    owner       TEXT
);
CREATE TABLE IF NOT EXISTS batches (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT    NOT NULL UNIQUE,
    endpoint          TEXT    NOT NULL,
    input_file_id     TEXT    NOT NULL,
    completion_window TEXT    NOT NULL,
    status            TEXT    NOT NULL,
    created_at        INTEGER NOT NULL,
    expires_at        INTEGER,
    in_progress_at    INTEGER,
    finalizing_at     INTEGER,
    completed_at      INTEGER,
    failed_at         INTEGER,
    expired_at        INTEGER,
    cancelling_at     INTEGER,
    cancelled_at      INTEGER,
    output_file_id    TEXT,
    error_file_id     TEXT,
    errors            TEXT,
    metadata          TEXT,
    total             INTEGER NOT NULL DEFAULT 0,
    owner             TEXT
);
"""

# The same tables; `batch_files.rowid` is named after SQLite's implicit column, so the statements that
# order files by upload are the same on both.
_POSTGRES = """
CREATE TABLE IF NOT EXISTS background_tasks (
    id          BIGSERIAL PRIMARY KEY,
    task_type   TEXT    NOT NULL,
    job_id      BIGINT  NOT NULL DEFAULT 0,
    params      TEXT,
    status      TEXT    NOT NULL DEFAULT 'queued',
    error       TEXT,
    result      TEXT,
    created_at  TEXT    NOT NULL,
    started_at  TEXT,
    finished_at TEXT,
    preemptions INTEGER NOT NULL DEFAULT 0,
    host        TEXT,
    lease_owner TEXT,
    lease_until TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS idx_background_tasks_status_type ON background_tasks (status, task_type);
CREATE INDEX IF NOT EXISTS idx_background_tasks_job ON background_tasks (job_id, task_type);
CREATE INDEX IF NOT EXISTS idx_background_tasks_lease ON background_tasks (lease_until)
    WHERE status = 'running';
CREATE TABLE IF NOT EXISTS batch_files (
    rowid       BIGSERIAL,
    id          TEXT    PRIMARY KEY,
    filename    TEXT    NOT NULL,
    purpose     TEXT    NOT NULL,
    bytes       BIGINT  NOT NULL,
    created_at  BIGINT  NOT NULL,
    content     BYTEA   NOT NULL,
    owner       TEXT
);
CREATE TABLE IF NOT EXISTS batches (
    seq               BIGSERIAL PRIMARY KEY,
    id                TEXT    NOT NULL UNIQUE,
    endpoint          TEXT    NOT NULL,
    input_file_id     TEXT    NOT NULL,
    completion_window TEXT    NOT NULL,
    status            TEXT    NOT NULL,
    created_at        BIGINT  NOT NULL,
    expires_at        BIGINT,
    in_progress_at    BIGINT,
    finalizing_at     BIGINT,
    completed_at      BIGINT,
    failed_at         BIGINT,
    expired_at        BIGINT,
    cancelling_at     BIGINT,
    cancelled_at      BIGINT,
    output_file_id    TEXT,
    error_file_id     TEXT,
    errors            TEXT,
    metadata          TEXT,
    total             BIGINT  NOT NULL DEFAULT 0,
    owner             TEXT
);
CREATE TABLE IF NOT EXISTS llmswap_hosts (
    name         TEXT        PRIMARY KEY,
    instance     TEXT        NOT NULL,
    types        TEXT        NOT NULL,
    models       TEXT        NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL
);
"""

# Columns a version-1 SQLite file may lack (table -> column -> its definition).
_SQLITE_ADDED = {
    "background_tasks": {"preemptions": "INTEGER NOT NULL DEFAULT 0", "host": "TEXT", "lease_owner": "TEXT",
                         "lease_until": "TEXT"},
    "batch_files": {"owner": "TEXT"},
    "batches": {"owner": "TEXT"},
}


class TaskDatabaseError(RuntimeError):
    """The database cannot serve the task queue (missing table, unreadable file, unknown schema)."""


def init_db(db: TaskDb) -> None:
    """Create the tables if missing, migrate an older schema, refuse a newer one. Idempotent."""
    if isinstance(db, PostgresDb):
        with connect(db) as conn, write_transaction(conn):
            _create(conn, db, _POSTGRES)
        return
    path = Path(db)
    if not path.parent.is_dir():
        raise TaskDatabaseError(
            f"{db}: directory {path.parent} does not exist; create it or pick another path"
        )
    with connect(path) as conn:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise TaskDatabaseError(
                f"{db}: SQLite refused WAL mode (got {mode!r}); put the database on a local disk"
            )
        with write_transaction(conn):
            _create(conn, db, _SQLITE)
            for table, columns in _SQLITE_ADDED.items():
                have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                for column, definition in columns.items():
                    if column not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")


def _create(conn: Any, db: TaskDb, script: str) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS llmswap_schema (version INTEGER NOT NULL)")
    record = conn.execute("SELECT MAX(version) FROM llmswap_schema").fetchone()
    version = record[0] if record is not None else None
    if version is not None and version > SCHEMA_VERSION:
        raise TaskDatabaseError(
            f"{display(db)}: the task queue's schema is version {version}, newer than this llmswap knows "
            f"({SCHEMA_VERSION}): a newer llmswap made it. Upgrade llmswap on this host, or point tasks.db "
            f"at another database"
        )
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)
    if version != SCHEMA_VERSION:
        conn.execute("DELETE FROM llmswap_schema")
        conn.execute("INSERT INTO llmswap_schema (version) VALUES (?)", (SCHEMA_VERSION,))
