"""One dispatch path for every request to a local model: an HTTP request, a task, a batch request.

`Dispatcher.lease` acquires the model from the live router, hands the caller the pool's `Upstream` for it
(its keep-alive connections, so the model's `timeouts` apply, and only they) and releases the model when the
caller is done (`Grant`, the one owner of the router's end of the request).
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
from llmswap.activity.recording import Recording, RequestFacts, RequestRecord
from llmswap.config.model import ModelConfig
from llmswap.router.router import Router
from llmswap.router.types import NO_OPTIONS, AcquireOptions, ProcessLike, SwapPhase
from llmswap.upstream.client import Upstream, UpstreamPool
from llmswap.upstream.filters import apply_plan, local_plan
from llmswap.upstream.forward import Buffer, Destination, Unreachable

log = logging.getLogger("llmswap.dispatch")

Origin = Literal["http", "task", "batch"]


@dataclass(frozen=True)
class Lease:
    """A granted request: the model's process and the pool's connections to it."""

    process: ProcessLike
    upstream: Upstream
    waited: float
    phases: tuple[SwapPhase, ...] = ()  # the phases of the swap it waited for, if it waited for one

    @property
    def config(self) -> ModelConfig:
        return self.process.config

    @property
    def destination(self) -> Destination:
        """The model's server, the pool's connections to it and its `timeouts`: where the request goes."""
        config = self.process.config
        return Destination(config.proxy, self.upstream, config.timeouts, f"models.{config.id}.timeouts")


@dataclass(frozen=True)
class UpstreamAnswer:
    status: int
    text: str


class UpstreamUnreachable(Exception):
    """The upstream could not be reached, broke off, or sent no headers within `timeouts.responseHeader`."""


class Dispatcher:
    """The path every request to a local model takes; `router_of()` is the live router (a reload swaps it)."""

    def __init__(
        self,
        pool: UpstreamPool,
        router_of: Callable[[], Router],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self._router_of = router_of
        self._clock = clock
        # Where task and batch requests are recorded (the server's activity recorder), once it is set.
        self.recorder: ActivityRecorder | None = None

    @contextlib.asynccontextmanager
    async def lease(
        self,
        model: str,
        options: AcquireOptions = NO_OPTIONS,
        *,
        router: Router | None = None,
    ) -> AsyncIterator[Lease]:
        """Wait until `model` may serve and yield its lease; the router's `SchedulerError`s go through.
        The model is released as the block ends, with the block's error (a preemption's cancel comes out as
        `Preempted`).

        `options` are `Router.acquire`'s; `router` is the one the caller read together with its config
        (default: the live one)."""
        asked = self._clock()
        granted = await (router or self._router_of()).grant(model, options)
        with granted:
            process = granted.process
            upstream = self.pool.upstream(process.id, process.config.timeouts)
            yield Lease(process, upstream, self._clock() - asked, granted.phases)

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
        record = RequestRecord(model=model, started=self._clock())
        recording = None if self.recorder is None else self.recorder.begin(
            RequestFacts(model=model, req_path=path, requested_model=requested, origin=origin), record)
        try:
            answer = await self._post_json(model, path, body, requested, priority, lease, record, recording)
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
        priority: int,
        lease: Lease | None,
        record: RequestRecord,
        recording: Recording | None,
    ) -> UpstreamAnswer:
        held = contextlib.nullcontext(lease) if lease is not None else self.lease(
            model, AcquireOptions(priority=priority))
        async with held as lease:
            record.waited = lease.waited
            filtered, _ = apply_plan(body, local_plan(lease.config, requested))
            url = URL(lease.config.proxy.rstrip("/") + path)
            data = json.dumps(filtered, ensure_ascii=False, separators=(",", ":")).encode()
            buffer = Buffer()
            headers = CIMultiDict({"Content-Type": "application/json"})
            try:
                await lease.destination.send("POST", url, headers, data, buffer, recording=recording,
                                             error_prefix=model)
            except Unreachable as exc:
                raise UpstreamUnreachable(exc.message) from exc
            if buffer.failure is not None:
                raise UpstreamUnreachable(buffer.failure)
            return UpstreamAnswer(buffer.status, buffer.body.decode("utf-8", errors="replace"))
