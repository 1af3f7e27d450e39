"""One dispatch path for every request to a local model: an HTTP request, a task, a batch request.

`Dispatcher.lease` acquires the model from the live router, hands the caller the pool's `Upstream` for it
(its keep-alive connections, so the model's `timeouts` apply, and only they), releases the model when the
caller is done and completes the request's `DispatchRecord`, the one place observers (metrics, activity)
learn how it went. `Dispatcher.lease_now` is the same lease without an async context manager, when the model
may serve at once (`HeldLease`, released by its caller; None: take `lease`); both end through
`HeldLease.release`, the one owner of the record and of the router's end of the request.
`Dispatcher.post_json` is the whole path for a JSON request that wants its whole answer (tasks, batches):
the model's filters, the POST, the answer. HTTP routes stream through
`llmswap.server.inference.proxy.forward` on a lease instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from multidict import CIMultiDict
from yarl import URL

from llmswap.activity.recorder import ActivityRecorder
from llmswap.activity.recording import Recording, RequestFacts
from llmswap.config.model import ModelConfig
from llmswap.router.base import BaseRouter
from llmswap.router.grant import Ends, Grant
from llmswap.router.types import NO_OPTIONS, AcquireOptions, ProcessLike
from llmswap.scheduler.errors import Preempted
from llmswap.upstream.filters import apply_plan, local_plan
from llmswap.upstream.pool import Upstream, UpstreamPool, send

log = logging.getLogger("llmswap.dispatch")

Origin = Literal["http", "task", "batch"]


@dataclass(frozen=True)
class DispatchRecord:
    """How one dispatched request went, completed when the model is released."""

    model: str
    origin: Origin
    waited: float | None  # seconds from asking the router to the grant; None when never granted
    seconds: float  # from asking the router to the release
    error: str | None  # why it failed (the router refused, the upstream broke); None when it was served


DispatchObserver = Callable[[DispatchRecord], None]


@dataclass(frozen=True)
class Lease:
    """A granted request: the model's process and the pool's connections to it."""

    process: ProcessLike
    upstream: Upstream
    waited: float

    @property
    def config(self) -> ModelConfig:
        return self.process.config

    @property
    def response_header_timeout(self) -> float:
        """`timeouts.responseHeader` of the model, seconds, 0 = no limit."""
        return self.process.config.timeouts.response_header


@dataclass(frozen=True)
class UpstreamAnswer:
    status: int
    text: str


class HeldLease(Ends):
    """A granted lease (`Dispatcher.lease_now`, or inside `Dispatcher.lease`) until its `release`.

    `release` ends it exactly once (later calls change nothing): the router counts the request out (its
    `ServeDone`), its process's TTL counts again, and the dispatcher completes its `DispatchRecord`."""

    __slots__ = ("_asked", "_dispatcher", "_granted", "_origin", "lease")

    def __init__(self, lease: Lease, granted: Grant, dispatcher: Dispatcher, origin: Origin,
                 asked: float) -> None:
        self.lease = lease
        self._granted = granted
        self._dispatcher = dispatcher
        self._origin = origin
        self._asked = asked

    def release(self, error: BaseException | None = None) -> Preempted | None:
        """The request ended; `error`: why, when it did not end normally (what the caller caught).

        Returns `Preempted` when `error` is the cancellation a preemption caused: raise it instead of `error`
        (the task is no longer cancelling). None otherwise: re-raise `error`, if any."""
        granted = self._granted
        if granted.released:
            return None
        preempted = granted.release(error)
        self._dispatcher._complete(granted.model, self._origin, self.lease.waited, self._asked,
                                   preempted or error)
        return preempted


class UpstreamUnreachable(Exception):
    """The upstream could not be reached, broke off, or sent no headers within `timeouts.responseHeader`."""


