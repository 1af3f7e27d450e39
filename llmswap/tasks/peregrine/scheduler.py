"""Peregrine's task scheduler API: the process-wide TaskScheduler of a synchronous app, and its defaults.

`get_scheduler` / `current_scheduler` / `reset_scheduler` manage the one scheduler of the process; the
scheduler itself lives in `llmswap.tasks.peregrine.batching`, Peregrine's task names and budgets in
`llmswap.tasks.peregrine.defaults`. Everything a Peregrine app imported from its `task_scheduler` is here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from llmswap.tasks.peregrine.batching import BATCH_THREAD_PREFIX as BATCH_THREAD_PREFIX
from llmswap.tasks.peregrine.batching import LOOP_THREAD_NAME as LOOP_THREAD_NAME
from llmswap.tasks.peregrine.batching import SchedulerSnapshot as SchedulerSnapshot
from llmswap.tasks.peregrine.batching import TaskScheduler
from llmswap.tasks.peregrine.defaults import BYTES_PER_GB as BYTES_PER_GB
from llmswap.tasks.peregrine.defaults import DEFAULT_MAX_QUEUE_DEPTH as DEFAULT_MAX_QUEUE_DEPTH
from llmswap.tasks.peregrine.defaults import DEFAULT_VRAM_BUDGETS as DEFAULT_VRAM_BUDGETS
from llmswap.tasks.peregrine.defaults import LLM_TASK_TYPES as LLM_TASK_TYPES
from llmswap.tasks.peregrine.defaults import UNLIMITED_VRAM_GB as UNLIMITED_VRAM_GB
from llmswap.tasks.peregrine.defaults import detect_available_vram as detect_available_vram
from llmswap.tasks.queue.execution import RunTaskFn

_scheduler: TaskScheduler | None = None
_scheduler_lock = threading.Lock()


def get_scheduler(db_path: Path | str, run_task_fn: RunTaskFn | None = None, **kwargs: Any) -> TaskScheduler:
    """The process-wide scheduler, built and started on first call; later calls ignore the arguments.

    Double-checked locking: the unlocked check spares the lock once the scheduler exists; the check under
    the lock is what makes two racing first calls build only one.
    """
    global _scheduler
    scheduler = _scheduler
    if scheduler is None:
        with _scheduler_lock:
            if _scheduler is None:
                built = TaskScheduler(db_path, run_task_fn, **kwargs)
                built.start()
                _scheduler = built
            scheduler = _scheduler
    if not scheduler.serves(db_path):
        raise ValueError(
            f"the task scheduler already runs on {scheduler.db_path}, not {db_path}; "
            "call reset_scheduler() first to switch databases"
        )
    return scheduler


def current_scheduler() -> TaskScheduler | None:
    """The process-wide scheduler if one was built, without building one."""
    return _scheduler


def reset_scheduler(timeout: float = 5.0) -> None:
    """Shut the process-wide scheduler down and forget it (tests, and restarts within one process)."""
    global _scheduler
    with _scheduler_lock:
        if _scheduler is not None:
            _scheduler.shutdown(timeout)
            _scheduler = None
