"""Server mode of the task queue: the `tasks:` section's types run through the proxy's own router.

The task queue is a client of the router: its lanes (`lanes.py`, asyncio, on the server's loop) send each
task's params (an OpenAI request body) down the one dispatch path HTTP requests take, so tasks share
swapping, queueing, priorities, filters and timeouts with HTTP traffic (at `tasks.priority`, below
interactive requests by default). Each request carries its type's queue depth as a backlog hint, so which
type runs next and which run side by side is the router's scheduler's and swapper's answer. A lane takes
the router's grant first and only then claims the task's row, so a task waiting for its model is still
`queued` (a restart runs it, instead of failing it as interrupted). Rows written
by the CLI while the server runs are picked up by a poll of the database. The OpenAI Batch API
(`batches.py`) adds `batch:<model>` types beside the configured ones, and the same poll finishes the
batches whose requests are all done.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import logging
import socket
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from llmswap.config.model import Config, TasksConfig
from llmswap.router import AcquireOptions
from llmswap.scheduler.errors import Preempted, SchedulerError, ShuttingDown
from llmswap.tasks.batch_api.batches import Batches
from llmswap.tasks.batch_api.store import BATCH_TYPE_PREFIX, batch_types_queued
from llmswap.tasks.queue.claims import Claims
from llmswap.tasks.queue.db import (
    TaskRow,
    TaskStatus,
    cancel_task,
    fail_unfinished_task,
    get_task,
    init_db,
    insert_task,
    queued_tasks,
    reset_running_tasks,
    task_stats,
)
from llmswap.tasks.queue.hosts import QueueHost
from llmswap.tasks.queue.lanes import Queued, TaskLanes, claiming, log_failure, requeue_preempted_task
from llmswap.tasks.queue.shared import any_queued
from llmswap.tasks.queue.sql import PostgresDb, TaskDb, display, task_db
from llmswap.upstream import Dispatcher, UpstreamUnreachable
from llmswap.upstream.dispatcher import Lease

log = logging.getLogger("llmswap.tasks")

# Seconds a submission at startup waits for a shared queue's first join attempt: longer than the pool's
# 5 s wait for a connection, after which a database that is away is known to be.
SETTLE_WAIT = 8.0


# The router's grant a lane holds for the task in hand, set around its claim and POST (in the lane's task).
_GRANT: contextvars.ContextVar[Lease | None] = contextvars.ContextVar("llmswap_task_grant", default=None)


class TaskError(Exception):
    """A task's request failed: the message is stored as the row's error."""


class UnknownTaskType(ValueError):
    pass


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


class TaskService:
    """Owns the task lanes of one server; `router_of()` gives the live router (it changes on reload).

    A config reload reaches it through `reconfigure`: types, models, priority and queue depth change in
    place, without stopping a batch that is running. A reload without `tasks:` disables the queue (rows
    stay in the database); `tasks.db` itself only changes with a restart. Every method runs on the event
    loop; the database work goes to worker threads.
    """

    def __init__(
        self,
        config: Config,
        router_of: Callable[[], Any],
        dispatcher: Dispatcher,
        loop: asyncio.AbstractEventLoop,
        *,
        poll_interval: float = 1.0,
        host: str = "",
    ) -> None:
        assert config.tasks is not None
        self.tasks: TasksConfig = config.tasks
        self.db: TaskDb = task_db(self.tasks.db)  # a PostgreSQL database's pool is this service's
        self.host = self.tasks.host or host or socket.gethostname()
        self._models = served_models(config)
        self._router_of = router_of
        self.dispatcher = dispatcher
        self._loop = loop
        self._poll_interval = poll_interval
        self._poller: asyncio.Task[None] | None = None
        self._opening: asyncio.Task[None] | None = None
        self._open = asyncio.Event()  # set once the database was prepared (or could not be)
        self.enabled = True  # False after a reload dropped the `tasks:` section
        # `batch:<model>` task types of the Batch API in use (type -> model): they outlive reloads.
        self._batch_types: dict[str, str] = {}
        # On a shared (PostgreSQL) queue this host claims under leases once it has joined (`hosts.py`).
        self.queue_host: QueueHost | None = None
        self._wake = asyncio.Event()
        if isinstance(self.db, PostgresDb):
            self.queue_host = QueueHost(self.db, self.host, lease_seconds=self.tasks.lease_seconds,
                                        max_preemptions=lambda: self.tasks.max_preemptions,
                                        served=self._served, wake=self._wake.set)
        owner = self.queue_host.instance if self.queue_host is not None else None
        self.claims = Claims(self.db, self.host, owner=owner,
                             lease_seconds=self.tasks.lease_seconds)
        self.lanes = TaskLanes(self.db, self._run_item, max_queue_depth=self.tasks.max_queue_depth,
                               running=self.queue_host is None)
        self.batches = Batches(self)
        self._claim_and_run = claiming(
            self.claims, self._run, max_preemptions=lambda: self.tasks.max_preemptions,
            on_preempted=self.lanes.preempted, on_claimed=self.lanes.discard,
            stopping=lambda: self.lanes.stopping,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Begin, without waiting for the database (at startup, or inside the reload that adds `tasks:`):
        a task prepares it on a worker thread, failing what a crash left running, then loads what was
        queued and starts polling. A shared queue's host joins in the background (`hosts.py`). Requests
        to the queue wait for either, bounded (`settled`)."""
        if self.queue_host is not None:
            self.lanes.set_types(self._all_types(), self.tasks.max_queue_depth)
            self.queue_host.start()
            self._open.set()
            self._poller = self._loop.create_task(self._poll_database(), name="tasks-db-poll")
        else:
            self._opening = self._loop.create_task(self._open_sqlite(), name="tasks-db-open")
        log.info("tasks: %s as host %s, types %s", display(self.db), self.host, sorted(self.tasks.types))

    async def _open_sqlite(self) -> None:
        try:
            interrupted, batch_types = await asyncio.to_thread(_prepare, self.db)
        except Exception:
            log.exception("tasks: preparing %s failed", display(self.db))
            return
        finally:
            self._open.set()
        if interrupted:
            log.warning("tasks: %d task(s) were running when llmswap stopped; marked failed", interrupted)
        # Batches queued before a restart carry on: their types must be known before the rows load.
        self._batch_types.update({t: t[len(BATCH_TYPE_PREFIX):] for t in batch_types})
        self._after(self.lanes.load(self.lanes.set_types(self._all_types(), self.tasks.max_queue_depth)))
        self._poller = self._loop.create_task(self._poll_database(), name="tasks-db-poll")

    def _after(self, work: Coroutine[Any, Any, None]) -> None:
        self._loop.create_task(work).add_done_callback(log_failure("loading the queued tasks"))

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
            if not same_db(task_db(tasks.db), self.db) or tasks.host not in (None, self.host):
                log.error("tasks: tasks.db or tasks.host changed; that takes a restart, the queue keeps "
                          "using %s as host %s", display(self.db), self.host)
                tasks = dataclasses.replace(tasks, db=self.tasks.db, host=self.tasks.host)
        self._models = served_models(config)
        if tasks == self.tasks:
            return
        self.tasks = tasks
        if self._open.is_set():  # else the database's preparation loads the new types when it is done
            self._after(self.lanes.load(self.lanes.set_types(self._all_types(), tasks.max_queue_depth)))
        if self.enabled:
            log.info("tasks: reconfigured: types %s, priority %d", sorted(tasks.types), tasks.priority)

    def add_batch_types(self, types: Mapping[str, str]) -> None:
        """Make `batch:<model>` types (type -> model) known to the lanes, like any configured type.

        Called from the worker thread that creates a batch: the change hops onto the loop, ahead of the
        batch's rows (`enqueue_threadsafe` keeps that order)."""
        new = {name: model for name, model in types.items() if name not in self._batch_types}
        if new and self.queue_host is None:  # shared: the lanes take every model's batch type already
            self._batch_types.update(new)
            self._loop.call_soon_threadsafe(self.lanes.set_types, self._all_types())

    def _all_types(self) -> list[str]:
        if self.queue_host is not None:
            models = sorted(set(self._models.values()))
            return [*self.tasks.types, *(f"{BATCH_TYPE_PREFIX}{model}" for model in models)]
        return [*self.tasks.types, *self._batch_types]

    def _served(self) -> tuple[list[str], Mapping[str, str]]:
        """What this host registers in a shared queue: the task types its lanes run, and its models."""
        return (self._all_types() if self.enabled else []), self._models

    def model_id(self, config: Config, name: str) -> str | None:
        """The model id a batch line's `model` names: here, or (shared queue) on a live host."""
        here = config.real_model_name(name)
        if here is not None or self.queue_host is None:
            return here
        return self.queue_host.model_id(name)

    def router_of(self) -> Any:
        return self._router_of()

    async def shutdown(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await self.lanes.shutdown(5.0)
        if self.queue_host is not None:
            await self.queue_host.stop()
        if isinstance(self.db, PostgresDb):
            await asyncio.to_thread(self.db.close)

    # ------------------------------------------------------------------ API

    def enqueue_threadsafe(self, task_id: int, task_type: str, job_id: int) -> None:
        """Queue a row written from a worker thread (a batch being created): on the loop, in call order."""
        self._loop.call_soon_threadsafe(lambda: self.lanes.enqueue(task_id, task_type, job_id, bounded=False))

    def discard_threadsafe(self, task_id: int) -> None:
        self._loop.call_soon_threadsafe(self.lanes.discard, task_id)

    async def settled(self) -> None:
        """Until the database is prepared (SQLite) or, on a shared queue, this host's first join attempt has
        an answer (bounded): a request right after startup then finds the tables, or the outage found."""
        if not self._open.is_set():
            await self._open.wait()
        host = self.queue_host
        if host is not None and not host.settled.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(host.settled.wait(), SETTLE_WAIT)

    async def submit(self, task_type: str, job_id: int | None, params: Any) -> tuple[int, bool]:
        await self.settled()
        if task_type not in self.tasks.types:
            await self._check_served(task_type)
        # Without a job id every submission is its own task; with one, a duplicate of a queued or
        # running (type, job) is not queued again (the seed's dedupe).
        task_id, is_new = await asyncio.to_thread(
            insert_task, self.db, task_type, job_id or 0, params, dedupe=job_id is not None
        )
        if is_new and self.lanes.handles(task_type):
            self.lanes.enqueue(task_id, task_type, job_id or 0)
        return task_id, is_new

    async def cancel(self, task_id: int) -> bool:
        cancelled = await asyncio.to_thread(cancel_task, self.db, task_id)
        if cancelled:
            self.lanes.discard(task_id)
        return cancelled

    async def stats(self) -> dict[str, Any]:
        snap = self.lanes.snapshot()
        return {
            "counts": await asyncio.to_thread(task_stats, self.db),
            "queue_depths": dict(snap.queue_depths),
            "active_batches": list(snap.active_types),
            "batches_started": dict(snap.batches_started),
            "preempted": {"requeued": dict(snap.requeued), "gave_up": dict(snap.gave_up)},
            "host": self.host,
            "hosts": self.hosts_json(),
        }

    def hosts_json(self) -> list[dict[str, Any]]:
        """The hosts of a shared queue (empty on SQLite): name, live, heartbeat age, task types."""
        if self.queue_host is None:
            return []
        lease = self.queue_host.lease_seconds
        return [{"name": h.name, "live": h.live(lease), "heartbeat_age": round(h.age, 3),
                 "types": list(h.types), "this": h.name == self.host} for h in self.queue_host.hosts]

    async def _check_served(self, task_type: str) -> None:
        """A type this host does not run is accepted when a live host of the shared queue runs it."""
        if self.queue_host is not None and not task_type.startswith(BATCH_TYPE_PREFIX):  # the Batch API's own
            await self.queue_host.refresh()
            if self.queue_host.serving(task_type):
                return
        served = self.queue_host.live_types() if self.queue_host is not None else set()
        known = sorted(set(self.tasks.types) | {t for t in served if not t.startswith(BATCH_TYPE_PREFIX)})
        where = "served by the live hosts" if self.queue_host is not None else "configured"
        raise UnknownTaskType(f"unknown task type {task_type!r} ({where}: {', '.join(known) or 'none'})")

    async def _poll_database(self) -> None:
        # SQLite: `llmswap tasks submit` writes rows straight into the file; a poll enqueues those unseen.
        # Shared: a wake-up (`hosts.py`) or the heartbeat's safety net re-reads the queue.
        while True:
            if self.queue_host is None:
                await asyncio.sleep(self._poll_interval)
            else:
                await self._wake.wait()
                self._wake.clear()
                if not self.queue_host.joined.is_set():
                    continue
                self.lanes.begin()
            before = self.lanes.pending_ids()
            try:
                rows = await asyncio.to_thread(queued_tasks, self.db, set(self._all_types()))
            except Exception:
                log.exception("tasks: reading the queue in %s failed", display(self.db))
                continue
            pending = self.lanes.pending_ids()
            for row in rows:
                # A reload may have dropped the row's type while the database was read.
                # The depth bound is this host's own: rows another host accepted are not refused here.
                if row.id not in pending and self.lanes.handles(row.task_type):
                    self.lanes.enqueue(row.id, row.task_type, row.job_id, bounded=self.queue_host is None)
            if self.queue_host is not None:  # what another host claimed meanwhile leaves the lanes
                for task_id in before - {row.id for row in rows}:
                    self.lanes.discard(task_id)
            try:
                await asyncio.to_thread(self.batches.tick)
            except Exception:
                log.exception("tasks: checking the batches in %s failed", display(self.db))

    # ------------------------------------------------------------------ running one task

    def model_of(self, task_type: str) -> str | None:
        """The model a task type's tasks go to (None: a type a reload removed)."""
        if task_type.startswith(BATCH_TYPE_PREFIX):
            return task_type[len(BATCH_TYPE_PREFIX):]
        configured = self.tasks.types.get(task_type)
        return configured.model if configured is not None else None

    async def _run_item(self, task_type: str, item: Queued) -> None:
        """Wait for the router's grant, telling it the type's queue depth; then claim the row and run it."""
        model = self.model_of(task_type)
        if model is None:
            await self._claim_and_run(task_type, item)  # fails the row: its type is gone
            return
        if self.queue_host is not None and not await asyncio.to_thread(any_queued, self.db, task_type):
            return  # other hosts took (or a user cancelled) every task of the type: no grant to ask for
        while True:
            try:
                asking = AcquireOptions(
                    priority=self.tasks.priority,
                    backlog=lambda: self.lanes.depth(task_type),  # what the lane has queued behind this task
                )
                async with self.dispatcher.lease(model, asking) as lease:
                    token = _GRANT.set(lease)
                    try:
                        await self._claim_and_run(task_type, item)
                    finally:
                        _GRANT.reset(token)
                return
            except Preempted as exc:
                row = await asyncio.to_thread(get_task, self.db, item.id)
                if row is not None and row.status is TaskStatus.QUEUED:
                    continue  # preempted before its row was claimed: it never started; ask again
                # Its upstream call was abandoned: the attempt did not run, the row goes back to the head.
                await requeue_preempted_task(self.claims, task_type, item, exc, self.tasks.max_preemptions,
                                             self.lanes.preempted)
                return
            except ShuttingDown:
                log.info("task %d (%s) stays queued: the router is shutting down", item.id, task_type)
                return
            except SchedulerError as exc:  # the router refused it (unknown model, a limit...)
                log.warning("task %d (%s) failed: %s", item.id, task_type, exc)
                await self._fail(item.id, exc)
                return

    async def _fail(self, task_id: int, exc: Exception) -> None:
        await asyncio.to_thread(fail_unfinished_task, self.db, task_id, f"{type(exc).__name__}: {exc}")

    async def _run(self, row: TaskRow) -> Any:
        if row.task_type.startswith(BATCH_TYPE_PREFIX):
            return await self.batches.run(row, _GRANT.get())

        task_type = self.tasks.types.get(row.task_type)
        if task_type is None:
            raise TaskError(f"task type {row.task_type!r} was removed from the config by a reload")
        params = row.params if isinstance(row.params, dict) else {}
        path = endpoint_for(params)
        body = {k: v for k, v in params.items() if k != "endpoint"}
        requested = str(body.get("model") or task_type.model)
        body["model"] = requested
        body["stream"] = False
        try:
            answer = await self.dispatcher.post_json(
                task_type.model, path, body, requested=requested, origin="task", priority=self.tasks.priority,
                lease=_GRANT.get(),
            )
        except UpstreamUnreachable as exc:
            raise TaskError(str(exc)) from exc
        if answer.status != 200:
            raise TaskError(f"{task_type.model} answered {answer.status}: {answer.text[:500]}")
        try:
            json.loads(answer.text)
        except ValueError as exc:
            raise TaskError(f"{task_type.model} answered non-JSON: {answer.text[:200]}") from exc
        return answer.text


def served_models(config: Config) -> dict[str, str]:
    """Every model id and alias of `config` -> the model id (what a host of a shared queue serves)."""
    return {**{model: model for model in config.models}, **dict(config.aliases)}


def same_db(a: TaskDb, b: TaskDb) -> bool:
    if isinstance(a, Path) and isinstance(b, Path):
        return a.resolve() == b.resolve()
    return a == b


def _prepare(db: TaskDb) -> tuple[int, list[str]]:
    """On a worker thread: the tables made, the tasks a crash left running failed (how many), and the
    Batch API's types with queued rows."""
    init_db(db)
    return reset_running_tasks(db), list(batch_types_queued(db))
