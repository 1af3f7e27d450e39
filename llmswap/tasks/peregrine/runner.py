"""`submit_task`: the one entry point that records a task and routes it.

LLM task types go to the process-wide TaskScheduler to be batched; every other type runs at once on a
daemon thread of its own, as Peregrine's background tasks always did. Both paths call the scheduler's
`run_task_fn`, so one callable decides what every task does.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from llmswap.tasks.peregrine.scheduler import get_scheduler
from llmswap.tasks.queue.db import insert_task
from llmswap.tasks.queue.execution import run_queued_task

FREE_THREAD_PREFIX = "llmswap-tasks-free-"


def submit_task(
    db_path: Path | str, task_type: str, job_id: int | None = None, params: Any = None, *, dedupe: bool = True
) -> tuple[int, bool]:
    """Queue a task and route it; returns (task_id, is_new).

    A (task_type, job_id) already queued or running is not queued again (is_new=False) unless
    `dedupe=False`; `job_id` None means 0, so job-less tasks of one type dedupe against each other.
    The first call builds the scheduler with default settings: an app that needs its own `run_task_fn`,
    budgets or VRAM calls `reset_running_tasks(db_path)` and then `get_scheduler(db_path, ...)` first.
    """
    # The scheduler is built before the insert: building loads the queued rows, and the new row must
    # reach the deque through enqueue() alone.
    scheduler = get_scheduler(db_path)
    job = job_id or 0
    task_id, is_new = insert_task(scheduler.db_path, task_type, job, params, dedupe=dedupe)
    if is_new:
        if scheduler.handles(task_type):
            scheduler.enqueue(task_id, task_type, job, params)
        else:
            threading.Thread(
                target=run_queued_task,
                args=(scheduler.run_task_fn, scheduler.db_path, task_id, task_type, job, params),
                name=f"{FREE_THREAD_PREFIX}{task_id}",
                daemon=True,
            ).start()
    return task_id, is_new
