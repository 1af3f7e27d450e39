"""How a server's lane takes a task, runs it and records what came of it.

`Claims` is the one difference between a queue of one host and a queue several hosts share. On a SQLite
file a lane claims the task it holds by id (a conditional update: a cancel and a claim cannot both win).
On PostgreSQL it claims under a lease (`shared.claim`): that task if it is still free, else the oldest
free task of the same type (another host took it: the router's grant this lane waited for is not wasted),
and the outcome is written only while the lease holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from llmswap.scheduler.errors import Preempted
from llmswap.tasks.queue.db import TaskRow, TaskStatus, claim_task, finish_task, release_task
from llmswap.tasks.queue.preemption import Requeue, requeue_preempted
from llmswap.tasks.queue.shared import claim as claim_leased
from llmswap.tasks.queue.sql import TaskDatabaseUnavailable, TaskDb

log = logging.getLogger("llmswap.tasks")
RECORD_RETRY = 1.0  # seconds between tries while a shared queue's database is unreachable


@dataclass(frozen=True, slots=True)
class Queued:
    """A lane's queue entry: a task whose row is queued in the database."""

    id: int
    job_id: int
    params: Any = None


class Claims:
    """This host's claims on `db`: `owner` (its instance id) and `lease_seconds` make them leases."""

    def __init__(
        self, db: TaskDb, host: str | None = None, *, owner: str | None = None, lease_seconds: float = 30.0
    ) -> None:
        self.db = db
        self.host = host
        self.owner = owner
        self.lease_seconds = lease_seconds

    def claim(self, task_type: str, task_id: int) -> TaskRow | None:
        if self.owner is None:
            return claim_task(self.db, task_id, self.host)
        return claim_leased(self.db, task_type, task_id, host=self.host or "", owner=self.owner,
                            lease_seconds=self.lease_seconds)

    def finish(self, task_id: int, status: TaskStatus, *, error: str | None = None,
               result: str | None = None) -> bool:
        return finish_task(self.db, task_id, status, error=error, result=result, owner=self.owner)

    def requeue(self, task_id: int, limit: int) -> Requeue | None:
        return requeue_preempted(self.db, task_id, limit, self.owner)

    def release(self, task_id: int) -> bool:
        return release_task(self.db, task_id, self.owner)


def claiming(
    claims: Claims | TaskDb,
    run_one: Callable[[TaskRow], Awaitable[Any]],
    *,
    max_preemptions: Callable[[], int],
    on_preempted: Callable[[str, Queued, bool], None] | None = None,
    on_claimed: Callable[[int], Any] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> Callable[[str, Queued], Awaitable[None]]:
    """Server mode's task runner: claim the row, run it, record the outcome (a failure never stops a lane).

    Given a database rather than `Claims`, it claims by id there. `on_claimed(id)` hears of a task
    claimed in place of the one in hand (shared queue); `stopping()` says the lanes are being shut down. A
    preempted attempt did not run: see `requeue_preempted_task`."""
    taken = claims if isinstance(claims, Claims) else Claims(claims)

    async def run(task_type: str, item: Queued) -> None:
        try:
            row = await asyncio.to_thread(taken.claim, task_type, item.id)
            if row is None:
                log.info("task %d (%s) is no longer queued; not running it", item.id, task_type)
                return
            if row.id != item.id and on_claimed is not None:
                on_claimed(row.id)
            await _run_claimed(taken, task_type, item, row, run_one, max_preemptions(), on_preempted,
                               stopping)
        except TaskDatabaseUnavailable as exc:
            # The row stays as it is (queued; the next read of the queue brings it back); a pause keeps the
            # lane from spinning through its queue while the database is away.
            log.warning("task %d (%s) not taken: %s", item.id, task_type, exc)
            await asyncio.sleep(RECORD_RETRY)
        except Exception:
            log.exception("tasks: running task %d (%s) failed", item.id, task_type)

    return run


async def _run_claimed(
    claims: Claims, task_type: str, item: Queued, row: TaskRow, run_one: Callable[[TaskRow], Awaitable[Any]],
    limit: int, on_preempted: Callable[[str, Queued, bool], None] | None, stopping: Callable[[], bool],
) -> None:
    try:
        result = await run_one(row)
    except asyncio.CancelledError:
        # A preemption cancels the call too (its lease then raises Preempted, handled by the caller); a
        # stopping llmswap (`TaskLanes.shutdown`) cancels the lane: that attempt did not finish, and the task
        # goes back to the queue as it was, for the next start (or another host) to run.
        if stopping():
            try:
                if await asyncio.to_thread(claims.release, row.id):
                    log.info("task %d (%s) was running as llmswap stopped: back in the queue", row.id,
                             task_type)
            except Exception as exc:
                log.warning("task %d (%s) could not be put back in the queue: %s", row.id, task_type, exc)
        raise
    except Preempted as exc:
        taken = item if row.id == item.id else Queued(row.id, row.job_id, row.params)
        await requeue_preempted_task(claims, task_type, taken, exc, limit, on_preempted)
        return
    except Exception as exc:
        log.warning("task %d (%s, job %d) failed: %s", row.id, task_type, row.job_id, exc)
        await _record(claims, row, TaskStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
        return
    text = result if result is None or isinstance(result, str) else json.dumps(result)
    if not await _record(claims, row, TaskStatus.COMPLETED, result=text):
        log.warning("task %d (%s) finished after it had been failed or its lease had lapsed; its result "
                    "was dropped", row.id, task_type)


async def _record(claims: Claims, row: TaskRow, status: TaskStatus, *, error: str | None = None,
                  result: str | None = None) -> bool:
    """Write the outcome; while a shared queue's database is away, keep it and try again (the lease may
    lapse meanwhile: then the write is refused, and the task runs again elsewhere)."""
    while True:
        try:
            return await asyncio.to_thread(claims.finish, row.id, status, error=error, result=result)
        except TaskDatabaseUnavailable as exc:
            log.warning("task %d: its outcome waits for the database: %s", row.id, exc)
            await asyncio.sleep(RECORD_RETRY)


async def requeue_preempted_task(
    claims: Claims | TaskDb,
    task_type: str,
    item: Queued,
    exc: Preempted,
    limit: int,
    on_preempted: Callable[[str, Queued, bool], None] | None,
) -> None:
    """A preempted attempt did not run: its row goes back to queued (`preemption.requeue_preempted`, at most
    `limit` times, then failed) and `on_preempted(type, item, requeued)` is told."""
    taken = claims if isinstance(claims, Claims) else Claims(claims)
    outcome = await asyncio.to_thread(taken.requeue, item.id, limit)
    if outcome is None:
        log.info("task %d (%s) was preempted and is no longer running; left as it is", item.id, task_type)
        return
    if outcome.requeued:
        log.warning("task %d (%s) preempted (%s): back at the head of its queue (preemption %d, "
                    "at most %d)", item.id, task_type, exc, outcome.preemptions, limit)
    else:
        log.warning("task %d (%s) failed: %s", item.id, task_type, outcome.error)
    if on_preempted is not None:
        on_preempted(task_type, item, outcome.requeued)
