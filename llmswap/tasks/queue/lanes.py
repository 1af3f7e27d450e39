"""The task engine: one asyncio lane per task type with queued work, on the event loop.

A lane runs its type's tasks one after another, oldest first (FIFO within a type), until its queue is
empty; tasks queued meanwhile join it. The lanes do not choose among task types: in server mode every type
with queued work gets a lane at once, and each lane keeps one request outstanding at the router (the task
in hand, at the tasks' priority; `TaskService` claims its row once granted) carrying the depth of its
type's queue as a backlog hint. Which type runs next, and how many run side by side, is then the router's
scheduler's and swapper's answer: a lane whose model fits beside the running ones is simply granted; a
model whose lane announced more is not evicted before they came; the batch scheduler loads the model with
the deepest queue first (within maxWait). A program without a router (the Peregrine adapter,
`batching.py`) passes its own `chooser` instead: which waiting types may start now.

No threads and no locks: every method runs on the event loop; the database calls go to a worker thread
(`asyncio.to_thread`), so SQLite never blocks the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmswap.tasks.queue.claims import Queued, claiming, requeue_preempted_task
from llmswap.tasks.queue.db import QUEUE_FULL_ERROR, TaskRow, fail_unfinished_task, queued_tasks
from llmswap.tasks.queue.sql import TaskDb

__all__ = ["Queued", "TaskLanes", "claiming", "requeue_preempted_task"]  # the last two: claims.py

log = logging.getLogger("llmswap.tasks")

RunOne = Callable[[TaskRow], Awaitable[Any]]


class LaneBroken(Exception):
    """Raised by a lane's task runner when the lane cannot go on (its worker died): the lane ends, and
    its queue starts a new one (a new batch) if anything is left."""


def log_failure(what: str) -> Callable[[asyncio.Future[Any]], None]:
    """A done-callback that logs the error of background work nobody awaits."""

    def done(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.error("tasks: %s failed: %r", what, future.exception())

    return done


RunItem = Callable[[str, Queued], Awaitable[None]]
# Which of the waiting types (type -> queue depth, in the order they were first queued) may start a lane
# now, beside the types whose lanes run: for a program without a router to decide.
Chooser = Callable[[Mapping[str, int], Collection[str]], Sequence[str]]


@dataclass(frozen=True)
class LanesSnapshot:
    queue_depths: Mapping[str, int]  # type -> tasks waiting (not counting the one its lane runs)
    active_types: tuple[str, ...]  # types whose lane runs, sorted
    batches_started: Mapping[str, int]  # type -> lanes started since construction
    requeued: Mapping[str, int] = dataclasses.field(default_factory=dict)  # type -> preempted, queued again
    gave_up: Mapping[str, int] = dataclasses.field(default_factory=dict)  # type -> failed at maxPreemptions


class TaskLanes:
    """The lanes of one task service; see the module docstring. Without a `chooser` every waiting type
    starts its lane at once (the router decides what runs)."""

    def __init__(
        self,
        db: TaskDb,
        run_item: RunItem,
        *,
        max_queue_depth: int,
        chooser: Chooser | None = None,
        on_lane_end: Callable[[str], None] | None = None,
        running: bool = True,
    ) -> None:
        self.db = db
        self._run_item = run_item
        self._on_lane_end = on_lane_end
        self._running = running  # False until `begin()`: tasks queue, no lane starts
        self._chooser = chooser
        self.max_queue_depth = max_queue_depth
        self._types: frozenset[str] = frozenset()
        self._queues: dict[str, deque[Queued]] = {}
        self._queued_ids: set[int] = set()
        self._active: dict[str, asyncio.Task[None]] = {}
        self._batches_started: dict[str, int] = {}
        self._requeued: dict[str, int] = {}
        self._gave_up: dict[str, int] = {}
        self._stopping = False

    # ------------------------------------------------------------------ types

    def handles(self, task_type: str) -> bool:
        return task_type in self._types

    def set_types(self, types: Iterable[str], max_queue_depth: int | None = None) -> frozenset[str]:
        """Run these types from now on; returns the newly listed ones, whose queued rows `load` reads.

        A type no longer listed leaves its queue (its rows stay queued in the database, for a later
        config that lists it again); its running lane ends after the task in hand.
        """
        new = frozenset(types)
        added = new - self._types
        self._types = new
        if max_queue_depth is not None:
            self.max_queue_depth = max_queue_depth
        for task_type in [t for t in self._queues if t not in new]:
            for item in self._queues.pop(task_type):
                self._queued_ids.discard(item.id)
        return added

    async def load(self, types: Collection[str]) -> None:
        """Queue the rows the database holds queued for `types`, oldest first (a row already queued, or
        run meanwhile, is not run twice: its claim in the database is the guard)."""
        if not types:
            return
        rows = await asyncio.to_thread(queued_tasks, self.db, set(types))
        for row in rows:
            self.enqueue(row.id, row.task_type, row.job_id, row.params, bounded=False)

    # ------------------------------------------------------------------ queueing

    def begin(self) -> None:
        """Start the lanes of what is queued (for an engine built before its loop ran)."""
        self._running = True
        self._start_lanes()

    def kick(self) -> None:
        """Look again at the waiting types: the room beside the running lanes may have changed."""
        self._start_lanes()

    def enqueue(
        self, task_id: int, task_type: str, job_id: int, params: Any = None, *, bounded: bool = True
    ) -> bool:
        """Queue a task whose row is already in the database; False when it was not queued.

        Past the max queue depth the task is dropped and its row failed "Queue depth limit reached";
        `bounded=False` skips that check (rows loaded from the database, a batch's requests).
        """
        if self._stopping or task_type not in self._types:
            return False
        if task_id in self._queued_ids:
            return True
        queue = self._queues.setdefault(task_type, deque())
        if bounded and len(queue) >= self.max_queue_depth:
            log.warning("Queue depth limit reached for %s (max=%d) — task %d dropped",
                        task_type, self.max_queue_depth, task_id)
            self._background(asyncio.to_thread(fail_unfinished_task, self.db, task_id, QUEUE_FULL_ERROR))
            return False
        queue.append(Queued(task_id, job_id, params))
        self._queued_ids.add(task_id)
        self._start_lanes()
        return True

    def preempted(self, task_type: str, item: Queued, requeued: bool) -> None:
        """Count a preempted attempt; when its row went back to queued, put it at the head of its type's
        queue (it was at the head when its lane took it), so the lane runs it next."""
        counts = self._requeued if requeued else self._gave_up
        counts[task_type] = counts.get(task_type, 0) + 1
        if not requeued or self._stopping or task_type not in self._types:
            return  # not taken back now: the row stays queued in the database for the next load
        self.discard(item.id)  # the database poll may have queued it at the tail meanwhile
        self._queues.setdefault(task_type, deque()).appendleft(item)
        self._queued_ids.add(item.id)
        self._start_lanes()

    def discard(self, task_id: int) -> bool:
        """Forget a queued task (its row was cancelled); False when it was not queued here."""
        if task_id not in self._queued_ids:
            return False
        self._queued_ids.discard(task_id)
        for queue in self._queues.values():
            for item in queue:
                if item.id == task_id:
                    queue.remove(item)
                    return True
        return True

    def pending_ids(self) -> set[int]:
        return set(self._queued_ids)

    def pending(self, task_type: str) -> tuple[int, ...]:
        return tuple(item.id for item in self._queues.get(task_type, ()))

    def depth(self, task_type: str) -> int:
        return len(self._queues.get(task_type, ()))

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """Take no new work: each lane ends after the task in hand."""
        self._stopping = True

    def snapshot(self) -> LanesSnapshot:
        return LanesSnapshot(
            queue_depths={t: len(q) for t, q in self._queues.items() if q},
            active_types=tuple(sorted(self._active)),
            batches_started=dict(self._batches_started),
            requeued=dict(self._requeued),
            gave_up=dict(self._gave_up),
        )

    # ------------------------------------------------------------------ lanes

    def _start_lanes(self) -> None:
        if self._stopping or not self._running:
            return
        waiting = {t: len(q) for t, q in self._queues.items() if q and t not in self._active}
        chosen = list(waiting) if self._chooser is None else self._chooser(waiting, tuple(self._active))
        for task_type in chosen:
            self._batches_started[task_type] = self._batches_started.get(task_type, 0) + 1
            log.info("tasks: starting a %s batch (%d queued)", task_type, waiting[task_type])
            self._active[task_type] = asyncio.get_running_loop().create_task(
                self._lane(task_type), name=f"tasks-lane:{task_type}"
            )

    async def _lane(self, task_type: str) -> None:
        try:
            while not self._stopping:
                queue = self._queues.get(task_type)
                if not queue:
                    break
                item = queue.popleft()
                self._queued_ids.discard(item.id)
                await self._run_item(task_type, item)
        except LaneBroken:
            log.warning("tasks: the %s batch broke off; what is left starts a new one", task_type)
        finally:
            self._active.pop(task_type, None)
            if self._on_lane_end is not None:
                self._on_lane_end(task_type)
            self._start_lanes()

    def _background(self, work: Awaitable[Any]) -> None:
        asyncio.ensure_future(work).add_done_callback(log_failure("a database write"))

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Lanes finish the task in hand and stop; queued tasks stay queued in the database."""
        self._stopping = True
        lanes = list(self._active.values())
        if not lanes:
            return
        _, pending = await asyncio.wait(lanes, timeout=timeout)
        for lane in pending:
            lane.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
