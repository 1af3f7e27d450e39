"""The router's request API: `acquire` a model (wait for the scheduler's grant, serve, report the end),
and `load_of`, what a request arriving now would meet (selectors read it).

A mixin of `BaseRouter` (`llmswap.router.base`), which owns the run loop these methods post to.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from llmswap.process.state import ProcessState
from llmswap.router.succession import Succession
from llmswap.router.types import CancelRequest, NewRequest, ProcessLike, Rerouted, Waiter
from llmswap.scheduler.errors import Preempted, ShuttingDown
from llmswap.scheduler.types import HandlerRequest, ModelLoad, Scheduler, ServeDone

# How many more requests for the model the caller has queued behind this one, or a function that reads it.
Backlog = int | Callable[[], int]


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
        def model_state(self, model: str) -> ProcessState | None: ...

    def _handled(self, req: HandlerRequest) -> None:
        """The run loop hands `req` to the scheduler: it is no longer on its way (see `load_of`)."""
        _decrement(self._unhandled, req.model)


    @contextlib.asynccontextmanager
    async def acquire(
        self,
        model: str,
        *,
        priority: int = 0,
        api_key: str | None = None,
        on_admitted: Callable[[ProcessState], None] | None = None,
        on_position: Callable[[int], None] | None = None,
        deadline_ms: float | None = None,
        on_granted: Callable[[float], None] | None = None,
        backlog: Backlog = 0,
    ) -> AsyncIterator[ProcessLike]:
        """Wait until `model` may serve, yield its process, and report the end of the request.

        Raises the `SchedulerError` the scheduler chose (unknown model, limits, failed swap...). Honours
        cancellation at every point: a cancelled waiter leaves the queue and never triggers a swap.
        `deadline_ms`: when it should be served by, after now; `on_granted(load)` is told, once granted,
        how many seconds of its wait its model spent loading. `backlog`: how many more requests for `model`
        its caller has queued behind this one (`HandlerRequest.backlog`), or a function that reads it: read
        as the request is posted and again as it ends (`ServeDone.backlog`), so the scheduler sees it grow.
        """
        deadline = self.clock() + deadline_ms / 1000 if deadline_ms else None
        granted: tuple[str, HandlerRequest] | None = None
        if self.succession.outgoing is None:
            granted, told = await self._wait_for_grant(model, priority, api_key, on_admitted, on_position,
                                                       deadline, backlog)
            if told:  # a loading stream has already begun and must not begin twice
                on_admitted = None
        if granted is None:
            # This router was retired, before the request came or while it waited: the successor decides,
            # with the same deadline (what is left of it; already late: barely any).
            assert self.succession.outgoing is not None
            async with self.succession.outgoing.successor.acquire(
                model, priority=priority, api_key=api_key, on_admitted=on_admitted, on_position=on_position,
                deadline_ms=None if deadline is None else max(1e-3, (deadline - self.clock()) * 1000),
                on_granted=on_granted, backlog=backlog,
            ) as process:
                yield process
            return
        granted_model, req = granted
        process = self.processes[granted_model]
        waiter: Waiter = req.handle
        if on_granted is not None:
            on_granted(waiter.load)
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
            # The scheduler counts it out; a successor waiting for the model learns in _run.
            self._post(ServeDone(granted_model, req, _read(backlog)))

    async def _wait_for_grant(
        self,
        model: str,
        priority: int,
        api_key: str | None,
        on_admitted: Callable[[ProcessState], None] | None,
        on_position: Callable[[int], None] | None,
        deadline: float | None,
        backlog: Backlog = 0,
    ) -> tuple[tuple[str, HandlerRequest] | None, bool]:
        """The granted model and request (None: rerouted to a successor), and whether `on_admitted` ran."""
        if self._closing or self._run_task is None:
            raise ShuttingDown(f"{self.name} is shutting down")
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), loop.create_future(), on_position)
        req = HandlerRequest(
            model=model, seq=next(self._seq), arrived=self.clock(), priority=priority,
            api_key=api_key, handle=waiter, deadline=deadline, backlog=_read(backlog),
        )
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
