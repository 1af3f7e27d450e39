"""The task lanes: one per type with queued work, FIFO within a type; without a chooser every waiting type
starts at once (the router decides what runs), with one the chooser does. A real SQLite database, a
recording stand-in for the dispatch path."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from pathlib import Path

from llmswap.tasks.queue.db import TaskRow, get_task, init_db, insert_task
from llmswap.tasks.queue.lanes import Chooser, TaskLanes, claiming
from tests.helpers.wait import eventually


class Recorder:
    """Runs a task by waiting for the test's go; remembers the order, the backlog hint the lane would send
    (its type's queue depth behind the task in hand) and the most running at once."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.backlogs: list[int] = []
        self.running = 0
        self.most = 0
        self.go = asyncio.Event()
        self.lanes: TaskLanes | None = None

    async def __call__(self, row: TaskRow) -> str:
        assert self.lanes is not None
        self.order.append(row.task_type)
        self.backlogs.append(self.lanes.depth(row.task_type))
        self.running += 1
        self.most = max(self.most, self.running)
        await self.go.wait()
        self.running -= 1
        return '{"ok": true}'


def build(
    tmp_path: Path, counts: dict[str, int], chooser: Chooser | None = None
) -> tuple[Recorder, TaskLanes, list[int]]:
    db = tmp_path / "tasks.sqlite"
    init_db(db)
    recorder = Recorder()
    runner = claiming(db, recorder, max_preemptions=lambda: 3)
    lanes = TaskLanes(db, runner, max_queue_depth=100, chooser=chooser)
    recorder.lanes = lanes
    lanes.set_types(counts)
    ids = []
    for task_type, count in counts.items():
        for _ in range(count):
            task_id, _ = insert_task(db, task_type, 0, {"messages": []}, dedupe=False)
            ids.append(task_id)
            lanes.enqueue(task_id, task_type, 0)
    return recorder, lanes, ids


async def finish(recorder: Recorder, lanes: TaskLanes) -> None:
    recorder.go.set()

    async def idle() -> bool:
        return not lanes.snapshot().active_types

    await eventually(idle, what="every lane to end")


async def test_every_type_with_queued_work_starts_its_lane_at_once_for_the_router_to_schedule(
    tmp_path: Path,
) -> None:
    recorder, lanes, ids = build(tmp_path, {"letters": 2, "research": 3})

    async def both_running() -> bool:
        return recorder.running == 2

    await eventually(both_running, what="both types running")
    assert lanes.snapshot().active_types == ("letters", "research")
    await finish(recorder, lanes)
    assert lanes.snapshot().batches_started == {"letters": 1, "research": 1}
    rows = [get_task(tmp_path / "tasks.sqlite", task_id) for task_id in ids]
    assert [row.status.value if row is not None else None for row in rows] == ["completed"] * 5


async def test_each_task_sees_its_types_queue_behind_it_as_the_backlog_hint(tmp_path: Path) -> None:
    recorder, lanes, _ = build(tmp_path, {"letters": 3})
    await finish(recorder, lanes)
    assert recorder.backlogs == [2, 1, 0]  # what `TaskService` sends the router with each task


async def test_a_chooser_decides_which_waiting_types_start(tmp_path: Path) -> None:
    asked: list[tuple[dict[str, int], tuple[str, ...]]] = []

    def one_at_a_time_deepest_first(waiting: Mapping[str, int], active: Collection[str]) -> list[str]:
        asked.append((dict(waiting), tuple(active)))
        return [] if active else [max(waiting, key=lambda t: waiting[t])]

    recorder, lanes, _ = build(tmp_path, {"first": 1, "shallow": 1, "deep": 2}, one_at_a_time_deepest_first)
    await finish(recorder, lanes)
    assert recorder.most == 1
    # "first" started alone as soon as it was queued; then the deeper of the two left went next.
    assert recorder.order == ["first", "deep", "deep", "shallow"]
    assert asked[0] == ({"first": 1}, ())
    assert ({"shallow": 1, "deep": 2}, ()) in asked