class Dispatcher:
    """The path every request to a local model takes; `router_of()` is the live router (a reload swaps it)."""

    def __init__(
        self,
        pool: UpstreamPool,
        router_of: Callable[[], BaseRouter],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self._router_of = router_of
        self._clock = clock
        self._observers: list[DispatchObserver] = []
        # Where task and batch requests are recorded (the server's activity recorder), once it is set.
        self.recorder: ActivityRecorder | None = None

    def add_observer(self, observer: DispatchObserver) -> None:
        """Receive every completed `DispatchRecord` (on the event loop; must not block)."""
        self._observers.append(observer)

    def lease_now(
        self,
        model: str,
        options: AcquireOptions = NO_OPTIONS,
        *,
        origin: Origin,
        router: BaseRouter | None = None,
    ) -> HeldLease | None:
        """`model`'s lease granted here and now (`BaseRouter.grant_now`: ready, free, nothing waiting), or
        None when it must be waited for: nothing changed then, take `lease` instead. The caller releases
        the lease it got, exactly once (`HeldLease.release`); arguments as `lease`'s."""
        asked = self._clock()
        try:
            granted = (router or self._router_of()).grant_now(model, options)
        except BaseException as exc:  # a callback of `options` failed: the router released the grant
            self._complete(model, origin, None, asked, exc)
            raise
        return None if granted is None else self._hold(granted, origin, asked)

    @contextlib.asynccontextmanager
    async def lease(
        self,
        model: str,
        options: AcquireOptions = NO_OPTIONS,
        *,
        origin: Origin,
        router: BaseRouter | None = None,
    ) -> AsyncIterator[Lease]:
        """Wait until `model` may serve and yield its lease; the router's `SchedulerError`s go through.

        `options` are `BaseRouter.acquire`'s; `router` is the one the caller read together with its config
        (default: the live one)."""
        asked = self._clock()
        try:
            granted = await (router or self._router_of()).grant(model, options)
        except BaseException as exc:
            self._complete(model, origin, None, asked, exc)
            raise
        with self._hold(granted, origin, asked) as held:
            yield held.lease

    def _hold(self, granted: Grant, origin: Origin, asked: float) -> HeldLease:
        process = granted.process
        try:
            upstream = self.pool.upstream(process.id, process.config.timeouts)
        except BaseException as exc:  # the pool is closed: the server is stopping
            self._complete(granted.model, origin, self._clock() - asked, asked, granted.release(exc) or exc)
            raise
        return HeldLease(Lease(process, upstream, self._clock() - asked), granted, self, origin, asked)

    def _complete(self, model: str, origin: Origin, waited: float | None, asked: float,
                  error: BaseException | None) -> None:
        """The request's `DispatchRecord` to every observer (built only when someone listens)."""
        if not self._observers:
            return
        why = None if error is None else str(error) or type(error).__name__
        record = DispatchRecord(model, origin, waited, self._clock() - asked, why)
        for observer in self._observers:
            try:
                observer(record)
            except Exception:
                log.exception("dispatch observer failed")

    async def post_json(
        self,
        model: str,
        path: str,
        body: Mapping[str, Any],
        *,
        requested: str,
        origin: Origin,
        priority: int = 0,
        lease: Lease | None = None,
    ) -> UpstreamAnswer:
        """POST `body` (after the model's filters, as the client named it `requested`) and read the answer.

        `lease`: one the caller already holds for `model` (a task claims its row only once granted, and tells
        the router its queue's depth); without it the model is acquired here. Raises the router's
        `SchedulerError`, or `UpstreamUnreachable` when the model does not answer.
        """
        recording = None if self.recorder is None else self.recorder.begin(
            RequestFacts(model=model, req_path=path, requested_model=requested, origin=origin))
        try:
            answer = await self._post_json(model, path, body, requested, origin, priority, lease, recording)
        except BaseException as exc:
            if recording is not None:  # refused by the router, unreachable, or cancelled
                status = 502 if isinstance(exc, UpstreamUnreachable) else getattr(exc, "status", 500)
                recording.finish(status, error=str(exc) or type(exc).__name__)
            raise
        if recording is not None:
            recording.finish()
        return answer

    async def _post_json(
        self,
        model: str,
        path: str,
        body: Mapping[str, Any],
        requested: str,
        origin: Origin,
        priority: int,
        lease: Lease | None,
        recording: Recording | None,
    ) -> UpstreamAnswer:
        held = contextlib.nullcontext(lease) if lease is not None else self.lease(
            model, AcquireOptions(priority=priority), origin=origin)
        async with held as lease:
            if recording is not None:
                recording.waited(lease.waited)
            filtered, _ = apply_plan(body, local_plan(lease.config, requested))
            url = URL(lease.config.proxy.rstrip("/") + path)
            data = json.dumps(filtered, ensure_ascii=False, separators=(",", ":")).encode()
            if recording is not None and recording.wants_request_body:
                recording.request_body(data)
            limit = lease.response_header_timeout
            headers = CIMultiDict({"Content-Type": "application/json"})
            try:
                response = await send(lease.upstream, "POST", url, headers, data, limit)
            except TimeoutError as exc:
                raise UpstreamUnreachable(
                    f"{model} sent no response headers within {limit:g}s (timeouts.responseHeader)"
                ) from exc
            except OSError as exc:
                raise UpstreamUnreachable(f"{model} could not be reached: {exc}") from exc
            try:
                async with response:
                    raw = await response.read()
            except OSError as exc:
                raise UpstreamUnreachable(f"{model} broke off its answer: {exc}") from exc
            if recording is not None:
                recording.response_headers(response.status, response.headers)
                recording.chunk(raw)
            return UpstreamAnswer(response.status, raw.decode("utf-8", errors="replace"))
