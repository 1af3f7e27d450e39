"""The default `run_task` (claim, handler, outcome) and `submit_task` end to end with real handlers."""

from __future__ import annotations

import threading
from pathlib import Path

from llmswap.tasks.peregrine.runner import submit_task
from llmswap.tasks.peregrine.scheduler import UNLIMITED_VRAM_GB, get_scheduler
from llmswap.tasks.queue.db import (
    INTERRUPTED_ERROR,
    TaskRow,
    TaskStatus,
    cancel_task,
    get_task,
    insert_task,
    reset_running_tasks,
)
from llmswap.tasks.queue.execution import default_run_task, make_run_task
from tests.unit.tasks.helpers import WAIT, wait_until


def test_handler_result_is_stored(db: Path) -> None:
    seen: list[TaskRow] = []

    def write_letter(row: TaskRow) -> str:
        seen.append(row)
        return f"Dear hiring manager of job {row.job_id}"

    run_task = make_run_task({"cover_letter": write_letter})
    task_id, _ = insert_task(db, "cover_letter", 12, {"tone": "warm"})
    run_task(db, task_id, "cover_letter", 12, {"tone": "warm"})

    row = get_task(db, task_id)
    assert row is not None and row.status is TaskStatus.COMPLETED
    assert row.result == "Dear hiring manager of job 12"
    assert seen[0].status is TaskStatus.RUNNING and seen[0].params == {"tone": "warm"}


def test_structured_results_are_stored_as_json(db: Path) -> None:
    run_task = make_run_task(fallback=lambda row: {"choices": [{"message": {"content": "ok"}}]})
    task_id, _ = insert_task(db, "anything", 1)
    run_task(db, task_id, "anything", 1, None)
    row = get_task(db, task_id)
    assert row is not None and row.result == '{"choices": [{"message": {"content": "ok"}}]}'


def test_handler_error_fails_the_task(db: Path) -> None:
    def broken(row: TaskRow) -> str:
        raise ConnectionError("upstream refused")

    task_id, _ = insert_task(db, "cover_letter", 1)
    make_run_task({"cover_letter": broken})(db, task_id, "cover_letter", 1, None)

    row = get_task(db, task_id)
    assert row is not None and row.status is TaskStatus.FAILED
    assert row.error == "ConnectionError: upstream refused"


def test_missing_handler_fails_with_the_fix(db: Path) -> None:
    task_id, _ = insert_task(db, "cover_letter", 1)
    default_run_task(db, task_id, "cover_letter", 1, None)

    row = get_task(db, task_id)
    assert row is not None and row.status is TaskStatus.FAILED
    assert row.error is not None and "no handler for task type 'cover_letter'" in row.error
    assert "make_run_task" in row.error


def test_cancelled_task_never_reaches_its_handler(db: Path) -> None:
    calls: list[int] = []
    task_id, _ = insert_task(db, "cover_letter", 1)
    assert cancel_task(db, task_id)

    make_run_task(fallback=lambda row: calls.append(row.id))(db, task_id, "cover_letter", 1, None)

    assert calls == []
    assert get_task(db, task_id).error == "cancelled"  # type: ignore[union-attr]


def test_result_after_a_restart_verdict_is_dropped(db: Path) -> None:
    def interrupted_midway(row: TaskRow) -> str:
        reset_running_tasks(db)  # what a restarting server does while this handler still runs
        return "too late"

    task_id, _ = insert_task(db, "cover_letter", 1)
    make_run_task(fallback=interrupted_midway)(db, task_id, "cover_letter", 1, None)

    row = get_task(db, task_id)
    assert row is not None
    assert (row.status, row.error, row.result) == (TaskStatus.FAILED, INTERRUPTED_ERROR, None)


def test_submit_task_runs_both_paths_with_real_handlers(db: Path) -> None:
    worker_threads: dict[str, str] = {}
    lock = threading.Lock()

    def handler(row: TaskRow) -> str:
        with lock:
            worker_threads[row.task_type] = threading.current_thread().name
        return f"{row.task_type}:{row.params['n']}"

    reset_running_tasks(db)
    scheduler = get_scheduler(db, make_run_task(fallback=handler), available_vram=UNLIMITED_VRAM_GB)
    letters = [submit_task(db, "cover_letter", job_id=n, params={"n": n})[0] for n in range(1, 4)]
    scrape, _ = submit_task(db, "scrape_url", job_id=1, params={"n": 0})

    assert scheduler.wait_idle(WAIT)
    assert wait_until(lambda: get_task(db, scrape).finished)  # type: ignore[union-attr]

    results = [get_task(db, t).result for t in letters]  # type: ignore[union-attr]
    assert results == ["cover_letter:1", "cover_letter:2", "cover_letter:3"]
    assert get_task(db, scrape).result == "scrape_url:0"  # type: ignore[union-attr]
    assert worker_threads["cover_letter"].startswith("llmswap-tasks-batch-")
    assert worker_threads["scrape_url"].startswith("llmswap-tasks-free-")
