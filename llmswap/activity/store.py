"""Activity in SQLite (`store.path`), kept across restarts, the newest `store.retention` rows.

Every database call runs on one worker thread that owns the connection, fed by a queue: the event loop
only enqueues (`add`) or awaits a future (`page`, `stats`). Writes and reads run in the order they were
asked, so a row is readable once its `stored` callback ran. A store that cannot be opened (corrupt file,
not SQLite, unwritable) is reported and `open_store` returns None: activity then stays in memory and
serving goes on. A write that fails later is logged and the row is lost; serving goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from llmswap.activity.query import SORTS, ActivityQuery, Page, StatRow, stats
from llmswap.activity.record import ActivityRecord
from llmswap.activity.tokens import TokenStats

log = logging.getLogger("llmswap.activity")

_T = TypeVar("_T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS activity (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts_created INTEGER NOT NULL DEFAULT 0,
    ts_exact REAL NOT NULL DEFAULT 0,
    model_id TEXT NOT NULL DEFAULT '',
    req_path TEXT NOT NULL DEFAULT '',
    resp_content_type TEXT NOT NULL DEFAULT '',
    resp_status_code INTEGER NOT NULL DEFAULT 0,
    cache_tokens INTEGER NOT NULL DEFAULT 0,
    draft_tokens INTEGER NOT NULL DEFAULT 0,
    draft_acc_tokens INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    prompt_per_second REAL NOT NULL DEFAULT 0,
    tokens_per_second REAL NOT NULL DEFAULT 0,
    duration_ms INTEGER NOT NULL DEFAULT 0,
    error_msg TEXT NOT NULL DEFAULT '',
    metadata_json TEXT NOT NULL DEFAULT '',
    requested_model TEXT NOT NULL DEFAULT '',
    origin TEXT NOT NULL DEFAULT '',
    key_name TEXT NOT NULL DEFAULT '',
    started REAL NOT NULL DEFAULT 0,
    queue_ms INTEGER,
    load_ms INTEGER,
    ttfb_ms INTEGER,
    restore_ms INTEGER,
    phases_json TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS activity_time ON activity (ts_created DESC, id DESC);
CREATE INDEX IF NOT EXISTS activity_model ON activity (model_id, ts_created DESC, id DESC);
"""
_COLUMNS = (
    "id", "ts_created", "ts_exact", "model_id", "req_path", "resp_content_type", "resp_status_code",
    "cache_tokens", "draft_tokens", "draft_acc_tokens", "input_tokens", "output_tokens", "prompt_per_second",
    "tokens_per_second", "duration_ms", "error_msg", "metadata_json", "requested_model", "origin", "key_name",
    "started", "queue_ms", "load_ms", "ttfb_ms", "restore_ms", "phases_json",
)
# Columns later versions added, with their type: a file an older llmswap made gets them on open.
_ADDED = {"restore_ms": "INTEGER", "phases_json": "TEXT NOT NULL DEFAULT ''"}
_INSERT = f"INSERT INTO activity ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"


def _row_of(record: ActivityRecord) -> tuple[Any, ...]:
    t = record.tokens
    return (
        record.id, int(record.timestamp), record.timestamp, record.model, record.req_path,
        record.resp_content_type, record.resp_status_code, t.cache_tokens, t.draft_tokens, t.draft_acc_tokens,
        t.input_tokens, t.output_tokens, t.prompt_per_second, t.tokens_per_second, record.duration_ms,
        record.error_msg, json.dumps(record.metadata) if record.metadata else "", record.requested_model,
        record.origin, record.key_name, record.started, record.queue_ms, record.load_ms, record.ttfb_ms,
        record.restore_ms, json.dumps(record.phases) if record.phases else "",
    )


def _record_of(row: tuple[Any, ...]) -> ActivityRecord:
    v = dict(zip(_COLUMNS, row, strict=True))
    tokens = TokenStats(v["cache_tokens"], v["draft_tokens"], v["draft_acc_tokens"], v["input_tokens"],
                        v["output_tokens"], v["prompt_per_second"], v["tokens_per_second"])
    return ActivityRecord(
        id=v["id"], timestamp=v["ts_exact"] or float(v["ts_created"]), model=v["model_id"],
        req_path=v["req_path"], resp_status_code=v["resp_status_code"],
        resp_content_type=v["resp_content_type"],
        tokens=tokens, duration_ms=v["duration_ms"], error_msg=v["error_msg"],
        metadata=json.loads(v["metadata_json"]) if v["metadata_json"] else {},
        requested_model=v["requested_model"], origin=v["origin"], key_name=v["key_name"],
        started=v["started"],
        queue_ms=v["queue_ms"], load_ms=v["load_ms"], ttfb_ms=v["ttfb_ms"], restore_ms=v["restore_ms"],
        phases=json.loads(v["phases_json"]) if v["phases_json"] else {},
    )


