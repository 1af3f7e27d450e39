"""The `background_tasks` table on real SQLite files: dedupe, status stamps, cancel, stats, order, WAL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from llmswap.tasks.queue.db import (
    CANCELLED_ERROR,
    TaskDatabaseError,
    TaskStatus,
    cancel_task,
    claim_task,
    fail_unfinished_task,
    finish_task,
    get_task,
    init_db,
    insert_task,
    list_tasks,
    queued_tasks,
    reset_running_tasks,
    task_stats,
    update_task_status,
)
from tests.helpers.race import all_at_once
from tests.unit.tasks.helpers import WAIT


def test_insert_dedupes_a_queued_or_running_pair(db: Path) -> None:
    first, first_new = insert_task(db, "cover_letter", 7, {"tone": "warm"})
    assert first_new
    assert insert_task(db, "cover_letter", 7, {"tone": "cold"}) == (first, False)

    claim_task(db, first)
    assert insert_task(db, "cover_letter", 7) == (first, False)  # running still dedupes

    other_type, other_new = insert_task(db, "company_research", 7)
    other_job, other_job_new = insert_task(db, "cover_letter", 8)
    assert other_new and other_job_new and len({first, other_type, other_job}) == 3

    finish_task(db, first, "completed", result="Dear ...")
    again, again_new = insert_task(db, "cover_letter", 7)
    assert again_new and again != first  # a finished pair may be submitted again

    forced, forced_new = insert_task(db, "cover_letter", 7, dedupe=False)
    assert forced_new and forced not in (first, again)
    row = get_task(db, first)
    assert row is not None and row.params == {"tone": "warm"}  # the duplicate did not overwrite params


def test_insert_dedupe_is_atomic_across_threads(db: Path) -> None:
    racers = 8
    outcomes = all_at_once(lambda: insert_task(db, "cover_letter", 99), racers, WAIT)

    assert len(outcomes) == racers
    assert len({task_id for task_id, _ in outcomes}) == 1
    assert sum(is_new for _, is_new in outcomes) == 1
    assert len(list_tasks(db)) == 1


def test_status_changes_stamp_times(db: Path) -> None:
    task_id, _ = insert_task(db, "cover_letter", 1)
    queued = get_task(db, task_id)
    assert queued is not None and queued.status is TaskStatus.QUEUED
    assert (queued.started_at, queued.finished_at) == (None, None)

    update_task_status(db, task_id, "running")
    running = get_task(db, task_id)
    assert running is not None and running.started_at is not None and running.finished_at is None

    update_task_status(db, task_id, "completed", result='{"choices": []}')
    done = get_task(db, task_id)
    assert done is not None and done.status is TaskStatus.COMPLETED and done.finished
    assert done.result == '{"choices": []}'
    assert done.finished_at is not None and done.started_at is not None
    assert done.created_at <= done.started_at <= done.finished_at


def test_unknown_status_is_refused_naming_it(db: Path) -> None:
    task_id, _ = insert_task(db, "cover_letter", 1)
    with pytest.raises(ValueError, match=r"'done' is not one of: queued, running, completed, failed"):
        update_task_status(db, task_id, "done")
    with pytest.raises(ValueError, match="'completed' or 'failed'"):
        finish_task(db, task_id, "running")


def test_claim_and_finish_are_conditional(db: Path) -> None:
    task_id, _ = insert_task(db, "cover_letter", 1)
    claimed = claim_task(db, task_id)
    assert claimed is not None and claimed.status is TaskStatus.RUNNING and claimed.started_at is not None
    assert claim_task(db, task_id) is None  # a second worker cannot take it

    assert reset_running_tasks(db) == 1
    assert not finish_task(db, task_id, "completed", result="late")  # the restart's verdict stands
    row = get_task(db, task_id)
    assert row is not None and row.status is TaskStatus.FAILED and row.result is None
    assert not fail_unfinished_task(db, task_id, "again")


def test_cancel_only_takes_queued_tasks(db: Path) -> None:
    queued, _ = insert_task(db, "cover_letter", 1)
    running, _ = insert_task(db, "cover_letter", 2)
    done, _ = insert_task(db, "cover_letter", 3)
    claim_task(db, running)
    update_task_status(db, done, "completed")

    assert cancel_task(db, queued)
    assert not cancel_task(db, queued)  # already cancelled
    assert not cancel_task(db, running)
    assert not cancel_task(db, done)
    assert not cancel_task(db, 12345)

    row = get_task(db, queued)
    assert row is not None and (row.status, row.error) == (TaskStatus.FAILED, CANCELLED_ERROR)
    assert row.finished_at is not None
    assert claim_task(db, queued) is None  # a worker that still holds it in a deque skips it


def test_task_stats_counts_every_status_per_type(db: Path) -> None:
    for job in range(3):
        insert_task(db, "cover_letter", job)
    running, _ = insert_task(db, "company_research", 1)
    claim_task(db, running)
    failed, _ = insert_task(db, "company_research", 2)
    cancel_task(db, failed)
    done, _ = insert_task(db, "discovery", 0)
    update_task_status(db, done, "completed")

    assert task_stats(db) == {
        "cover_letter": {"queued": 3, "running": 0, "completed": 0, "failed": 0},
        "company_research": {"queued": 0, "running": 1, "completed": 0, "failed": 1},
        "discovery": {"queued": 0, "running": 0, "completed": 1, "failed": 0},
    }


def test_same_second_inserts_keep_fifo_order(db: Path) -> None:
    ids = [insert_task(db, "cover_letter", 0, dedupe=False)[0] for _ in range(20)]
    rows = [get_task(db, task_id) for task_id in ids]
    stamps = [row.created_at for row in rows if row is not None]

    assert all("." in stamp and len(stamp) == len("2026-01-01 00:00:00.000000") for stamp in stamps)
    assert stamps == sorted(stamps)
    assert [row.id for row in queued_tasks(db, {"cover_letter"})] == ids
    assert [row.id for row in list_tasks(db, limit=5)] == ids[::-1][:5]  # newest first


def test_list_tasks_filters(db: Path) -> None:
    letter, _ = insert_task(db, "cover_letter", 1)
    research, _ = insert_task(db, "company_research", 1)
    claim_task(db, research)

    assert [r.id for r in list_tasks(db, status="queued")] == [letter]
    assert [r.id for r in list_tasks(db, task_type="company_research")] == [research]
    assert list_tasks(db, status="running", task_type="cover_letter") == []
    with pytest.raises(ValueError, match="limit must be >= 1"):
        list_tasks(db, limit=0)


def test_params_round_trip_as_json(db: Path) -> None:
    body = {"model": "writer", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2}
    with_body, _ = insert_task(db, "cover_letter", 1, body)
    with_text, _ = insert_task(db, "cover_letter", 2, '{"already": "json text"}')
    without, _ = insert_task(db, "cover_letter", 3)

    assert get_task(db, with_body).params == body  # type: ignore[union-attr]
    assert get_task(db, with_text).params == '{"already": "json text"}'  # type: ignore[union-attr]
    assert get_task(db, without).params is None  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="params of a 'cover_letter' task must be JSON-serialisable"):
        insert_task(db, "cover_letter", 4, {"when": object()})


def test_database_uses_wal_and_readers_do_not_wait_for_writers(db: Path) -> None:
    task_id, _ = insert_task(db, "cover_letter", 1)
    with sqlite3.connect(db) as probe:
        assert probe.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE background_tasks SET status = 'running' WHERE id = ?", (task_id,))
        row = get_task(db, task_id)  # reads the last committed state while the write is open
        assert row is not None and row.status is TaskStatus.QUEUED
        writer.execute("COMMIT")
    finally:
        writer.close()
    assert get_task(db, task_id).status is TaskStatus.RUNNING  # type: ignore[union-attr]


def test_init_db_is_idempotent_and_keeps_rows(db: Path) -> None:
    task_id, _ = insert_task(db, "cover_letter", 1)
    init_db(db)
    assert get_task(db, task_id) is not None


def test_missing_table_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(TaskDatabaseError, match=r"no background_tasks table; call .*init_db"):
        insert_task(tmp_path / "fresh.sqlite", "cover_letter", 1)
    with pytest.raises(TaskDatabaseError, match="does not exist"):
        init_db(tmp_path / "missing-dir" / "tasks.sqlite")
