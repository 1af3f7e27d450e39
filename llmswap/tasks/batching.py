"""The TaskScheduler: LLM tasks batched by type, deepest queue first, under VRAM budgets.

Each LLM task type has a FIFO deque. One loop thread wakes on enqueue or batch completion and starts a
batch worker for every type with work, deepest queue first, while the budgets of the active types fit
the available VRAM. A batch worker runs its type's tasks one at a time until the deque is empty, so a
model is loaded once per batch instead of once per task, and tasks queued meanwhile join the batch.

The synchronous adapter's engine (a server runs `tasks:` on asyncio lanes over its router: `lanes.py`).
Threads: the API must stay callable from synchronous apps, and a worker blocking on one task is the batch.
`_lock` guards all mutable state; the database (see `db.py`) is the record of each task's status, the
deques only order the queued LLM rows.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llmswap.tasks.db import QUEUE_FULL_ERROR, fail_unfinished_task, init_db, queued_tasks
from llmswap.tasks.defaults import (
    DEFAULT_MAX_QUEUE_DEPTH,
    LLM_TASK_TYPES,
    check_settings,
    detect_available_vram,
    merged_budgets,
)
from llmswap.tasks.execution import RunTaskFn, default_run_task, run_queued_task

logger = logging.getLogger("llmswap.tasks.scheduler")  # the name Peregrine apps configure

DEFAULT_WAKE_INTERVAL = 30.0
_FIT_TOLERANCE = 1e-9  # budgets are decimal GB in binary floats: 2.5 + 5.0 must fit in 7.5

LOOP_THREAD_NAME = "llmswap-tasks-scheduler"
BATCH_THREAD_PREFIX = "llmswap-tasks-batch-"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A queued LLM task as its deque holds it."""

    id: int
    job_id: int
    params: Any


