"""What the router does for requests (`RequestDesk`): a model's `Grant` (`grant_now` when it may serve at
once, `grant` waiting for the scheduler otherwise, `acquire` around either), a request's end (`end`), and
`load_of`, what a request arriving now would meet (selectors read it).

The desk posts to the router's `RunLoop`. A request that arrives while no event waits in the loop's queue is
offered to the scheduler directly (`Scheduler.try_grant_now`): when its model is ready and free it is granted
on the caller's task, without the round trip through the queue and without a future to wait on; otherwise
it is posted like any other. A request's end is handled the same way (`end`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from llmswap.process.state import ProcessState
from llmswap.router.loop import RunLoop
from llmswap.router.succession import Succession
from llmswap.router.types import (
    NO_OPTIONS,
    AcquireOptions,
    CancelRequest,
    Grant,
    NewRequest,
    ProcessLike,
    Rerouted,
    Waiter,
    read_backlog,
)
from llmswap.scheduler.errors import Preempted, ShuttingDown
from llmswap.scheduler.types import HandlerRequest, ModelLoad, Scheduler, ServeDone


class RequestDesk:
    """`acquire`, `grant`, `end` and `load_of` over the router's run loop (see the module docstring)."""

    def __init__(
        self,
        name: str,
        loop: RunLoop,
        scheduler: Scheduler,
        processes: dict[str, ProcessLike],
        succession: Succession,
        clock: Callable[[], float],
        model_state: Callable[[str], ProcessState | None],
        closing: Callable[[], bool],
    ) -> None:
        self.name = name
        self._loop = loop
        self._scheduler = scheduler
        self._processes = processes
        self._succession = succession
        self._clock = clock
        self._model_state = model_state
        self._closing = closing
        self._seq = itertools.count(1)
        # Requests posted to the run loop that the scheduler has not seen yet, per model: `load_of` counts
        # them, so two choices made in one loop step do not both see room for one.
        self._unhandled: dict[str, int] = {}

    def handled(self, req: HandlerRequest) -> None:
        """The run loop hands `req` to the scheduler: it is no longer on its way (see `load_of`)."""
        _decrement(self._unhandled, req.model)

    def end(self, done: ServeDone) -> None:
        """A granted request ended. With no event ahead of it in the queue, its ServeDone is handled here and
        now, exactly as the run loop would handle it next (the order is the same, and handling never awaits);
        otherwise, or once the router is retired or closing, it is posted behind the others."""
        if self._loop.quiet and self._loop.running and not self._closing() and \
                self._succession.outgoing is None:
            # The run loop's ServeDone, minus what cannot apply: not retired, so no successor to tell.
            self._loop.handled_here(lambda: self._scheduler.on_serve_done(done))
        else:
            self._loop.post(done)

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
        if options.deadline_ms or self._succession.outgoing is not None or self._closing() or \
                not self._loop.started or not self._loop.quiet:
            return None
        req = self._request(model, options, None, Waiter())  # no futures: it will not wait
        if not self._scheduler.try_grant_now(req):  # a fresh waiter: always granted when taken
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
        deadline = self._clock() + options.deadline_ms / 1000 if options.deadline_ms else None
        granted: tuple[str, HandlerRequest] | None = None
        if self._succession.outgoing is None:
            granted, told = await self._wait_for_grant(model, options, deadline)
            if told:  # a loading stream has already begun and must not begin twice
                options = replace(options, on_admitted=None)
        if granted is None:
            # This router was retired, before the request came or while it waited: the successor decides,
            # with the same deadline (what is left of it; already late: barely any).
            assert self._succession.outgoing is not None
            left = None if deadline is None else max(1e-3, (deadline - self._clock()) * 1000)
            return await self._succession.outgoing.successor.grant(model, replace(options, deadline_ms=left))
        granted_model, req = granted
        return self._serve(granted_model, req, options)

    def _request(self, model: str, options: AcquireOptions, deadline: float | None,
                 waiter: Waiter) -> HandlerRequest:
        return HandlerRequest(
            model=model, seq=next(self._seq), arrived=self._clock(), priority=options.priority,
            api_key=options.api_key, handle=waiter, deadline=deadline, backlog=read_backlog(options.backlog),
        )

    def _serve(self, model: str, req: HandlerRequest, options: AcquireOptions,
               on_admitted: Callable[[ProcessState], None] | None = None) -> Grant:
        """The grant of `req`, granted `model`, served from here on by the current task (the one a preemption
        cancels). Ended again at once, should a callback fail or a preemption have come first."""
        waiter: Waiter = req.handle
        waiter.task = asyncio.current_task()
        granted = Grant(model, self._processes[model], req, self.end, options.backlog)
        try:
            if on_admitted is not None:
                on_admitted(self._model_state(model) or ProcessState.STOPPED)
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
        if self._closing() or not self._loop.started:
            raise ShuttingDown(f"{self.name} is shutting down")
        loop = asyncio.get_running_loop()
        admitted, granted = loop.create_future(), loop.create_future()
        waiter = Waiter(admitted, granted, options.on_position)
        req = self._request(model, options, deadline, waiter)
        on_admitted = options.on_admitted
        self._unhandled[model] = self._unhandled.get(model, 0) + 1
        self._loop.put(NewRequest(req))
        told = False
        try:
            await admitted
            if on_admitted is not None:
                told = True
                on_admitted(self._model_state(model) or ProcessState.STOPPED)
            return (await granted, req), told
        except Rerouted:
            return None, told
        except asyncio.CancelledError:
            waiter.gone = True
            if _succeeded(granted):
                # Granted in the same instant the client left: the grant counted, so it must be released.
                self._loop.post(ServeDone(granted.result(), req))
            else:
                self._loop.post(CancelRequest(req))
            raise

    def load_of(self, model: str) -> ModelLoad | None:
        """What a request for `model` arriving now would meet; None when this router lacks the model."""
        if self._succession.outgoing is not None:
            return self._succession.outgoing.successor.load_of(model)
        state = self._model_state(model)
        if state is None:
            return None
        counts = self._scheduler.snapshot()
        ahead = self._unhandled.get(model, 0)
        return ModelLoad(state, counts.in_flight.get(model, 0), counts.waiting.get(model, 0) + ahead,
                         model in counts.loading, self._scheduler.accepts(model, ahead))


def _succeeded(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
