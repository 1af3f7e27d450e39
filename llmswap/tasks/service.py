"""Server mode of the task queue: the `tasks:` section's types run through the proxy's own router.

The TaskScheduler keeps its threaded design (batch workers per type, deepest queue first); each task's
handler hops onto the server's event loop and sends the task's params (an OpenAI request body) through
`router.acquire`, so tasks share swapping, queueing and priorities with HTTP traffic (at
`tasks.priority`, below interactive requests by default). Rows written by the CLI while the server runs
are picked up by a poll of the database. The OpenAI Batch API (`batches.py`) adds `batch:<model>` types
beside the configured ones, and the same poll finishes the batches whose requests are all done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from llmswap.activity.recorder import ActivityRecorder
from llmswap.config.model import Config, TasksConfig
from llmswap.tasks import recorded
from llmswap.tasks.batch_store import BATCH_TYPE_PREFIX, batch_types_queued, init_batch_tables
from llmswap.tasks.batches import Batches
from llmswap.tasks.db import (
    TaskRow,
    TaskStatus,
    cancel_task,
    init_db,
    insert_task,
    queued_tasks,
    reset_running_tasks,
    task_stats,
)
from llmswap.tasks.execution import make_run_task
from llmswap.tasks.scheduler import BYTES_PER_GB, TaskScheduler

log = logging.getLogger("llmswap.tasks")

# One "unit" per type when llmswap cannot tell which models fit together: one batch at a time.
_ONE_BATCH = 1.0


class TaskError(Exception):
    """A task's request failed: the message is stored as the row's error."""


class UnknownTaskType(ValueError):
    pass


@dataclass(frozen=True)
class Capacity:
    """What the TaskScheduler may run at once: per-type budgets and the total, in GB (or batch units)."""

    budgets: Mapping[str, float]
    available: float
    unit: str  # "GB" or "batch"


def endpoint_for(params: Mapping[str, Any]) -> str:
    """The OpenAI route a task's body is meant for, from its shape (an explicit `endpoint` wins)."""
    explicit = params.get("endpoint")
    if isinstance(explicit, str) and explicit.startswith("/"):
        return explicit
    if "messages" in params:
        return "/v1/chat/completions"
    if "input" in params:
        return "/v1/embeddings"
    if "prompt" in params:
        return "/v1/completions"
    raise TaskError(
        "params must be an OpenAI request body with messages, prompt or input "
        "(or name its route in an `endpoint` field)"
    )


def plan_capacity(tasks: TasksConfig, router: Any, batch_types: Mapping[str, str] | None = None) -> Capacity:
    """Budgets per task type (the configured ones, and `batch_types`: type -> model) and their total.

    Under the vram router the budgets are real: each type's `vram` (else its model's footprint) against
    the router's memory budget. Other routers cannot tell which models fit together, so types run one
    batch at a time — what a group router with one model loaded at a time needs to avoid swap storms.
    """
    book = getattr(router, "book", None)
    swapper_budgets = getattr(getattr(router, "swapper", None), "budgets", None)
    extra = batch_types or {}
    if book is not None and swapper_budgets:
        budgets = {
            name: (t.vram if t.vram is not None else book.footprint(t.model)) / BYTES_PER_GB
            for name, t in tasks.types.items()
        }
        budgets.update({name: book.footprint(model) / BYTES_PER_GB for name, model in extra.items()})
        return Capacity(budgets, sum(swapper_budgets.values()) / BYTES_PER_GB, "GB")
    return Capacity({name: _ONE_BATCH for name in (*tasks.types, *extra)}, _ONE_BATCH, "batch")