class SqliteLog:
    """An `ActivityLog` in one SQLite file, on its own thread. Use `open_store` to make one."""

    def __init__(self, path: Path, retention: int, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self.retention = retention
        self._loop = loop
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._db: sqlite3.Connection | None = None
        self.next_id = 1
        self._write_failed = False
        self._thread = threading.Thread(target=self._work, name=f"activity-store:{path.name}", daemon=True)

    # ------------------------------------------------------------------ the worker thread

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            try:
                job()
            except Exception:  # one bad job must not end the thread every later write waits on
                log.exception("activity: the store's worker failed a job")
        if self._db is not None:
            self._db.close()

    def _open(self) -> int:
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout = 5000")
            db.execute("PRAGMA journal_mode = WAL")
            db.executescript(SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(activity)")}
            for column, kind in _ADDED.items():
                if column not in present:
                    db.execute(f"ALTER TABLE activity ADD COLUMN {column} {kind}")
            latest = db.execute("SELECT COALESCE(MAX(id), 0) FROM activity").fetchone()[0]
        except Exception:
            db.close()
            raise
        self._db = db
        return int(latest) + 1

    def _insert(self, record: ActivityRecord, stored: Callable[[ActivityRecord], None]) -> None:
        assert self._db is not None
        try:
            with self._db:
                self._db.execute(_INSERT, _row_of(record))
                if self.retention > 0:
                    self._db.execute("DELETE FROM activity WHERE id <= ?", (record.id - self.retention,))
        except sqlite3.Error as exc:
            if not self._write_failed:  # once, not once per request
                log.warning("activity: writing to %s failed (%s); requests are served but not stored "
                            "until it works again", self.path, exc)
            self._write_failed = True
            return
        self._write_failed = False
        if not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(stored, record)
            except RuntimeError:  # the loop closed meanwhile (shutdown): nobody is left to tell
                pass

    def _call(self, work: Callable[[], _T]) -> asyncio.Future[_T]:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)

        self._jobs.put(job)
        return asyncio.wrap_future(future)

    def _page(self, query: ActivityQuery) -> Page:
        assert self._db is not None
        where, args = _where(query)
        total = self._db.execute(f"SELECT COUNT(*) FROM activity{where}", args).fetchone()[0]
        direction = "DESC" if query.descending else "ASC"
        column = SORTS[query.sort][1]
        order = f" ORDER BY {column} {direction}, id {direction} LIMIT ? OFFSET ?"
        rows = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM activity{where}{order}",
                                [*args, query.limit, (query.page - 1) * query.limit]).fetchall()
        return Page([_record_of(row) for row in rows], query.page, query.limit, int(total))

    def _stats(self, model: str | None) -> dict[str, Any]:
        assert self._db is not None
        sql = ("SELECT input_tokens, output_tokens, cache_tokens, prompt_per_second, tokens_per_second "
               "FROM activity")
        rows = self._db.execute(sql + (" WHERE model_id = ?" if model else ""), [model] if model else [])
        return stats([StatRow(*row) for row in rows.fetchall()])

    # ------------------------------------------------------------------ the ActivityLog side (event loop)

    def add(self, record: ActivityRecord, stored: Callable[[ActivityRecord], None]) -> None:
        self._jobs.put(lambda: self._insert(record, stored))

    async def page(self, query: ActivityQuery) -> Page:
        return await self._call(lambda: self._page(query))

    async def stats(self, model: str | None) -> dict[str, Any]:
        return await self._call(lambda: self._stats(model))

    def resize(self, max_rows: int) -> None:
        """`metricsMaxInMemory` bounds the in-memory log only; the store keeps `store.retention` rows."""

    async def close(self) -> None:
        """Write what is queued, then close the connection (on the worker thread)."""
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join, 10)


def _where(query: ActivityQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    if query.models:
        clauses.append(f"model_id IN ({', '.join('?' for _ in query.models)})")
        args.extend(query.models)
    for clause, value in (("ts_created >= ?", query.start), ("ts_created <= ?", query.end),
                          ("id >= ?", query.min_id), ("id <= ?", query.max_id)):
        if value is not None:
            clauses.append(clause)
            args.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


async def open_store(path: Path, retention: int) -> SqliteLog | None:
    """The store at `path`, opened on its worker thread; None (and a warning) when it cannot be used."""
    store = SqliteLog(path, retention, asyncio.get_running_loop())
    store._thread.start()
    try:
        store.next_id = await store._call(store._open)
    except Exception as exc:
        log.warning("activity: the store %s cannot be used (%s: %s); activity is kept in memory only "
                    "until it is fixed (move the file away to start a new one)",
                    path, type(exc).__name__, exc)
        await store.close()
        return None
    log.info("activity: stored in %s (next id %d, keeping %s rows)", path, store.next_id,
             retention or "all")
    return store
