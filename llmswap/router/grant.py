"""A granted request while it is served (`Grant`): the one owner of its end.

`RequestDesk.grant_now` and `grant` hand one out; `acquire` wraps one. From the grant to `release` the request
counts in flight twice: on the scheduler's books (`Scheduler.try_grant_now`/`on_request` put it there, its
`ServeDone` takes it off) and on its process (the TTL holds: `request_started`/`request_ended`). `release`
ends both, once: a second call changes nothing. A preemption (`Effects.preempt`) cancels the task that
was serving the request when it was granted; `release` turns that cancellation into the `Preempted` its caller
must raise instead (the task's cancel is consumed); `with grant:` does both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Self

from llmswap.router.types import Backlog, ProcessLike, SwapPhase, Waiter, read_backlog
from llmswap.scheduler.errors import Preempted
from llmswap.scheduler.types import HandlerRequest, ServeDone


class Grant:
    """`process` serves the granted request `request` until `release`; see the module docstring.

    Made by the router when its grant is final (the caller is there, not preempted yet). A plain class with
    slots: one is made per request on the hot path."""

    __slots__ = ("_backlog", "_end", "_released", "model", "phases", "process", "request")

    def __init__(self, model: str, process: ProcessLike, request: HandlerRequest,
                 end: Callable[[ServeDone], None], backlog: Backlog) -> None:
        self.model = model  # the model granted (its process is `process`)
        self.process = process
        self.request = request
        self._end = end  # the router's: counts it out of the scheduler (`RequestDesk.end`)
        self._backlog = backlog  # re-read as it ends (`ServeDone.backlog`)
        self._released = False
        self.phases: tuple[SwapPhase, ...] = request.handle.phases if request.handle is not None else ()
        process.request_started()

    @property
    def released(self) -> bool:
        return self._released

    def release(self, error: BaseException | None = None) -> Preempted | None:
        """The request ended (`error`: why, when it did not end normally); later calls change nothing.

        Returns `Preempted` when `error` is the cancellation a preemption caused: the caller raises that
        instead, and the task is no longer cancelling. None otherwise (raise `error` itself, if any)."""
        if self._released:
            return None
        self._released = True
        req = self.request
        waiter: Waiter = req.handle
        # Ended: a preemption decided before the scheduler reads its ServeDone must not cancel whatever the
        # task does next (a task lane recording this very answer).
        task, waiter.task = waiter.task, None
        self.process.request_ended()
        preempted: Preempted | None = None
        if waiter.preempted is not None and isinstance(error, asyncio.CancelledError) and task is not None \
                and task.cancelling():
            task.uncancel()  # `preempt` cancelled it: its upstream call was abandoned; the client learns why
            preempted = Preempted(waiter.preempted)
        # The scheduler counts it out (on the spot when nothing waits ahead of it); a successor waiting for
        # the model learns as it is handled.
        self._end(ServeDone(self.model, req, read_backlog(self._backlog)))
        return preempted

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        """Release with the block's error; raise `Preempted` in place of a preemption's cancellation."""
        preempted = self.release(error)
        if preempted is not None:
            raise preempted from None