class TaskService:
    """Owns the TaskScheduler of one server; `router_of()` gives the live router (it changes on reload).

    A config reload reaches it through `reconfigure`: types, models, priority, budgets and queue depth
    change in place, without stopping a batch that is running. A reload without `tasks:` disables the
    queue (rows stay in the database); `tasks.db` itself only changes with a restart.
    """

    def __init__(
        self,
        config: Config,
        router_of: Callable[[], Any],
        loop: asyncio.AbstractEventLoop,
        *,
        poll_interval: float = 1.0,
    ) -> None:
        assert config.tasks is not None
        self.tasks: TasksConfig = config.tasks
        self.db: Path = self.tasks.db
        self._router_of = router_of
        self._loop = loop
        self._poll_interval = poll_interval
        self._session: aiohttp.ClientSession | None = None
        # Where task and batch requests are recorded (the app's activity recorder), once the app set it.
        self.recorder: ActivityRecorder | None = None
        self._scheduler: TaskScheduler | None = None
        self._poller: asyncio.Task[None] | None = None
        # Guards the task types and budgets: a reload changes them on the event loop, a batch being
        # created adds its types from the thread it runs on.
        self._types_lock = threading.Lock()
        self.enabled = True  # False after a reload dropped the `tasks:` section
        # `batch:<model>` task types of the Batch API in use (type -> model): they outlive reloads.
        self._batch_types: dict[str, str] = {}
        self.capacity = plan_capacity(self.tasks, router_of())
        self.batches = Batches(self)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Fail what a crash left running, reload what was queued, start the batch loop."""
        init_db(self.db)
        init_batch_tables(self.db)
        interrupted = reset_running_tasks(self.db)
        if interrupted:
            log.warning("tasks: %d task(s) were running when llmswap stopped; marked failed", interrupted)
        # Batches queued before a restart carry on: their types must be known before the rows load.
        self._batch_types = {t: t[len(BATCH_TYPE_PREFIX):] for t in batch_types_queued(self.db)}
        self.capacity = plan_capacity(self.tasks, self._router_of(), self._batch_types)
        self._scheduler = TaskScheduler(
            self.db,
            make_run_task(fallback=self._handle),
            llm_task_types=self._all_types(),
            budgets=self.capacity.budgets,
            available_vram=self.capacity.available,
            max_queue_depth=self.tasks.max_queue_depth,
        )
        self._scheduler.start()
        self._poller = self._loop.create_task(self._poll_database(), name="tasks-db-poll")
        log.info("tasks: %s, types %s, %s", self.db, sorted(self.tasks.types), _capacity_text(self.capacity))

    def reconfigure(self, config: Config) -> None:
        """Follow a reloaded config (see the class docstring)."""
        tasks = config.tasks
        if tasks is None:
            if self.enabled:
                log.warning("tasks: the reloaded config has no `tasks:` section; the task queue is off "
                            "(queued tasks stay in %s; running batches finish the task in hand)", self.db)
            tasks = dataclasses.replace(self.tasks, types={})
            self.enabled = False
        else:
            self.enabled = True
            if tasks.db.resolve() != self.db.resolve():
                log.error("tasks: tasks.db changed from %s to %s; that takes a restart, the queue keeps "
                          "using %s", self.db, tasks.db, self.db)
                tasks = dataclasses.replace(tasks, db=self.db)
        with self._types_lock:
            capacity = plan_capacity(tasks, self._router_of(), self._batch_types)
            if tasks == self.tasks and capacity == self.capacity:
                return
            self.tasks, self.capacity = tasks, capacity
            self._apply_types()
        if self.enabled:
            log.info("tasks: reconfigured: types %s, priority %d, %s", sorted(tasks.types), tasks.priority,
                     _capacity_text(capacity))

    def add_batch_types(self, types: Mapping[str, str]) -> None:
        """Make `batch:<model>` types (type -> model) known to the scheduler, with budgets like any type."""
        with self._types_lock:
            new = {name: model for name, model in types.items() if name not in self._batch_types}
            if not new:
                return
            self._batch_types.update(new)
            self.capacity = plan_capacity(self.tasks, self._router_of(), self._batch_types)
            self._apply_types()

    def _all_types(self) -> list[str]:
        return [*self.tasks.types, *self._batch_types]

    def _apply_types(self) -> None:
        self.scheduler.reconfigure(
            llm_task_types=self._all_types(),
            budgets=self.capacity.budgets,
            available_vram=self.capacity.available,
            max_queue_depth=self.tasks.max_queue_depth,
        )

    def router_of(self) -> Any:
        return self._router_of()

    def http_session(self) -> aiohttp.ClientSession:
        """One session for every request a task sends (made on the event loop, on first use)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def shutdown(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._scheduler is not None:
            # Workers may be blocked on requests that this loop must finish: stop them off the loop.
            await asyncio.to_thread(self._scheduler.shutdown, 5.0)
        if self._session is not None:
            await self._session.close()

    @property
    def scheduler(self) -> TaskScheduler:
        if self._scheduler is None:
            raise RuntimeError("task service not started")
        return self._scheduler

    # ------------------------------------------------------------------ API (event-loop side)

    def submit(self, task_type: str, job_id: int | None, params: Any) -> tuple[int, bool]:
        if task_type not in self.tasks.types:
            known = ", ".join(sorted(self.tasks.types)) or "none configured"
            raise UnknownTaskType(f"unknown task type {task_type!r} (configured: {known})")
        # Without a job id every submission is its own task; with one, a duplicate of a queued or
        # running (type, job) is not queued again (the seed's dedupe).
        task_id, is_new = insert_task(self.db, task_type, job_id or 0, params, dedupe=job_id is not None)
        if is_new:
            self.scheduler.enqueue(task_id, task_type, job_id or 0, params)
        return task_id, is_new

    def cancel(self, task_id: int) -> bool:
        cancelled = cancel_task(self.db, task_id)
        if cancelled:
            self.scheduler.discard(task_id)
        return cancelled

    def stats(self) -> dict[str, Any]:
        snap = self.scheduler.snapshot()
        return {
            "counts": task_stats(self.db),
            "queue_depths": dict(snap.queue_depths),
            "active_batches": sorted(snap.active_types),
            "batches_started": dict(snap.batches_started),
            "reserved": snap.reserved_vram,
            "available": snap.available_vram,
            "unit": self.capacity.unit,
        }

    async def _poll_database(self) -> None:
        # `llmswap tasks submit` writes rows straight into the database; enqueue those we have not seen.
        while True:
            await asyncio.sleep(self._poll_interval)
            try:
                rows = await asyncio.to_thread(queued_tasks, self.db, self.tasks.types.keys())
            except Exception:
                log.exception("tasks: polling %s failed", self.db)
                continue
            pending = set()
            for task_type in self.tasks.types:
                pending.update(self.scheduler.pending_ids(task_type))
            for row in rows:
                # A reload may have dropped the row's type while the database was read.
                if row.id not in pending and self.scheduler.handles(row.task_type):
                    self.scheduler.enqueue(row.id, row.task_type, row.job_id, row.params)
            try:
                await asyncio.to_thread(self.batches.tick)
            except Exception:
                log.exception("tasks: checking the batches in %s failed", self.db)

    # ------------------------------------------------------------------ running one task (worker thread)

    def _handle(self, row: TaskRow) -> Any:
        future = asyncio.run_coroutine_threadsafe(self._run(row), self._loop)
        return future.result()

    async def _run(self, row: TaskRow) -> Any:
        from llmswap.server.filters import apply_plan
        from llmswap.server.inference import local_plan

        if row.task_type.startswith(BATCH_TYPE_PREFIX):
            return await self.batches.run(row)

        task_type = self.tasks.types.get(row.task_type)
        if task_type is None:
            raise TaskError(f"task type {row.task_type!r} was removed from the config by a reload")
        params = row.params if isinstance(row.params, dict) else {}
        path = endpoint_for(params)
        body = {k: v for k, v in params.items() if k != "endpoint"}
        requested = str(body.get("model") or task_type.model)
        body["model"] = requested
        body["stream"] = False
        router = self._router_of()
        recording = recorded.begin(self.recorder, model=task_type.model, requested=requested, path=path,
                                   origin="task")
        waiting = recorded.Waiting()
        try:
            async with router.acquire(task_type.model, priority=self.tasks.priority) as process:
                waiting.granted(recording)
                body, _ = apply_plan(body, local_plan(process.config, requested))
                url = process.config.proxy.rstrip("/") + path
                status, text = await recorded.post_json(self.http_session(), url, body, recording)
        except BaseException as exc:
            if recording is not None:  # refused by the router (or cancelled) before the call
                recording.finish(getattr(exc, "status", 500), error=str(exc) or type(exc).__name__)
            raise
        if status != 200:
            raise TaskError(f"{task_type.model} answered {status}: {text[:500]}")
        try:
            json.loads(text)
        except ValueError as exc:
            raise TaskError(f"{task_type.model} answered non-JSON: {text[:200]}") from exc
        return text


def _capacity_text(capacity: Capacity) -> str:
    return "one batch at a time" if capacity.unit == "batch" else f"{capacity.available:.1f} GB shared"


def row_json(row: TaskRow) -> dict[str, Any]:
    """A task row as the HTTP API shows it."""
    result: Any = row.result
    if isinstance(result, str):
        try:
            result = json.loads(result)
        except ValueError:
            pass
    return {
        "id": row.id,
        "type": row.task_type,
        "job_id": row.job_id,
        "status": row.status.value if isinstance(row.status, TaskStatus) else str(row.status),
        "params": row.params,
        "result": result,
        "error": row.error,
        "created_at": row.created_at,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
    }
