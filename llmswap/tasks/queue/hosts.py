"""This llmswap's place in a task queue several hosts share on PostgreSQL: join, heartbeat, wake-ups, leave.

`QueueHost` runs two asyncio tasks on the server's loop. The heartbeat registers the host (its name, the
task types and models it serves), renews the leases of the tasks it runs and sends back to the queue the
tasks of hosts whose leases ran out (`shared.reap`), every `leaseSeconds / 3`. The listener holds one
connection in `LISTEN llmswap_tasks`: a task queued on any host (or sent back) wakes this one at once
(`wake()`), so no host polls for work; the heartbeat's own re-read of the queue is only the safety net
for a wake-up lost while the listener reconnected.

Joining creates or migrates the tables (retried while the database cannot be reached, so an llmswap may
start before its database), and waits while another live llmswap holds the same name (the one a `kill -9`
left has not timed out yet), at most two leases; then the tasks that predecessor held go back to the queue
at once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping

from llmswap.tasks.queue import shared
from llmswap.tasks.queue.db import NOTIFY_CHANNEL, TaskDatabaseError, init_db
from llmswap.tasks.queue.shared import HostEntry, HostNameTaken
from llmswap.tasks.queue.sql import PostgresDb, display

log = logging.getLogger("llmswap.tasks")

Served = Callable[[], tuple[list[str], Mapping[str, str]]]  # (task types, model name -> model id)


class QueueHost:
    def __init__(
        self, db: PostgresDb, name: str, *, lease_seconds: float, max_preemptions: Callable[[], int],
        served: Served, wake: Callable[[], None],
    ) -> None:
        self.db = db
        self.name = name
        self.instance = secrets.token_hex(8)
        self.lease_seconds = lease_seconds
        self.interval = max(lease_seconds / 3, 0.2)
        self._max_preemptions = max_preemptions
        self._served = served
        self._wake = wake
        self.joined = asyncio.Event()
        # Set once the first join attempt has an answer: joined, or the database found away. A submission
        # that comes at startup waits for it (briefly) rather than meet a database whose tables are being
        # made (`TaskService.settled`).
        self.settled = asyncio.Event()
        self._tables = False  # the tables are made (or migrated) and at this code's version
        self.failed: str | None = None  # why this host could not join (its name is taken)
        self.hosts: list[HostEntry] = []  # every registered host, as the last heartbeat read them
        self._tasks: list[asyncio.Task[None]] = []
        # Why the database cannot be reached, while it cannot: an outage is one warning when it begins and
        # one line when it ends, whichever of the join, the heartbeat or the listener meets it.
        self.outage: str | None = None

    def start(self) -> None:
        """Join in the background: the tables are made (or checked) in a worker thread as the host joins,
        retried while the database is away, so llmswap serves its models at once whatever the database does.
        Until then task requests answer 503 (`TaskDatabaseUnavailable`); then heartbeat and listen."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._heartbeat(), name="tasks-heartbeat"),
                       loop.create_task(self._listen(), name="tasks-listen")]

    # ------------------------------------------------------------------ what the others serve

    def live(self) -> list[HostEntry]:
        return [h for h in self.hosts if h.live(self.lease_seconds)]

    def serving(self, task_type: str) -> list[str]:
        """The live hosts that serve `task_type`, by name."""
        return [h.name for h in self.live() if task_type in h.types]

    def live_types(self) -> set[str]:
        return {t for h in self.live() for t in h.types}

    def model_id(self, name: str) -> str | None:
        """The model id a live host serves under `name` (an id or an alias there), or None. Called from a
        worker thread (a batch being created): on a miss the hosts are read again, a host may have just
        joined."""
        for attempt in range(2):
            for host in self.live():
                if name in host.models:
                    return host.models[name]
            if attempt == 0:
                self.hosts = shared.hosts(self.db)
        return None

    async def refresh(self) -> None:
        self.hosts = await asyncio.to_thread(shared.hosts, self.db)

    # ------------------------------------------------------------------ heartbeat

    async def _beat(self) -> None:
        types, models = self._served()
        await asyncio.to_thread(shared.register, self.db, name=self.name, instance=self.instance, types=types,
                                models=models, lease_seconds=self.lease_seconds)
        await self.refresh()

    async def _join(self) -> bool:
        deadline = asyncio.get_running_loop().time() + 2 * self.lease_seconds + self.interval
        while True:
            try:
                if not self._tables:
                    await asyncio.to_thread(init_db, self.db)
                    self._tables = True
                await self._beat()
                break
            except TaskDatabaseError as exc:  # made by a newer llmswap: waiting will not help
                self.settled.set()
                self.failed = str(exc)
                log.error("tasks: %s; this host runs no tasks from the shared queue", exc)
                return False
            except HostNameTaken as exc:
                if asyncio.get_running_loop().time() > deadline:
                    self.settled.set()
                    self.failed = str(exc)
                    log.error("tasks: %s; this host runs no tasks from the shared queue", exc)
                    return False
                log.warning("tasks: %s; waiting for its heartbeat to lapse", exc)
            except Exception as exc:  # the database is not there yet
                self._down(exc)
            await asyncio.sleep(self.interval)
        try:
            self._report(await asyncio.to_thread(shared.reap, self.db, self._max_preemptions(),
                                                 predecessor_of=(self.name, self.instance)))
        except Exception as exc:  # their leases lapse anyway, and any host's heartbeat reaps them then
            log.warning("tasks: taking back the tasks of an earlier %s failed: %s", self.name, exc)
        self._up()
        log.info("tasks: host %s joined the shared queue at %s", self.name, display(self.db))
        self.joined.set()
        self.settled.set()
        self._wake()
        return True

    async def _heartbeat(self) -> None:
        if not await self._join():
            return
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._beat()
                self._report(await asyncio.to_thread(shared.reap, self.db, self._max_preemptions()))
                self._up()
            except HostNameTaken as exc:
                log.error("tasks: %s (this host's heartbeat lapsed and another took its name)", exc)
            except Exception as exc:
                self._down(exc)
            self._wake()  # the safety net: look at the queue again

    def _down(self, exc: BaseException) -> None:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        self.settled.set()
        if self.outage is None:
            log.warning("tasks: the shared queue's database %s cannot be reached (%s); models are served as "
                        "before, task requests answer 503 until it is back", display(self.db), reason)
        else:
            log.debug("tasks: the shared queue's database is still away: %s", reason)
        self.outage = reason

    def _up(self) -> None:
        if self.outage is not None:
            log.info("tasks: the shared queue's database %s answers again", display(self.db))
        self.outage = None

    def _report(self, reaped: list[shared.Reaped]) -> None:
        for task in reaped:
            log.warning("task %d (%s) %s: its host %s stopped renewing its lease", task.id, task.task_type,
                        "is back in the queue" if task.requeued else "failed", task.host)

    # ------------------------------------------------------------------ wake-ups

    async def _listen(self) -> None:
        import psycopg

        delay = 0.2
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.db.url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    delay = 0.2
                    self._wake()  # what was queued while this host was not listening
                    async for _ in conn.notifies():
                        self._wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the heartbeat reports the outage; this only retries
                log.debug("tasks: listening to %s failed (%s); again in %.1f s", display(self.db), exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    # ------------------------------------------------------------------ leaving

    async def stop(self) -> None:
        """Stop the heartbeat and the listener, send back what this host still holds, and deregister."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self.joined.is_set():
            return
        try:
            self._report(await asyncio.to_thread(shared.reap, self.db, self._max_preemptions(),
                                                 held_by=self.instance))
            await asyncio.to_thread(shared.leave, self.db, name=self.name, instance=self.instance)
        except Exception as exc:
            log.warning("tasks: leaving the shared queue at %s failed: %s", display(self.db), exc)
