"""Fixtures for the task-queue tests: a fresh singleton per test, a real SQLite file per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmswap.tasks.peregrine.scheduler import TaskScheduler, reset_scheduler
from llmswap.tasks.queue.db import init_db
from llmswap.tasks.queue.execution import RunTaskFn
from tests.unit.tasks.helpers import WAIT, RecordingRunTask, SchedulerFactory


@pytest.fixture(autouse=True)
def _isolated_scheduler() -> Iterator[None]:
    reset_scheduler()
    yield
    reset_scheduler()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.sqlite"
    init_db(path)
    return path


@pytest.fixture
def run_task() -> RecordingRunTask:
    return RecordingRunTask()


@pytest.fixture
def make_scheduler(db: Path) -> Iterator[SchedulerFactory]:
    """Builds TaskSchedulers on `db` (not started) and shuts every one down after the test."""
    built: list[TaskScheduler] = []

    def build(run_task: RunTaskFn | None = None, **kwargs: Any) -> TaskScheduler:
        scheduler = TaskScheduler(db, run_task, **kwargs)
        built.append(scheduler)
        return scheduler

    yield build
    for scheduler in built:
        scheduler.shutdown(WAIT)
