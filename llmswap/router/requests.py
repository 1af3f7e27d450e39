"""The router's request API: a model's `Grant` (`grant_now` when it may serve at once, `grant` waiting for the
scheduler otherwise, `acquire` around either), and `load_of`, what a request arriving now would meet
(selectors read it).

A mixin of `BaseRouter` (`llmswap.router.base`), which owns the run loop these methods post to. A request
that arrives while no event waits in that loop's queue is offered to the scheduler directly
(`Scheduler.try_grant_now`): when its model is ready and free it is granted on the caller's task, without
the round trip through the queue and without a future to wait on; otherwise it is posted like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llmswap.process.state import ProcessState
from llmswap.router.grant import Grant
from llmswap.router.succession import Succession
from llmswap.router.types import (
    NO_OPTIONS,
    AcquireOptions,
    CancelRequest,
    NewRequest,
    ProcessLike,
    Rerouted,
    Waiter,
    read_backlog,
)
from llmswap.scheduler.errors import Preempted, ShuttingDown
from llmswap.scheduler.types import HandlerRequest, ModelLoad, Scheduler, ServeDone


class RequestApi:
    """`acquire` and `load_of` over the router's run loop (see the module docstring)."""

    # Provided by BaseRouter.
    name: str
    scheduler: Scheduler
    processes: dict[str, ProcessLike]
    succession: Succession
    clock: Callable[[], float]
    _closing: bool
    _run_task: asyncio.Task[None] | None
    _seq: itertools.count[int]
    _events: asyncio.Queue[object]
    _unhandled: dict[str, int]

    if TYPE_CHECKING:  # provided by BaseRouter (its run loop) and RouterEffects
        def _post(self, event: object) -> None: ...
        def _end(self, done: ServeDone) -> None: ...
        def model_state(self, model: str) -> ProcessState | None: ...

    def _handled(self, req: HandlerRequest) -> None:
        """The run loop hands `req` to the scheduler: it is no longer on its way (see `load_of`)."""
        _decrement(self._unhandled, req.model)


    @contextlib.asynccontextmanager
    async def acquire(self, model: str, options: AcquireOptions = NO_OPTIONS) -> AsyncIterator[ProcessLike]:
        """Wait until `model` may serve, yield its process, and report the end of the request (`grant`, then
        `Grant.release`: a preemption comes out as `Preempted`)."""
        granted = await self.grant(model, options)
        with granted:
            yield granted.process

    def grant_now(self, model: str, options: AcquireOptions = NO_OPTIONS) -> Grant | None:
        """`model` granted here and now, when the scheduler would grant it at once (ready and free, within
        every limit, nothing waiting that comes first, no deadline to judge); None when it must go through
        `grant`: nothing changed then. The caller must `release` the grant, exactly once.

        With no event ahead of it in the run loop's queue, the scheduler sees the world exactly as the run
        loop would when it took this request, so it may grant it synchronously, on the caller's task; it is
        then in flight on the scheduler's books as any other, until its ServeDone (`Grant.release`)."""
        if options.deadline_ms or self.succession.outgoing is not None or self._closing or \
                self._run_task is None or not self._events.empty():
            return None
        req = self._request(model, options, None, Waiter())  # no futures: it will not wait
        if not self.scheduler.try_grant_now(req):  # a fresh waiter: always granted when taken
            return None
        return self._serve(model, req, options, options.on_admitted)

    async def grant(self, model: str, options: AcquireOptions = NO_OPTIONS) -> Grant:
        """Wait until `model` may serve and return its grant (`grant_now` when it may at once).

        Raises the `SchedulerError` the scheduler chose (unknown model, limits, failed swap...). Honours
        cancellation at every point: a cancelled waiter leaves the queue and never triggers a swap.
        `options` (`AcquireOptions`): its priority, key, deadline and backlog, and whom to tell what."""
        now = self.grant_now(model, options)
        if now is not None:
            return now
        deadline = self.clock() + options.deadline_ms / 1000 if options.deadline_ms else None
        granted: tuple[str, HandlerRequest] | None = None
        if self.succession.outgoing is None:
            granted, told = await self._wait_for_grant(model, options, deadline)
            if told:  # a loading stream has already begun and must not begin twice
                options = replace(options, on_admitted=None)
        if granted is None:
            # This router was retired, before the request came or while it waited: the successor decides,
            # with the same deadline (what is left of it; already late: barely any).
            assert self.succession.outgoing is not None
            left = None if deadline is None else max(1e-3, (deadline - self.clock()) * 1000)
            return await self.succession.outgoing.successor.grant(model, replace(options, deadline_ms=left))
        granted_model, req = granted
        return self._serve(granted_model, req, options)

    def _request(self, model: str, options: AcquireOptions, deadline: float | None,
                 waiter: Waiter) -> HandlerRequest:
        return HandlerRequest(
            model=model, seq=next(self._seq), arrived=self.clock(), priority=options.priority,
            api_key=options.api_key, handle=waiter, deadline=deadline, backlog=read_backlog(options.backlog),
        )

    def _serve(self, model: str, req: HandlerRequest, options: AcquireOptions,
               on_admitted: Callable[[ProcessState], None] | None = None) -> Grant:
        """The grant of `req`, granted `model`, served from here on by the current task (the one a preemption
        cancels). Ended again at once, should a callback fail or a preemption have come first."""
        waiter: Waiter = req.handle
        waiter.task = asyncio.current_task()
        granted = Grant(model, self.processes[model], req, self._end, options.backlog)
        try:
            if on_admitted is not None:
                on_admitted(self.model_state(model) or ProcessState.STOPPED)
            if options.on_granted is not None:
                options.on_granted(waiter.load)
            if waiter.preempted is not None:  # preempted between its grant and now
                raise Preempted(waiter.preempted)
        except BaseException:
            granted.release()
            raise
        return granted

    async def _wait_for_grant(
        self, model: str, options: AcquireOptions, deadline: float | None,
    ) -> tuple[tuple[str, HandlerRequest] | None, bool]:
        """The granted model and request (None: rerouted to a successor), and whether `on_admitted` ran."""
        if self._closing or self._run_task is None:
            raise ShuttingDown(f"{self.name} is shutting down")
        loop = asyncio.get_running_loop()
        admitted, granted = loop.create_future(), loop.create_future()
        waiter = Waiter(admitted, granted, options.on_position)
        req = self._request(model, options, deadline, waiter)
        on_admitted = options.on_admitted
        self._unhandled[model] = self._unhandled.get(model, 0) + 1
        self._events.put_nowait(NewRequest(req))
        told = False
        try:
            await admitted
            if on_admitted is not None:
                told = True
                on_admitted(self.model_state(model) or ProcessState.STOPPED)
            return (await granted, req), told
        except Rerouted:
            return None, told
        except asyncio.CancelledError:
            waiter.gone = True
            if _succeeded(granted):
                # Granted in the same instant the client left: the grant counted, so it must be released.
                self._post(ServeDone(granted.result(), req))
            else:
                self._post(CancelRequest(req))
            raise

    def load_of(self, model: str) -> ModelLoad | None:
        """What a request for `model` arriving now would meet; None when this router lacks the model."""
        if self.succession.outgoing is not None:
            return self.succession.outgoing.successor.load_of(model)
        state = self.model_state(model)
        if state is None:
            return None
        counts = self.scheduler.snapshot()
        ahead = self._unhandled.get(model, 0)
        return ModelLoad(state, counts.in_flight.get(model, 0), counts.waiting.get(model, 0) + ahead,
                         model in counts.loading, self.scheduler.accepts(model, ahead))


def _succeeded(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
