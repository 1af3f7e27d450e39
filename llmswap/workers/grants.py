"""The main process's side of its workers' leases: every request a worker serves is granted here, by the one
scheduler, and counts in flight here until the worker says it ended.

Messages (see `channel`), worker to main:
  ("lease", rid, model, priority, api_key, deadline_ms, method, path, headers, peer)  # headers: pairs
  ("end", rid, outcome)  # outcome: None = served, "cancelled" = its cancel ended it, else why it failed
and main to worker:
  ("granted", rid, waited, load)  # seconds asked to granted; of those, seconds its model spent loading
  ("refused", rid, status, code, message, retry_after)  # the scheduler's error, for the worker to answer
  ("cancel", rid, why, shown_id)  # why: None for the in-flight list's cancel (of its entry `shown_id`),
                                 # else a preemption's reason

A request granted at once is granted as the message is read (`Dispatcher.lease_now`); one that must wait
waits in a task of its own here, in the router's queue like any other. What serves the request, for the
router's preemption and for the in-flight list's cancel, is a `RemoteHolder`: cancelling it tells the worker
(and takes a request that still waits out of the queue). A worker that goes away ends everything it held.

The in-flight list is the server's: `Entries` opens and closes its entries, so this package does not import
the server (the server starts the workers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from llmswap.dispatch.dispatcher import Dispatcher, HeldLease
from llmswap.router import AcquireOptions
from llmswap.scheduler.errors import SchedulerError
from llmswap.workers.channel import Channel, Message

log = logging.getLogger("llmswap.workers")


class Shown(NamedTuple):
    """What the in-flight list shows of a worker's request."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    peer: str | None


class Entries(Protocol):
    """The server's in-flight list, for requests served elsewhere."""

    def open(self, shown: Shown, model: str, holder: RemoteHolder) -> object: ...

    def close(self, entry: object) -> None: ...


class WorkerGone(ConnectionError):
    """The worker serving the request went away (its channel closed)."""


class RemoteHolder:
    """What serves a worker's request, as the router and the in-flight list see it (`router.types.Holder`):
    `cancel` tells the worker, and takes the request out of the queue when it still waits."""

    __slots__ = ("_cancels", "channel", "ended", "rid", "shown_id", "waiting")

    def __init__(self, channel: Channel, rid: int) -> None:
        self.channel = channel
        self.rid = rid
        self.waiting: asyncio.Task[None] | None = None  # while it waits in the queue here
        self.ended = False
        self.shown_id: str | None = None  # the id the in-flight list shows it under (set by the list)
        self._cancels = 0

    def done(self) -> bool:
        return self.ended

    def cancel(self, msg: Any | None = None) -> bool:
        """`msg` None: the in-flight list's cancel; a text: a preemption, and why."""
        if self.ended:
            return False
        self._cancels += 1
        if self.waiting is not None:
            self.waiting.cancel()
        self.channel.send(("cancel", self.rid, None if msg is None else str(msg), self.shown_id))
        return True

    def cancelling(self) -> int:
        return self._cancels

    def uncancel(self) -> int:
        self._cancels = max(0, self._cancels - 1)
        return self._cancels


class _Served:
    """One worker request while it is here: its holder, entry, and lease or wait."""

    __slots__ = ("ended", "entry", "held", "holder")

    def __init__(self, holder: RemoteHolder, entry: object) -> None:
        self.holder = holder
        self.entry = entry
        self.held: HeldLease | None = None  # granted at once
        self.ended: asyncio.Future[BaseException | None] | None = None  # granted after a wait


class GrantService:
    """Grants the leases of every worker's requests (`attach` each worker's channel)."""

    def __init__(self, dispatcher_of: Callable[[], Dispatcher], entries: Entries) -> None:
        self._dispatcher_of = dispatcher_of
        self._entries = entries
        self._served: dict[tuple[Channel, int], _Served] = {}

    def __len__(self) -> int:
        """Worker requests here now (asked, waiting or granted)."""
        return len(self._served)

    def on_message(self, channel: Channel, message: Message) -> None:
        kind = message[0]
        if kind == "lease":
            self._lease(channel, message)
        elif kind == "end":
            self._end(channel, message[1], _error(message[2]))
        else:
            log.warning("a worker sent an unknown message %r; ignored", kind)

    def on_lost(self, channel: Channel, error: BaseException | None) -> None:
        """The worker is gone: everything it asked for or held ends."""
        if error is not None:
            log.warning("a worker's channel broke: %s", error)
        for key in [key for key in self._served if key[0] is channel]:
            self._end(channel, key[1], WorkerGone("the worker serving it went away"))

    def _lease(self, channel: Channel, message: Message) -> None:
        _, rid, model, priority, api_key, deadline_ms, method, path, headers, peer = message
        holder = RemoteHolder(channel, rid)
        served = _Served(holder, self._entries.open(Shown(method, path, tuple(headers), peer), model, holder))
        options = AcquireOptions(priority=priority, api_key=api_key, deadline_ms=deadline_ms, holder=holder)
        self._served[(channel, rid)] = served
        dispatcher = self._dispatcher_of()
        try:
            held = dispatcher.lease_now(model, options, origin="http")
        except SchedulerError as err:
            self._refuse(channel, rid, err)
            return
        if held is None:
            holder.waiting = asyncio.get_running_loop().create_task(
                self._wait(dispatcher, channel, rid, model, options, served), name=f"worker-lease:{model}")
            return
        served.held = held
        channel.send(("granted", rid, held.lease.waited, 0.0))

    async def _wait(self, dispatcher: Dispatcher, channel: Channel, rid: int, model: str,
                    options: AcquireOptions, served: _Served) -> None:
        load = 0.0

        def on_granted(seconds: float) -> None:
            nonlocal load
            load = seconds

        asking = replace(options, on_granted=on_granted)
        try:
            async with dispatcher.lease(model, asking, origin="http") as lease:
                served.holder.waiting = None  # granted: a cancel now goes to the worker only
                served.ended = asyncio.get_running_loop().create_future()
                channel.send(("granted", rid, lease.waited, load))
                error = await served.ended
                if error is not None:
                    raise error
        except SchedulerError as err:
            if served.ended is None:  # refused while it waited (a deadline, a failed load...)
                self._refuse(channel, rid, err)
        except (asyncio.CancelledError, ConnectionError, _Failed):
            pass  # it left the queue (the worker's end, a cancel), or its end was told to the router

    def _refuse(self, channel: Channel, rid: int, err: SchedulerError) -> None:
        channel.send(("refused", rid, err.status, err.code, err.message, err.retry_after))
        self._close(channel, rid)

    def _end(self, channel: Channel, rid: int, error: BaseException | None) -> None:
        served = self._close(channel, rid)
        if served is None:
            return
        if served.held is not None:
            served.held.release(error)
        elif served.ended is not None:
            if not served.ended.done():
                served.ended.set_result(error)
        elif served.holder.waiting is not None:
            served.holder.waiting.cancel()  # still in the queue: it leaves

    def _close(self, channel: Channel, rid: int) -> _Served | None:
        served = self._served.pop((channel, rid), None)
        if served is not None:
            served.holder.ended = True
            self._entries.close(served.entry)
        return served


class _Failed(Exception):
    """A worker's request that failed: what the router's records say of it."""


def _error(outcome: str | None) -> BaseException | None:
    if outcome is None:
        return None
    if outcome == "cancelled":
        return asyncio.CancelledError()  # a preemption's cancel comes back as what ended the request
    return _Failed(outcome)
