"""The TaskScheduler: LLM tasks batched by type, deepest queue first, under VRAM budgets (synchronous apps).

It runs the server's engine (`lanes.py`: one lane per type with queued work, FIFO within a type) on an
asyncio loop of its own, in a background thread (`LOOP_THREAD_NAME`), so a synchronous program (Streamlit,
scripts) calls it like any object. Each batch runs its tasks one after another on a worker thread of its
own (`BATCH_THREAD_PREFIX` + type), where the blocking `RunTaskFn` may take as long as it needs; tasks
queued meanwhile join the batch. A synchronous program has no router to decide which type goes next, so
this adapter is the lanes' `chooser`, by Peregrine's own rule: deepest queue first, a type starting only
when its decimal-GB budget fits beside the running ones in the VRAM it sees (a server's lanes leave that
to the router's scheduler and swapper instead). The database (see `db.py`) is the record of each task's
status; the lanes only order the queued LLM rows.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from llmswap.tasks.peregrine.defaults import (
    DEFAULT_MAX_QUEUE_DEPTH,
    LLM_TASK_TYPES,
    check_settings,
    detect_available_vram,
    merged_budgets,
)
from llmswap.tasks.peregrine.threads import BATCH_THREAD_PREFIX as BATCH_THREAD_PREFIX
from llmswap.tasks.peregrine.threads import BatchWorker
from llmswap.tasks.queue.db import QUEUE_FULL_ERROR, fail_unfinished_task, init_db, queued_tasks
from llmswap.tasks.queue.execution import RunTaskFn, default_run_task, run_queued_task
from llmswap.tasks.queue.lanes import Queued, TaskLanes
from llmswap.tasks.queue.sql import display, is_postgres, task_db

logger = logging.getLogger("llmswap.tasks.peregrine.scheduler")  # the name Peregrine apps configure

_FIT_TOLERANCE = 1e-9  # budgets are decimal GB in binary floats: 2.5 + 5.0 must fit in 7.5
LOOP_THREAD_NAME = "llmswap-tasks-scheduler"
_T = TypeVar("_T")


@dataclass(frozen=True)
class SchedulerSnapshot:
    """A consistent view of the scheduler for stats and tests."""

    queue_depths: Mapping[str, int]  # type -> tasks waiting (not counting the one a worker runs)
    active_types: tuple[str, ...]  # types with a batch running, sorted
    reserved_vram: float  # GB, sum of the active types' budgets
    available_vram: float  # GB
    batches_started: Mapping[str, int]  # type -> batches started since construction


class TaskScheduler:
    """Batches LLM tasks by type; see the module docstring. Build, `start()`, `enqueue(...)`, `shutdown()`.

    Construction loads the queued rows of the LLM types back from the database, oldest first. Call
    `reset_running_tasks(db_path)` before constructing: only queued rows load, so a row a crash left
    running would otherwise stay running forever. Budgets and `available_vram` are in GB.
    """

    def __init__(
        self,
        db_path: Path | str,
        run_task_fn: RunTaskFn | None = None,
        *,
        llm_task_types: Iterable[str] = LLM_TASK_TYPES,
        budgets: Mapping[str, float] | None = None,
        available_vram: float | None = None,
        max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
    ) -> None:
        check_settings(max_queue_depth, available_vram)
        if is_postgres(task_db(db_path)):
            raise ValueError(f"{display(db_path)}: the synchronous task library runs on a SQLite file; "
                             "a queue several hosts share is drained by llmswap servers (their tasks.db)")
        self._db_path = Path(db_path)
        self._run_task: RunTaskFn = run_task_fn or default_run_task
        self._llm_task_types = frozenset(llm_task_types)
        self._budgets: dict[str, float] = merged_budgets(budgets)
        self._available_vram = detect_available_vram() if available_vram is None else float(available_vram)
        self._max_queue_depth = max_queue_depth

        self._loop = asyncio.new_event_loop()
        self._loop_thread: threading.Thread | None = None
        self._on_loop = False  # whether calls must hop onto the loop (between start and shutdown)
        self._hop = threading.Lock()  # orders hops against the loop's stop, so none is left unanswered
        self._stop = threading.Event()
        self._workers: dict[str, BatchWorker] = {}
        self._retired: list[BatchWorker] = []
        self._lanes = TaskLanes(
            self._db_path, self._run_item, chooser=self._choose, max_queue_depth=max_queue_depth,
            on_lane_end=self._lane_ended, running=False,
        )
        self._lanes.set_types(self._llm_task_types)

        self._warn_about_budgets()
        init_db(self._db_path)
        resumed = queued_tasks(self._db_path, self._llm_task_types)
        for row in resumed:
            self._lanes.enqueue(row.id, row.task_type, row.job_id, row.params, bounded=False)
        if resumed:
            logger.info("resuming %d queued LLM task(s) from %s", len(resumed), self._db_path)

    def reconfigure(
        self,
        *,
        llm_task_types: Iterable[str],
        budgets: Mapping[str, float] | None = None,
        available_vram: float | None = None,
        max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
    ) -> None:
        """Change types, budgets, available VRAM and queue depth while running (a config reload).

        A type no longer listed leaves its queue (its rows stay queued in the database, for a later
        config that lists it again); its running batch ends after the task in hand. A newly listed type's
        queued rows load, oldest first, as at construction. Queues already longer than a lowered depth
        keep their tasks: the depth bounds what is added.
        """
        check_settings(max_queue_depth, available_vram)
        merged = merged_budgets(budgets)
        available = detect_available_vram() if available_vram is None else float(available_vram)
        types = frozenset(llm_task_types)
        added = types - self._llm_task_types
        resumed = queued_tasks(self._db_path, added)

        def apply() -> None:
            self._llm_task_types = types
            self._budgets = merged
            self._available_vram = available
            self._max_queue_depth = max_queue_depth
            self._lanes.set_types(types, max_queue_depth)
            for row in resumed:
                self._lanes.enqueue(row.id, row.task_type, row.job_id, row.params, bounded=False)
            self._lanes.kick()  # more room, or new types: lanes that waited may start now

        self._call(apply)
        self._warn_about_budgets()

    def _warn_about_budgets(self) -> None:
        for task_type in sorted(self._llm_task_types):
            budget = self._budgets.get(task_type)
            if budget is None:
                logger.warning(
                    "No VRAM budget defined for LLM task type %r — defaulting to 0.0 GB "
                    "(unlimited concurrency for this type); give it a budget to batch it against the others",
                    task_type,
                )
            elif budget > self._available_vram + _FIT_TOLERANCE:
                logger.warning(
                    "VRAM budget of task type %r (%.1f GB) exceeds the available %.1f GB; "
                    "its batches will run alone",
                    task_type,
                    budget,
                    self._available_vram,
                )

    @property
    def db_path(self) -> Path:
        return self._db_path

    @property
    def run_task_fn(self) -> RunTaskFn:
        return self._run_task

    @property
    def llm_task_types(self) -> frozenset[str]:
        return self._llm_task_types

    @property
    def budgets(self) -> Mapping[str, float]:
        return MappingProxyType(self._budgets)

    @property
    def available_vram(self) -> float:
        return self._available_vram

    @property
    def reserved_vram(self) -> float:
        return self.snapshot().reserved_vram

    @property
    def max_queue_depth(self) -> int:
        return self._max_queue_depth

    def handles(self, task_type: str) -> bool:
        """Whether `task_type` is batched here (an LLM type) rather than run on a free thread."""
        return task_type in self._llm_task_types

    def serves(self, db_path: Path | str) -> bool:
        path = Path(db_path)
        return path == self._db_path or path.resolve() == self._db_path.resolve()

    # -- the engine's loop ----------------------------------------------------------------------------

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run `fn` on the engine's loop and return its result (directly while no loop runs: before
        `start` and after `shutdown`, when nothing else touches the lanes)."""
        if threading.current_thread() is self._loop_thread:
            return fn()
        answer: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                answer.set_result(fn())
            except BaseException as exc:
                answer.set_exception(exc)

        with self._hop:
            if not self._on_loop:
                return fn()
            self._loop.call_soon_threadsafe(run)
        return answer.result()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _choose(self, waiting: Mapping[str, int], active: Collection[str]) -> list[str]:
        """The waiting types that start now: deepest queue first (a stable sort keeps the first-queued type
        first on ties), each one whose budget fits beside the types running and those chosen before it."""
        chosen: list[str] = []
        for task_type in sorted(waiting, key=lambda t: waiting[t], reverse=True):
            running = [*active, *chosen]
            if running and not self._fits([task_type, *running]):
                continue  # it waits for the batches it cannot run beside
            chosen.append(task_type)
        return chosen

    def _fits(self, types: Collection[str]) -> bool:
        needed = math.fsum(self._budgets.get(t, 0.0) for t in types)
        return needed <= self._available_vram + _FIT_TOLERANCE

    async def _run_item(self, task_type: str, item: Queued) -> None:
        worker = self._workers.get(task_type)
        if worker is None or not worker.is_alive():
            worker = BatchWorker(task_type, self._loop)
            self._workers[task_type] = worker
            logger.info("starting %s batch (%d queued, %.1f/%.1f GB reserved)", task_type,
                        self._lanes.depth(task_type) + 1, self._reserved(), self._available_vram)
            worker.start()
        run, db = self._run_task, self._db_path
        await worker.submit(lambda: run_queued_task(run, db, item.id, task_type, item.job_id, item.params))

    def _lane_ended(self, task_type: str) -> None:
        worker = self._workers.pop(task_type, None)
        if worker is not None:
            worker.retire()
            self._retired.append(worker)

    def _stop_if_idle(self, stopping: concurrent.futures.Future[bool]) -> None:
        """On the loop: stop it once no batch runs (a batch still running keeps it until the next try)."""
        idle = not self._busy()
        if idle:
            self._loop.stop()
        stopping.set_result(idle)

    def _busy(self) -> bool:
        return bool(self._lanes.snapshot().active_types)

    def _reserved(self) -> float:
        # Recomputed from the active set, so float error cannot accumulate and it is exactly 0.0 when idle.
        return math.fsum(self._budgets.get(t, 0.0) for t in self._lanes.snapshot().active_types)

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine's loop; the tasks loaded at construction start at once."""
        with self._hop:
            if self._loop_thread is not None:
                return
            if self._stop.is_set():
                raise RuntimeError("this TaskScheduler was shut down; build a new one")
            self._loop_thread = threading.Thread(target=self._serve, name=LOOP_THREAD_NAME, daemon=True)
            self._loop_thread.start()
            self._on_loop = True
            self._loop.call_soon_threadsafe(self._lanes.begin)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop; running batches finish the task in hand. True when every thread ended in time.

        Tasks left queued stay queued in the database, and the next scheduler loads them.
        """
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._call(self._lanes.stop)
        while self._call(self._busy) and time.monotonic() < deadline:
            time.sleep(0.005)
        loop_thread = self._loop_thread
        with self._hop:
            # Held until the loop has stopped: every hop scheduled before runs first, none comes after.
            if self._on_loop and loop_thread is not None and loop_thread is not threading.current_thread():
                stopping: concurrent.futures.Future[bool] = concurrent.futures.Future()
                self._loop.call_soon_threadsafe(self._stop_if_idle, stopping)
                if stopping.result():
                    self._on_loop = False  # from now on calls run directly: no lane is left to race them
        if not self._on_loop and loop_thread is not None and loop_thread is not threading.current_thread():
            # Also on a later call: an earlier one may have stopped the loop without waiting for its thread.
            loop_thread.join(max(0.0, deadline - time.monotonic()))
        workers = [*self._workers.values(), *self._retired]
        for worker in workers:
            worker.retire()
        for worker in workers:
            if worker is not threading.current_thread():
                worker.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in (loop_thread, *workers) if t is not None and t.is_alive()]
        if alive:
            logger.warning("task scheduler threads still running after %.1f s: %s", timeout, ", ".join(alive))
        elif not self._loop.is_closed() and not self._loop.is_running():
            self._loop.close()
        return not alive

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # -- queueing -------------------------------------------------------------------------------------

    def enqueue(
        self, task_id: int, task_type: str, job_id: int, params: Any = None, *, bounded: bool = True
    ) -> bool:
        """Queue an LLM task whose row is already in the database; False when it was not queued.

        Past the max queue depth the task is dropped and its row failed "Queue depth limit reached",
        so no row stays queued forever without a queue entry. `bounded=False` skips that check, for work
        whose size was bounded before it got here (the requests of an uploaded batch file).
        """
        if task_type not in self._llm_task_types:
            raise ValueError(
                f"task type {task_type!r} is not an LLM task type of this scheduler "
                f"({', '.join(sorted(self._llm_task_types))}); submit it with submit_task(), "
                "which runs other types on a thread of their own"
            )
        if self._stop.is_set():
            logger.warning("task scheduler is stopped; task %d stays queued in the database", task_id)
            return False

        def add() -> bool:
            full = bounded and self._lanes.depth(task_type) >= self._max_queue_depth
            if full and task_id not in self._lanes.pending(task_type):
                return False
            return self._lanes.enqueue(task_id, task_type, job_id, params, bounded=False)

        if self._call(add):
            return True
        logger.warning(
            "Queue depth limit reached for %s (max=%d) — task %d dropped",
            task_type,
            self._max_queue_depth,
            task_id,
        )
        fail_unfinished_task(self._db_path, task_id, QUEUE_FULL_ERROR)
        return False

    def discard(self, task_id: int) -> bool:
        """Remove a queued task from its queue (after `cancel_task` failed its row); False if absent."""
        return self._call(lambda: self._lanes.discard(task_id))

    def pending_ids(self, task_type: str) -> tuple[int, ...]:
        """Ids waiting in `task_type`'s queue, in the order they will run."""
        return self._call(lambda: self._lanes.pending(task_type))

    def snapshot(self) -> SchedulerSnapshot:
        def read() -> SchedulerSnapshot:
            lanes = self._lanes.snapshot()
            return SchedulerSnapshot(
                queue_depths=MappingProxyType(dict(lanes.queue_depths)),
                active_types=lanes.active_types,
                reserved_vram=self._reserved(),
                available_vram=self._available_vram,
                batches_started=MappingProxyType(dict(lanes.batches_started)),
            )

        return self._call(read)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every queue is empty and no batch runs; False on timeout. For scripts and tests."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if not snap.active_types and not snap.queue_depths:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
