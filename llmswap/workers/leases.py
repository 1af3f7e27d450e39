"""A worker process's leases: each asked of the main process over the control channel (`grants` there has
the messages), so the one scheduler there counts, queues, limits and preempts the worker's requests as its
own.

`RemoteLeases.lease` is what `Dispatcher.lease` is in the main process, for the front's fast path: it
yields a `Lease` on this process's own connection pool once main granted it, raises the scheduler's error
when main refused it, and tells main how the request ended. Main may cancel a request it granted: an
in-flight cancel runs the request's `on_cancel` (the front's own cancel, which gives the client a clean
end); a preemption cancels the task serving it, and the lease raises `Preempted` in place of that
cancellation, as `Grant` does in the main process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from llmswap.config.model import ModelConfig
from llmswap.dispatch.dispatcher import Lease
from llmswap.dispatch.pool import UpstreamPool
from llmswap.router import AcquireOptions
from llmswap.router.types import ProcessLike
from llmswap.scheduler.errors import Preempted, SchedulerError
from llmswap.workers.channel import Channel, Message
from llmswap.workers.grants import Shown

REMOTE_LEASES = "remote_leases"  # the `ServerState.extras` key of a worker process's `RemoteLeases`


class Refused(SchedulerError):
    """The main process's scheduler refused the request: its status, code and message, as it said them."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.status = status
        self.code = code


class MainGone(ConnectionError):
    """The main process went away: no lease can be granted or kept."""


class _ModelOnly:
    """The process a worker's lease names: only its id and config exist here (the process is main's)."""

    __slots__ = ("config", "id")

    def __init__(self, config: ModelConfig) -> None:
        self.id = config.id
        self.config = config


class _Asked:
    __slots__ = ("on_cancel", "preempted", "reply", "task")

    def __init__(self, reply: asyncio.Future[Message], task: asyncio.Task[Any] | None,
                 on_cancel: Callable[[str | None], object]) -> None:
        self.reply = reply
        self.task = task
        self.on_cancel = on_cancel
        self.preempted: str | None = None


class RemoteLeases:
    """The leases of one worker; `on_message` and `on_lost` are its channel's callbacks."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.channel: Channel | None = None
        self._ids = itertools.count(1)
        self._asked: dict[int, _Asked] = {}

    def __len__(self) -> int:
        return len(self._asked)

    def on_message(self, channel: Channel, message: Message) -> None:
        kind, rid = message[0], message[1]
        asked = self._asked.get(rid)
        if asked is None:
            return  # it ended here first; main hears of that end
        if kind == "cancel":
            why = message[2]
            if why is None:
                asked.on_cancel(message[3])
            elif asked.task is not None and not asked.task.done():
                asked.preempted = why
                asked.task.cancel(why)
        elif not asked.reply.done():
            asked.reply.set_result(message)

    def on_lost(self, channel: Channel, error: BaseException | None) -> None:
        self.channel = None
        for asked in self._asked.values():
            if not asked.reply.done():
                asked.reply.set_exception(MainGone("the main process went away"))

    @contextlib.asynccontextmanager
    async def lease(self, model: ModelConfig, options: AcquireOptions, shown: Shown,
                    on_cancel: Callable[[str | None], object],
                    on_granted: Callable[[float], None] | None = None) -> AsyncIterator[Lease]:
        """`model`'s lease from main, held for the block; `shown`: what main's in-flight list shows;
        `on_cancel(shown_id)`: what a cancel from main's in-flight list (of its entry `shown_id`) does to this
        request; `on_granted`: told the seconds of its wait its model spent loading (else `options`')."""
        channel = self.channel
        if channel is None or channel.closed:
            raise MainGone("the main process went away")
        rid = next(self._ids)
        task = asyncio.current_task()
        asked = self._asked[rid] = _Asked(asyncio.get_running_loop().create_future(), task, on_cancel)
        channel.send(("lease", rid, model.id, options.priority, options.api_key, options.deadline_ms,
                      shown.method, shown.path, shown.headers, shown.peer))
        refused = False
        outcome: str | None = None  # how it ended, for main: None = served
        try:
            reply = await asked.reply
            if reply[0] == "refused":  # main ended it already
                refused = True
                _, _, status, code, message, retry_after = reply
                raise Refused(status, code, message, retry_after)
            _, _, waited, load = reply
            told = on_granted or options.on_granted
            if told is not None:
                told(load)
            process = cast(ProcessLike, _ModelOnly(model))
            try:
                yield Lease(process, self.pool.upstream(model.id, model.timeouts), waited)
            except asyncio.CancelledError:
                if asked.preempted is not None and task is not None and task.cancelling():
                    task.uncancel()  # main's preemption: the caller answers the client why
                    raise Preempted(asked.preempted) from None
                raise
        except BaseException as exc:
            cancelled = isinstance(exc, (asyncio.CancelledError, Preempted))
            outcome = "cancelled" if cancelled else str(exc) or type(exc).__name__
            raise
        finally:
            del self._asked[rid]
            if not refused:
                channel.send(("end", rid, outcome))
