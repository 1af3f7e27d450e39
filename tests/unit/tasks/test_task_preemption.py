"""A preempted task attempt did not run: its row goes back to queued at the head of its type's queue, its
count one higher, until `tasks.maxPreemptions` is passed and it is failed. Real SQLite; a stand-in for the
dispatch path that raises the router's `Preempted`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from llmswap.scheduler.errors import Preempted
from llmswap.tasks.queue.db import (
    TaskRow,
    TaskStatus,
    cancel_task,
    claim_task,
    finish_task,
    get_task,
    init_db,
    insert_task,
    queued_tasks,
    reset_running_tasks,
)
from llmswap.tasks.queue.lanes import TaskLanes, claiming
from llmswap.tasks.queue.preemption import requeue_preempted
from tests.helpers.wait import eventually


def queue(db: Path, n: int, task_type: str = "letters") -> list[int]:
    return [insert_task(db, task_type, 0, {"n": i}, dedupe=False)[0] for i in range(n)]


def test_a_preempted_task_is_queued_again_before_the_tasks_queued_after_it(db: Path) -> None:
    first, second = queue(db, 2)
    assert claim_task(db, first) is not None
    (later,) = queue(db, 1)  # queued while the first one ran

    outcome = requeue_preempted(db, first, max_preemptions=3)

    assert outcome is not None and outcome.requeued and outcome.preemptions == 1
    row = get_task(db, first)
    assert row is not None
    assert (row.status, row.preemptions, row.started_at, row.result, row.error) == (
        TaskStatus.QUEUED, 1, None, None, None)
    assert [r.id for r in queued_tasks(db, {"letters"})] == [first, second, later]


def test_a_requeued_task_survives_a_restart_and_loads_first(db: Path) -> None:
    first, second = queue(db, 2)
    claim_task(db, first)
    requeue_preempted(db, first, max_preemptions=3)
    claim_task(db, second)  # running when the process dies: its outcome is unknown

    assert reset_running_tasks(db) == 1  # what a restart does first
    assert [(r.id, r.preemptions) for r in queued_tasks(db, {"letters"})] == [(first, 1)]
    failed = get_task(db, second)
    assert failed is not None and failed.status is TaskStatus.FAILED


def test_a_requeued_task_cannot_be_finished_by_the_attempt_that_was_preempted(db: Path) -> None:
    (task_id,) = queue(db, 1)
    claim_task(db, task_id)
    requeue_preempted(db, task_id, max_preemptions=3)
    assert not finish_task(db, task_id, TaskStatus.COMPLETED, result='{"partial": true}')
    row = get_task(db, task_id)
    assert row is not None and (row.status, row.result) == (TaskStatus.QUEUED, None)


def test_a_task_preempted_more_than_max_preemptions_times_fails_naming_the_count_and_the_setting(
    db: Path,
) -> None:
    (task_id,) = queue(db, 1)
    for expected in (1, 2):
        claim_task(db, task_id)
        outcome = requeue_preempted(db, task_id, max_preemptions=2)
        assert outcome is not None and outcome.requeued and outcome.preemptions == expected
    claim_task(db, task_id)

    outcome = requeue_preempted(db, task_id, max_preemptions=2)

    assert outcome is not None and not outcome.requeued and outcome.preemptions == 3
    row = get_task(db, task_id)
    assert row is not None and row.status is TaskStatus.FAILED and row.preemptions == 3
    assert row.error is not None
    assert "preempted 3 times" in row.error and "tasks.maxPreemptions: 2" in row.error
    assert row.finished_at is not None


def test_max_preemptions_0_fails_a_task_at_its_first_preemption(db: Path) -> None:
    (task_id,) = queue(db, 1)
    claim_task(db, task_id)
    outcome = requeue_preempted(db, task_id, max_preemptions=0)
    assert outcome is not None and not outcome.requeued
    row = get_task(db, task_id)
    assert row is not None and row.status is TaskStatus.FAILED


def test_a_preempted_task_no_longer_running_is_left_as_it_is(db: Path) -> None:
    cancelled, queued = queue(db, 2)
    cancel_task(db, cancelled)
    assert requeue_preempted(db, cancelled, max_preemptions=3) is None
    assert requeue_preempted(db, queued, max_preemptions=3) is None
    rows = [get_task(db, task_id) for task_id in (cancelled, queued)]
    assert [(r.status, r.preemptions) for r in rows if r is not None] == [
        (TaskStatus.FAILED, 0), (TaskStatus.QUEUED, 0)]


def test_a_database_from_before_preemption_gains_the_count_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE background_tasks (id INTEGER PRIMARY KEY AUTOINCREMENT, task_type TEXT NOT NULL,"
            " job_id INTEGER NOT NULL DEFAULT 0, params TEXT, status TEXT NOT NULL DEFAULT 'queued',"
            " error TEXT, result TEXT, created_at TEXT NOT NULL, started_at TEXT, finished_at TEXT)"
        )
        conn.execute("INSERT INTO background_tasks (task_type, created_at) VALUES ('letters', '2026-01-01')")
    init_db(db)
    (row,) = queued_tasks(db, {"letters"})
    assert row.preemptions == 0
    claim_task(db, row.id)
    outcome = requeue_preempted(db, row.id, max_preemptions=3)
    assert outcome is not None and outcome.requeued


class PreemptedOnce:
    """The dispatch path: the first attempt at each task is preempted, the next one answers."""

    def __init__(self, times: int = 1) -> None:
        self.attempts: list[int] = []
        self.times = times

    async def __call__(self, row: TaskRow) -> str:
        self.attempts.append(row.id)
        if self.attempts.count(row.id) <= self.times:
            raise Preempted("preempted for chat (routing.scheduler.settings.preemptBelow: 0)")
        return f'{{"answer": {row.id}}}'


async def run_lane(
    db: Path, run_one: PreemptedOnce, max_preemptions: int, n: int
) -> tuple[TaskLanes, list[int]]:
    lanes: TaskLanes
    runner = claiming(db, run_one, max_preemptions=lambda: max_preemptions,
                      on_preempted=lambda *outcome: lanes.preempted(*outcome))
    lanes = TaskLanes(db, runner, max_queue_depth=10)
    lanes.set_types(["letters"])
    ids = queue(db, n)
    for task_id in ids:
        lanes.enqueue(task_id, "letters", 0)

    async def idle() -> bool:
        return not lanes.snapshot().active_types

    await eventually(idle, what="the lane to end")
    return lanes, ids


async def test_a_lane_runs_a_preempted_task_again_next_and_completes_it_once(db: Path) -> None:
    run_one = PreemptedOnce()
    lanes, (first, second) = await run_lane(db, run_one, 3, 2)

    assert run_one.attempts == [first, first, second, second]  # back at the head, before the second
    for task_id in (first, second):
        row = get_task(db, task_id)
        assert row is not None
        assert (row.status, row.preemptions, row.result) == (
            TaskStatus.COMPLETED, 1, f'{{"answer": {task_id}}}')
    assert lanes.snapshot().requeued == {"letters": 2}
    assert lanes.snapshot().gave_up == {}


async def test_a_lane_gives_up_on_a_task_preempted_past_the_bound_and_goes_on(db: Path) -> None:
    run_one = PreemptedOnce(times=5)
    lanes, (first,) = await run_lane(db, run_one, 1, 1)

    assert run_one.attempts == [first, first]
    row = get_task(db, first)
    assert row is not None and row.status is TaskStatus.FAILED and row.preemptions == 2
    assert lanes.snapshot().requeued == {"letters": 1}
    assert lanes.snapshot().gave_up == {"letters": 1}