@dataclass(frozen=True)
class SchedulerSnapshot:
    """A consistent view of the scheduler for stats and tests."""

    queue_depths: Mapping[str, int]  # type -> tasks waiting (not counting the one a worker runs)
    active_types: tuple[str, ...]  # types with a batch worker, sorted
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
        wake_interval: float = DEFAULT_WAKE_INTERVAL,
    ) -> None:
        check_settings(max_queue_depth, available_vram)
        self._db_path = Path(db_path)
        self._run_task: RunTaskFn = run_task_fn or default_run_task
        self._llm_task_types = frozenset(llm_task_types)
        self._budgets: dict[str, float] = merged_budgets(budgets)
        self._available_vram = detect_available_vram() if available_vram is None else float(available_vram)
        self._max_queue_depth = max_queue_depth
        self._wake_interval = wake_interval

        self._queues: dict[str, deque[TaskSpec]] = {}
        self._queued_ids: set[int] = set()  # ids in the deques: a row loaded at startup is not queued twice
        self._active: dict[str, threading.Thread] = {}
        self._reserved_vram = 0.0
        self._batches_started: dict[str, int] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None

        self._warn_about_budgets()
        init_db(self._db_path)
        for row in queued_tasks(self._db_path, self._llm_task_types):
            self._queues.setdefault(row.task_type, deque()).append(TaskSpec(row.id, row.job_id, row.params))
            self._queued_ids.add(row.id)
        if self._queued_ids:
            logger.info("resuming %d queued LLM task(s) from %s", len(self._queued_ids), self._db_path)

    def reconfigure(
        self,
        *,
        llm_task_types: Iterable[str],
        budgets: Mapping[str, float] | None = None,
        available_vram: float | None = None,
        max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
    ) -> None:
        """Change types, budgets, available VRAM and queue depth while running (a config reload).

        A type no longer listed leaves its deque (its rows stay queued in the database, for a later
        config that lists it again); its running batch ends after the task in hand. A newly listed type's
        queued rows load, oldest first, as at construction. Deques already longer than a lowered depth
        keep their tasks: the depth bounds what is added.
        """
        check_settings(max_queue_depth, available_vram)
        merged = merged_budgets(budgets)
        available = detect_available_vram() if available_vram is None else float(available_vram)
        types = frozenset(llm_task_types)
        added = types - self._llm_task_types
        resumed = queued_tasks(self._db_path, added)
        with self._lock:
            self._llm_task_types = types
            self._budgets = merged
            self._available_vram = available
            self._max_queue_depth = max_queue_depth
            for task_type in [t for t in self._queues if t not in types]:
                for spec in self._queues.pop(task_type):
                    self._queued_ids.discard(spec.id)
            for row in resumed:
                if row.id not in self._queued_ids:
                    self._queues.setdefault(row.task_type, deque()).append(
                        TaskSpec(row.id, row.job_id, row.params)
                    )
                    self._queued_ids.add(row.id)
            self._reserved_vram = self._sum_reserved()
            self._idle.notify_all()
        self._warn_about_budgets()
        self._wake.set()

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
        with self._lock:
            return self._reserved_vram

    @property
    def max_queue_depth(self) -> int:
        return self._max_queue_depth

    def handles(self, task_type: str) -> bool:
        """Whether `task_type` is batched here (an LLM type) rather than run on a free thread."""
        return task_type in self._llm_task_types

    def serves(self, db_path: Path | str) -> bool:
        path = Path(db_path)
        return path == self._db_path or path.resolve() == self._db_path.resolve()

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread; the first pass runs at once, so tasks loaded at construction start."""
        with self._lock:
            if self._loop_thread is not None:
                return
            if self._stop.is_set():
                raise RuntimeError("this TaskScheduler was shut down; build a new one")
            self._loop_thread = threading.Thread(target=self._loop, name=LOOP_THREAD_NAME, daemon=True)
            self._loop_thread.start()
        self._wake.set()

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop the loop; workers finish the task in hand and stop. True when every thread ended in time.

        Tasks left in the deques stay queued in the database, and the next scheduler loads them.
        """
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        loop_thread = self._loop_thread
        if loop_thread is not None and loop_thread is not threading.current_thread():
            loop_thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            workers = [w for w in self._active.values() if w is not threading.current_thread()]
            self._idle.notify_all()
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in (loop_thread, *workers) if t is not None and t.is_alive()]
        if alive:
            logger.warning("task scheduler threads still running after %.1f s: %s", timeout, ", ".join(alive))
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
        so no row stays queued forever without a deque entry. `bounded=False` skips that check, for work
        whose size was bounded before it got here (the requests of an uploaded batch file).
        """
        if task_type not in self._llm_task_types:
            raise ValueError(
                f"task type {task_type!r} is not an LLM task type of this scheduler "
                f"({', '.join(sorted(self._llm_task_types))}); submit it with submit_task(), "
                "which runs other types on a thread of their own"
            )
        with self._lock:
            if self._stop.is_set():
                logger.warning("task scheduler is stopped; task %d stays queued in the database", task_id)
                return False
            if task_id in self._queued_ids:
                return True
            queue = self._queues.setdefault(task_type, deque())
            dropped = bounded and len(queue) >= self._max_queue_depth
            if not dropped:
                queue.append(TaskSpec(task_id, job_id, params))
                self._queued_ids.add(task_id)
        if dropped:
            logger.warning(
                "Queue depth limit reached for %s (max=%d) — task %d dropped",
                task_type,
                self._max_queue_depth,
                task_id,
            )
            fail_unfinished_task(self._db_path, task_id, QUEUE_FULL_ERROR)
            return False
        self._wake.set()
        return True

    def discard(self, task_id: int) -> bool:
        """Remove a queued task from its deque (after `cancel_task` failed its row); False if absent."""
        with self._lock:
            if task_id not in self._queued_ids:
                return False
            self._queued_ids.discard(task_id)
            for task_type, queue in self._queues.items():
                kept = deque(spec for spec in queue if spec.id != task_id)
                if len(kept) != len(queue):
                    self._queues[task_type] = kept
                    break
            self._idle.notify_all()
        return True

    def pending_ids(self, task_type: str) -> tuple[int, ...]:
        """Ids waiting in `task_type`'s deque, in the order they will run."""
        with self._lock:
            return tuple(spec.id for spec in self._queues.get(task_type, ()))

    def snapshot(self) -> SchedulerSnapshot:
        with self._lock:
            return SchedulerSnapshot(
                queue_depths=MappingProxyType({t: len(q) for t, q in self._queues.items() if q}),
                active_types=tuple(sorted(self._active)),
                reserved_vram=self._reserved_vram,
                available_vram=self._available_vram,
                batches_started=MappingProxyType(dict(self._batches_started)),
            )

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every deque is empty and no batch runs; False on timeout. For scripts and tests."""
        with self._idle:
            return self._idle.wait_for(self._is_idle, timeout)

    def _is_idle(self) -> bool:
        return not self._active and not any(self._queues.values())

    # -- the loop and the workers ---------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._wake_interval)
            # Clearing before the scan is safe: anything enqueued before the clear is seen by the scan,
            # anything after it sets the event again for the next pass.
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._lock:
                self._reap_dead_workers()
                self._start_eligible_batches()

    def _reap_dead_workers(self) -> None:
        # Defense in depth only: a worker's `finally` removes its own entry before it ends, so this finds
        # something only if a worker thread died without running its `finally`.
        dead = [t for t, thread in self._active.items() if not thread.is_alive()]
        for task_type in dead:
            logger.warning("batch worker for %r ended without releasing its budget; releasing it", task_type)
            del self._active[task_type]
        if dead:
            self._reserved_vram = self._sum_reserved()
            self._idle.notify_all()

    def _start_eligible_batches(self) -> None:
        candidates = sorted(
            (t for t, queue in self._queues.items() if queue and t not in self._active),
            key=lambda t: len(self._queues[t]),
            reverse=True,  # stable sort: equal depths keep first-queued-type order
        )
        for task_type in candidates:
            budget = self._budgets.get(task_type, 0.0)
            # An idle GPU always takes the deepest type, even one whose budget exceeds the total:
            # otherwise that type would wait forever.
            if self._active and self._reserved_vram + budget > self._available_vram + _FIT_TOLERANCE:
                continue
            worker = threading.Thread(
                target=self._batch_worker,
                args=(task_type,),
                name=f"{BATCH_THREAD_PREFIX}{task_type}",
                daemon=True,
            )
            self._active[task_type] = worker
            self._reserved_vram = self._sum_reserved()
            self._batches_started[task_type] = self._batches_started.get(task_type, 0) + 1
            logger.info(
                "starting %s batch (%d queued, %.1f/%.1f GB reserved)",
                task_type,
                len(self._queues[task_type]),
                self._reserved_vram,
                self._available_vram,
            )
            worker.start()

    def _sum_reserved(self) -> float:
        # Recomputed from the active set instead of += / -=, so float error cannot accumulate and the
        # reservation is exactly 0.0 whenever nothing runs.
        return math.fsum(self._budgets.get(t, 0.0) for t in self._active)

    def _batch_worker(self, task_type: str) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    queue = self._queues.get(task_type)
                    if not queue:
                        break
                    task = queue.popleft()
                    self._queued_ids.discard(task.id)
                run_queued_task(self._run_task, self._db_path, task.id, task_type, task.job_id, task.params)
        finally:
            # The one place a batch releases its budget.
            with self._lock:
                if self._active.get(task_type) is threading.current_thread():
                    del self._active[task_type]
                self._reserved_vram = self._sum_reserved()
                self._idle.notify_all()
            self._wake.set()
