"""Server mode's task lanes: one per type, deepest queue first, side by side only when the router says the
models fit together; a real SQLite database, a recording stand-in for the dispatch path."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path

from llmswap.config.model import DEFAULT_GROUP_ID, GroupConfig
from llmswap.scheduler.fit import fit_together
from llmswap.scheduler.swappers.group import GroupSwapper
from llmswap.tasks.db import TaskRow, get_task, init_db, insert_task
from llmswap.tasks.lanes import TaskLanes, claiming
from tests.helpers.wait import eventually

MODELS = {"letters": "a", "research": "b"}


class Recorder:
    """Runs a task by waiting for the test's go; remembers the order and the most running at once."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.running = 0
        self.most = 0
        self.go = asyncio.Event()

    async def __call__(self, row: TaskRow) -> str:
        self.order.append(row.task_type)
        self.running += 1
        self.most = max(self.most, self.running)
        await self.go.wait()
        self.running -= 1
        return '{"ok": true}'


async def run(tmp_path: Path, fits: bool, counts: dict[str, int]) -> tuple[Recorder, TaskLanes, list[int]]:
    db = tmp_path / "tasks.sqlite"
    init_db(db)
    recorder = Recorder()

    def fit(models: Collection[str]) -> bool:
        return fits

    runner = claiming(db, recorder, max_preemptions=lambda: 3)
    lanes = TaskLanes(db, runner, model_of=MODELS.get, fits=fit, max_queue_depth=100)
    lanes.set_types(MODELS)
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


async def test_lanes_whose_models_cannot_run_together_go_one_batch_at_a_time_deepest_first(
    tmp_path: Path,
) -> None:
    recorder, lanes, ids = await run(tmp_path, False, {"letters": 1, "research": 3})
    await finish(recorder, lanes)
    assert recorder.most == 1
    assert recorder.order == ["letters", "research", "research", "research"]  # letters started first
    assert lanes.snapshot().batches_started == {"letters": 1, "research": 1}
    rows = [get_task(tmp_path / "tasks.sqlite", task_id) for task_id in ids]
    assert [row.status.value if row is not None else None for row in rows] == ["completed"] * 4


async def test_lanes_whose_models_fit_together_run_side_by_side(tmp_path: Path) -> None:
    recorder, lanes, _ = await run(tmp_path, True, {"letters": 2, "research": 2})

    async def both_running() -> bool:
        return recorder.running == 2

    await eventually(both_running, what="both types running")
    assert sorted(lanes.snapshot().active_types) == ["letters", "research"]
    await finish(recorder, lanes)
    assert recorder.most == 2


async def test_a_waiting_type_with_the_deeper_queue_goes_next(tmp_path: Path) -> None:
    db = tmp_path / "tasks.sqlite"
    init_db(db)
    recorder = Recorder()
    types = {"first": "a", "shallow": "b", "deep": "c"}
    lanes = TaskLanes(
        db, claiming(db, recorder, max_preemptions=lambda: 3), model_of=types.get, fits=lambda models: False,
        max_queue_depth=100,
    )
    lanes.set_types(types)
    for task_type, count in (("first", 1), ("shallow", 1), ("deep", 2)):
        for _ in range(count):
            task_id, _ = insert_task(db, task_type, 0, None, dedupe=False)
            lanes.enqueue(task_id, task_type, 0)
    await finish(recorder, lanes)
    assert recorder.order == ["first", "deep", "deep", "shallow"]


def test_fit_together_asks_the_swapper_whether_any_model_would_evict_another() -> None:
    groups = {
        DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID),
        "one-at-a-time": GroupConfig("one-at-a-time", swap=True, exclusive=False, members=("a", "b")),
        "beside": GroupConfig("beside", swap=True, exclusive=False, members=("c",)),
    }
    swapper = GroupSwapper(groups)
    assert not fit_together(swapper, {"a", "b"})
    assert fit_together(swapper, {"a", "c"})
    assert fit_together(swapper, {"a"})
