"""`tasks.db` as the queue opens it: a SQLite file's Path, or a PostgresDb that owns its pool (task_db)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmswap.tasks.queue.service import same_db
from llmswap.tasks.queue.sql import PostgresDb, connect, display, is_postgres, task_db

URL = "postgresql://queue:s3cret@db.internal:5432/tasks"


def test_a_url_is_a_postgres_database_and_anything_else_a_sqlite_file() -> None:
    database = task_db(URL)
    assert isinstance(database, PostgresDb) and database.url == URL and is_postgres(database)
    assert task_db("postgres://h/db") == PostgresDb("postgres://h/db")
    assert task_db("tasks.sqlite") == Path("tasks.sqlite") and not is_postgres(task_db("tasks.sqlite"))
    assert task_db(database) is database  # opened once, passed on as it is


def test_two_databases_are_the_same_by_url_and_a_file_by_its_resolved_path(tmp_path: Path) -> None:
    assert PostgresDb(URL) == PostgresDb(URL) and hash(PostgresDb(URL)) == hash(PostgresDb(URL))
    assert PostgresDb(URL) != PostgresDb(URL.replace("tasks", "other"))
    assert same_db(task_db(URL), task_db(URL))
    assert not same_db(task_db(URL), tmp_path / "tasks.sqlite")
    assert same_db(tmp_path / "tasks.sqlite", tmp_path / "sub" / ".." / "tasks.sqlite")


def test_the_password_shows_nowhere() -> None:
    database = PostgresDb(URL)
    assert "s3cret" not in display(database) and "s3cret" not in repr(database)
    assert "db.internal" in display(database)


def test_a_url_not_opened_as_a_database_is_refused_not_taken_for_a_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="task_db"), connect(URL):  # type: ignore[arg-type]
        pass
    assert list(tmp_path.iterdir()) == []


def test_closing_a_database_that_never_connected_does_nothing() -> None:
    database = PostgresDb(URL)
    database.close()
    database.close()
