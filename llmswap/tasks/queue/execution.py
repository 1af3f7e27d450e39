"""What running one task means: claim its row, call the handler for its type, store the outcome.

The scheduler and the free threads only ever call a `RunTaskFn`; they never know what a task does. The
default one (`make_run_task`) looks a handler up by task type. A handler is a plain blocking callable on
the worker's thread: a synchronous app does the work inline. (A server runs its tasks on asyncio lanes,
`lanes.py`, without this module.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from llmswap.tasks.queue.db import (
    TaskRow,
    TaskStatus,
    claim_task,
    fail_unfinished_task,
    finish_task,
    get_task,
)

logger = logging.getLogger(__name__)

Handler = Callable[[TaskRow], Any]
"""Does one task's work from its claimed row; returns the result (text, or a JSON-serialisable value)."""


class RunTaskFn(Protocol):
    """Runs one task to its end and records the outcome in the database; called on a worker thread."""

    def __call__(self, db_path: Path, task_id: int, task_type: str, job_id: int, params: Any) -> None: ...


def _result_text(result: Any) -> str | None:
    if result is None or isinstance(result, str):
        return result
    return json.dumps(result)


def make_run_task(
    handlers: Mapping[str, Handler] | None = None, *, fallback: Handler | None = None
) -> RunTaskFn:
    """A `RunTaskFn` that runs `handlers[task_type]` (else `fallback`) between claim and finish.

    The claim is a conditional queued -> running update, so a task cancelled after it was queued is
    skipped here even if the cancel raced with the worker picking it up.
    """
    table = dict(handlers or {})

    def run_task(db_path: Path, task_id: int, task_type: str, job_id: int, params: Any) -> None:
        row = claim_task(db_path, task_id)
        if row is None:
            logger.info("task %d (%s) is no longer queued; not running it", task_id, task_type)
            return
        handler = table.get(task_type, fallback)
        if handler is None:
            finish_task(
                db_path,
                task_id,
                TaskStatus.FAILED,
                error=f"no handler for task type {task_type!r}: build the scheduler with "
                f"get_scheduler(db_path, run_task_fn=make_run_task({{{task_type!r}: handler}}))",
            )
            return
        try:
            result = _result_text(handler(row))
        except Exception as exc:
            logger.exception("task %d (%s, job %d) failed", task_id, task_type, job_id)
            finish_task(db_path, task_id, TaskStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
            return
        if not finish_task(db_path, task_id, TaskStatus.COMPLETED, result=result):
            logger.warning(
                "task %d (%s) finished after it had been failed (restart?); its result was dropped",
                task_id,
                task_type,
            )

    return run_task


default_run_task: RunTaskFn = make_run_task()
"""Fails every task with a message saying how to register a handler: llmswap knows no Peregrine work."""


def run_queued_task(
    run_task_fn: RunTaskFn, db_path: Path, task_id: int, task_type: str, job_id: int, params: Any
) -> bool:
    """Call `run_task_fn` if the row is still queued; an exception it lets out fails the row.

    Returns False when the task was skipped (cancelled, or finished by someone else). Both the batch
    workers and the free threads go through here, so neither can die on one bad task.
    """
    try:
        row = get_task(db_path, task_id)
        if row is None or row.status is not TaskStatus.QUEUED:
            state = "gone" if row is None else row.status.value
            logger.info("task %d (%s) is %s; skipped", task_id, task_type, state)
            return False
        run_task_fn(db_path, task_id, task_type, job_id, params)
    except Exception as exc:
        logger.exception("run_task raised for task %d (%s); marking it failed", task_id, task_type)
        try:
            fail_unfinished_task(db_path, task_id, f"{type(exc).__name__}: {exc}")
        except Exception:
            logger.exception("could not mark task %d failed", task_id)
    return True
