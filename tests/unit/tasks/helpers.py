"""A recording stand-in for `run_task` (no model behind it) and small helpers shared by the task tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmswap.tasks.peregrine.scheduler import BATCH_THREAD_PREFIX, LOOP_THREAD_NAME, TaskScheduler
from llmswap.tasks.queue.db import insert_task

SchedulerFactory = Callable[..., TaskScheduler]  # the `make_scheduler` fixture

WAIT = 10.0  # generous upper bound for anything a test waits on; never an assertion about speed


@dataclass(frozen=True)
class Call:
    task_id: int
    task_type: str
    job_id: int
    params: Any
    thread: threading.Thread


class RecordingRunTask:
    """Records every call with the thread it ran on; `hook(call)` runs inside the call (gates, failures)."""

    def __init__(self, hook: Callable[[Call], None] | None = None) -> None:
        self.hook = hook
        self.calls: list[Call] = []
        self._changed = threading.Condition()

    def __call__(self, db_path: Path, task_id: int, task_type: str, job_id: int, params: Any) -> None:
        call = Call(task_id, task_type, job_id, params, threading.current_thread())
        with self._changed:
            self.calls.append(call)
            self._changed.notify_all()
        if self.hook is not None:
            self.hook(call)

    def wait_for_calls(self, count: int, timeout: float = WAIT) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: len(self.calls) >= count, timeout)

    def ids(self, task_type: str | None = None) -> list[int]:
        with self._changed:
            return [c.task_id for c in self.calls if task_type is None or c.task_type == task_type]

    def types(self) -> list[str]:
        with self._changed:
            return [c.task_type for c in self.calls]


def queue_task(scheduler: TaskScheduler, task_type: str, job_id: int = 0, params: Any = None) -> int:
    """Insert a row (no dedupe: tests queue many job-less tasks) and enqueue it, as submit_task would."""
    task_id, _ = insert_task(scheduler.db_path, task_type, job_id, params, dedupe=False)
    scheduler.enqueue(task_id, task_type, job_id, params)
    return task_id


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT, interval: float = 0.01) -> bool:
    """Poll `predicate` until it holds or `timeout` passes (for state no event announces)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def scheduler_threads_alive() -> list[str]:
    """Names of live loop and batch-worker threads (free threads of non-LLM tasks are not the scheduler's)."""
    return [
        t.name
        for t in threading.enumerate()
        if t.is_alive() and (t.name == LOOP_THREAD_NAME or t.name.startswith(BATCH_THREAD_PREFIX))
    ]
