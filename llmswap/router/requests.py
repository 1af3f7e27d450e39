"""The router's request API: `acquire` a model (wait for the scheduler's grant, serve, report the end),
and `load_of`, what a request arriving now would meet (selectors read it).

A mixin of `BaseRouter` (`llmswap.router.base`), which owns the run loop these methods post to. A request
that arrives while no event waits in that loop's queue is offered to the scheduler directly
(`Scheduler.try_grant_now`): when its model is ready and free it is granted without the round trip through
the queue; otherwise it is posted like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llmswap.process.state import ProcessState
from llmswap.router.succession import Succession
from llmswap.router.types import (
    NO_OPTIONS,
    AcquireOptions,
    Backlog,
    CancelRequest,
    NewRequest,
    ProcessLike,
    Rerouted,
    Waiter,
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
        """Wait until `model` may serve, yield its process, and report the end of the request.

        Raises the `SchedulerError` the scheduler chose (unknown model, limits, failed swap...). Honours
        cancellation at every point: a cancelled waiter leaves the queue and never triggers a swap.
        `options` (`AcquireOptions`): its priority, key, deadline and backlog, and whom to tell what.
        """
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
            async with self.succession.outgoing.successor.acquire(
                model, replace(options, deadline_ms=left),
            ) as process:
                yield process
            return
        granted_model, req = granted
        process = self.processes[granted_model]
        waiter: Waiter = req.handle
        if options.on_granted is not None:
            options.on_granted(waiter.load)
        task = waiter.task = asyncio.current_task()
        try:
            if waiter.preempted is not None:  # preempted between its grant and now
                raise Preempted(waiter.preempted)
            with process.track_request():
                yield process
        except asyncio.CancelledError:
            # `preempt` cancelled the task serving it: its upstream call was abandoned; tell the client why.
            if waiter.preempted is None or task is None or not task.cancelling():
                raise
            task.uncancel()
            raise Preempted(waiter.preempted) from None
        finally:
            # Ended: a preemption decided before the run loop reads ServeDone must not cancel whatever
            # the task does next (a task lane recording this very answer).
            waiter.task = None
            # The scheduler counts it out (on the spot when nothing waits ahead of it: `_end`); a successor
            # waiting for the model learns as it is handled.
            self._end(ServeDone(granted_model, req, _read(options.backlog)))

    async def _wait_for_grant(
        self, model: str, options: AcquireOptions, deadline: float | None,
    ) -> tuple[tuple[str, HandlerRequest] | None, bool]:
        """The granted model and request (None: rerouted to a successor), and whether `on_admitted` ran."""
        if self._closing or self._run_task is None:
            raise ShuttingDown(f"{self.name} is shutting down")
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), loop.create_future(), options.on_position)
        req = HandlerRequest(
            model=model, seq=next(self._seq), arrived=self.clock(), priority=options.priority,
            api_key=options.api_key, handle=waiter, deadline=deadline, backlog=_read(options.backlog),
        )
        on_admitted = options.on_admitted
        # The fast path: with no event ahead of it in the queue, the scheduler sees the world exactly as the
        # run loop would when it took this request, so it may grant it here, synchronously, when it would
        # grant it at once anyway (its model ready and free, nothing waiting that comes first). The request
        # is then in flight on the scheduler's books as any other, until its ServeDone (`_end`).
        if self._events.empty() and self.scheduler.try_grant_now(req):  # a fresh waiter: always granted
            if on_admitted is not None:
                on_admitted(self.model_state(model) or ProcessState.STOPPED)
            return (waiter.granted.result(), req), on_admitted is not None
        self._unhandled[model] = self._unhandled.get(model, 0) + 1
        self._events.put_nowait(NewRequest(req))
        told = False
        try:
            await waiter.admitted
            if on_admitted is not None:
                told = True
                on_admitted(self.model_state(model) or ProcessState.STOPPED)
            return (await waiter.granted, req), told
        except Rerouted:
            return None, told
        except asyncio.CancelledError:
            waiter.gone = True
            if _succeeded(waiter.granted):
                # Granted in the same instant the client left: the grant counted, so it must be released.
                self._post(ServeDone(waiter.granted.result(), req))
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


def _read(backlog: Backlog) -> int:
    return max(0, backlog() if callable(backlog) else backlog)


def _succeeded(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
