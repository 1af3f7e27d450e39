"""Where the task queue's tables live: a SQLite file (one host), or a PostgreSQL database (several hosts).

`tasks.db` is a file path or a `postgresql://` URL, which `task_db` makes a `TaskDb`: the `Path` of a SQLite
file, or a `PostgresDb`, the database and this process's pool of connections to it. Every statement of the
queue goes through `connect()`, which gives an autocommit connection of either kind with one
`execute(sql, args)` taking SQLite's `?` marks. The statements are written once, in the dialect both
engines share; the few that differ (the schema, the JSON of a batch's counts, the leases of `shared.py`)
ask `is_postgres()`.

A `PostgresDb` is made by whoever owns the queue's use of it (the task service, from its config; the
`llmswap tasks` command) and closed by it: its psycopg pool (`psycopg_pool`) opens on first use and lives
as long as that owner, and no pool is kept anywhere else. psycopg is an extra
(`pip install 'llmswap-proxy[postgres]'`), imported only when a URL is used, so a SQLite user never needs
it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from llmswap.config.masking import mask_secrets
from llmswap.config.tasks_section import POSTGRES_SCHEMES, postgres_missing

BUSY_TIMEOUT_MS = 10_000
POOL_MAX = 8  # connections per URL: worker threads of one llmswap; the database allows 100 by default
# The key of the advisory lock that `write_transaction` takes on PostgreSQL: writers that check and then
# write (the dedupe of an insert, the schema) take turns, as SQLite's BEGIN IMMEDIATE makes them.
_WRITE_LOCK = 0x6C6C6D73


class TaskDatabaseUnavailable(RuntimeError):
    """The PostgreSQL server of a shared queue cannot be reached now (HTTP: 503, try again later)."""

    retry_after = 5.0


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class PostgresDb:
    """A PostgreSQL database of the task queue (`url`), and this process's pool of connections to it: opened
    on the first connection, closed by `close` (after which a connection opens the pool again). Two are
    equal when their URLs are."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._pool: Any = None
        self._lock = threading.Lock()  # connections are asked for from worker threads

    def __repr__(self) -> str:
        return f"PostgresDb({display(self.url)!r})"

    def __str__(self) -> str:
        return self.url

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PostgresDb) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def pool(self) -> Any:
        with self._lock:
            if self._pool is None:
                self._pool = _open_pool(self.url)
            return self._pool

    def close(self) -> None:
        """Close the pool's connections (blocking: from a worker thread when on the event loop)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


TaskDb = Path | PostgresDb
"""Where the queue's tables are: a SQLite file, or a PostgreSQL database with its pool."""


def task_db(where: Path | str | PostgresDb) -> TaskDb:
    """`tasks.db` as the queue opens it: a `postgresql://` (or `postgres://`) URL is a `PostgresDb` (its
    pool is the caller's to close), anything else a SQLite file's path."""
    if isinstance(where, PostgresDb | Path):
        return where
    return PostgresDb(where) if where.startswith(POSTGRES_SCHEMES) else Path(where)


def is_postgres(db: TaskDb) -> bool:
    return isinstance(db, PostgresDb)


def display(db: TaskDb | str) -> str:
    """The database for logs and errors: a URL without its password."""
    return mask_secrets(str(db))


class _Postgres:
    """A pooled psycopg connection that reads SQLite's `?` marks (a literal % is doubled for psycopg)."""

    def __init__(self, conn: Any) -> None:
        self.raw = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        text = sql.replace("%", "%%").replace("?", "%s") if args else sql
        cursor: Cursor = self.raw.execute(text, tuple(args) if args else None)
        return cursor


def _open_pool(url: str) -> Any:
    missing = postgres_missing()
    if missing:
        raise RuntimeError(missing)
    from psycopg_pool import ConnectionPool

    # The pool logs every failed connection attempt while the database is away (dozens of lines a minute);
    # the queue host reports an outage once as it begins and once as it ends instead.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    # check: a connection is tried before it is lent (one round trip), so the first statement after the
    # database restarted does not fail on a connection the restart broke.
    return ConnectionPool(url, min_size=1, max_size=POOL_MAX, kwargs={"autocommit": True}, open=True,
                          timeout=5.0, name="llmswap-tasks", check=ConnectionPool.check_connection)


@contextmanager
def connect(db: TaskDb) -> Iterator[Any]:
    """An autocommit connection to `db` (explicit transactions: `write_transaction`), released on exit."""
    if isinstance(db, PostgresDb):
        import psycopg
        import psycopg.errors
        from psycopg_pool import PoolTimeout

        try:
            with db.pool().connection() as conn:
                yield _Postgres(conn)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise TaskDatabaseUnavailable(
                f"the task queue's database {display(db)} cannot be reached: {' '.join(str(exc).split())}"
            ) from exc
        except psycopg.errors.UndefinedTable as exc:  # before the first host joined (hosts.py)
            raise TaskDatabaseUnavailable(
                f"the task queue's database {display(db)} has no task tables yet: a host makes them when it "
                "joins"
            ) from exc
        return
    if isinstance(db, str) and db.startswith(POSTGRES_SCHEMES):  # would be taken for a file's name
        raise TypeError("a PostgreSQL URL is opened as a PostgresDb (task_db), which owns its pool")
    # isolation_level=None: the sqlite3 module must not open transactions behind our back.
    conn = sqlite3.connect(str(db), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # In WAL mode NORMAL still survives a killed process (kill -9 loses nothing committed); only a
        # power cut may drop the last commits. It spares an fsync per status change.
        conn.execute("PRAGMA synchronous = NORMAL")
        yield conn
    finally:
        conn.close()


@contextmanager
def write_transaction(conn: Any) -> Iterator[None]:
    """A transaction whose writes no other writer interleaves with (read, decide, write): SQLite's
    `BEGIN IMMEDIATE`, or on PostgreSQL a transaction holding the queue's advisory lock."""
    if isinstance(conn, _Postgres):
        with conn.raw.transaction():
            conn.raw.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            yield
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
