"""The one forwarder: a request out to an upstream, its answer relayed into a sink as it arrives, recorded
once.

Every caller that talks to an upstream goes through `forward`: the HTTP routes (their sink is the client's
streaming response, `llmswap.server.inference.proxy`), peers, `/upstream/...`, the task queue and the Batch
API (`Dispatcher.post_json`, into a `Buffer`) and probes such as the context guardrail's `GET /props`. A
request to a model or a peer goes by its `Destination` (`Destination.send`): its base URL, the pool's
connections to it and the `timeouts` that bound it, the same for every caller.

What `forward` owns, so that no caller writes it again:
- sending with the model's response-header limit and the watchdog's wall and idle bounds;
- failures before the answer's head: `Unreachable` (502, or 504 for the watchdog), the sink never started;
- the body relayed chunk by chunk; a failure mid-answer is the sink's `broke` (an error event, a cut
  connection, or an error for a buffer), never a truncated answer passed off as complete;
- the upstream connection: released for reuse when the answer was relayed whole, closed otherwise (a client
  that left, a cancel, a preemption: closing is what tells the upstream to stop generating);
- the recording (activity): the body sent, the answer's head, every chunk, the failure.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from llmswap.activity.recording import Recording
from llmswap.config.model import Timeouts
from llmswap.upstream.client import Body, Upstream, send

T = TypeVar("T")


# -------------------------------------------------------------------------------- the watchdog

# The watchdog of one upstream answer: a wall timeout for the whole answer, an idle timeout between bytes.
#
# A stuck upstream (a generation loop that never ends, a server that stops sending mid-answer) would
# otherwise hold its model's slot for as long as the client waits (OC-CORE-1022, seed 003). Per model,
# `timeouts.wall` bounds the whole answer from the moment its model was granted (headers included)
# and `timeouts.idle` the time without a byte from the upstream; 0 = no limit (the default). When one
# runs out the upstream request is closed (which aborts it), the client gets a clean error — 504 in
# the error envelope before any byte, an error event at the end of an event stream, a cut connection
# for any other body (never a truncated answer passed off as complete) — and the request ends, which
# frees its slot for the next one.


class WatchdogExpired(TimeoutError):
    """The answer ran past the model's wall or idle timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Watchdog:
    where: str  # the config path of the timeouts, for messages: "models.qwen.timeouts"
    wall: float = 0.0  # seconds for the whole answer, 0 = no limit
    idle: float = 0.0  # seconds without a byte from the upstream, 0 = no limit
    started: float = field(default_factory=time.monotonic)

    @property
    def active(self) -> bool:
        return self.wall > 0 or self.idle > 0

    @classmethod
    def of(cls, where: str, timeouts: Timeouts) -> Watchdog | None:
        """A watchdog for `timeouts` (started now), or None when neither bound is set."""
        return cls(where, timeouts.wall, timeouts.idle) if timeouts.wall > 0 or timeouts.idle > 0 else None

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work` (a read, or waiting for headers) within what the timeouts leave."""
        if not self.active:
            return await work
        wall_left = self.started + self.wall - time.monotonic() if self.wall > 0 else math.inf
        idle = self.idle if self.idle > 0 else math.inf
        budget = max(0.0, min(wall_left, idle))
        try:
            async with asyncio.timeout(budget):
                return await work
        except TimeoutError:
            if wall_left <= idle:
                raise WatchdogExpired(
                    f"the upstream's answer took longer than {self.wall:g}s "
                    f"({self.where}.wall); it was stopped") from None
            raise WatchdogExpired(
                f"the upstream sent nothing for {self.idle:g}s ({self.where}.idle); "
                f"it was stopped") from None


# -------------------------------------------------------------------------------- forwarding


class Sink(Protocol):
    """Where an answer goes as it arrives."""

    async def start(self, status: int, reason: str, headers: CIMultiDictProxy[str]) -> None:
        """The answer's head; called once, before any chunk."""

    async def write(self, chunk: bytes) -> None: ...

    async def finish(self) -> None:
        """The answer arrived whole."""

    async def broke(self, status: int, message: str) -> None:
        """The upstream failed after the head (502), or the watchdog stopped it (504)."""


class Unreachable(Exception):
    """No answer's head: the upstream could not be reached or sent none in time (`status` 502, or 504 when
    the watchdog stopped it). The sink was never started."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


async def forward(
    upstream: Upstream,
    method: str,
    url: URL,
    headers: Mapping[str, str],
    body: Body | None,
    sink: Sink,
    *,
    header_timeout: float = 0.0,
    watchdog: Watchdog | None = None,
    recording: Recording | None = None,
    error_prefix: str = "upstream proxy error",
) -> bool:
    """Send the request and relay its answer into `sink`; True when the answer arrived whole.

    Raises `Unreachable` when no head came (`error_prefix: why`), and lets through what the sink raises (a
    client that left: the upstream connection is then closed)."""
    if recording is not None and recording.wants_request_body and body is not None:
        recording.request_body(bytes(body))
    try:
        answer = await _guarded(watchdog, send(upstream, method, url, headers, body, header_timeout))
    except WatchdogExpired as exc:
        raise Unreachable(504, exc.message) from exc
    except (OSError, TimeoutError, ValueError) as exc:
        why = f"no response headers within {header_timeout:g}s" if isinstance(exc, TimeoutError) \
            else describe(exc)
        message = f"{error_prefix}: {why}"
        if recording is not None:
            recording.fail(502, message)
        raise Unreachable(502, message) from exc
    completed = False
    try:
        if recording is not None:
            recording.response_headers(answer.status, answer.headers)
        await sink.start(answer.status, answer.reason, answer.headers)
        while True:
            try:
                # Without a watchdog, read directly: one coroutine fewer per chunk of a stream.
                reading = answer.read_chunk()
                chunk = await (reading if watchdog is None else watchdog.guard(reading))
            except WatchdogExpired as exc:
                await sink.broke(504, exc.message)
                return False
            except (OSError, TimeoutError) as exc:
                message = f"{error_prefix}: the upstream broke off its answer ({describe(exc)})"
                if recording is not None:
                    recording.fail(502, message)
                await sink.broke(502, message)
                return False
            if not chunk:
                break
            await sink.write(chunk)
            if recording is not None:
                recording.chunk(chunk)
        await sink.finish()
        completed = True
        return True
    finally:
        if completed:
            answer.release()
        else:
            answer.close()


@dataclass(frozen=True)
class Destination:
    """Where a request goes: a model's server or a peer (`base_url`), the pool's connections to it, and its
    `timeouts` (`where` names them in messages: `models.qwen.timeouts`), applied alike to every request:
    the response-header limit and the watchdog's wall and idle bounds."""

    base_url: str
    upstream: Upstream
    timeouts: Timeouts
    where: str

    async def send(self, method: str, url: URL, headers: Mapping[str, str], body: Body | None, sink: Sink, *,
                   recording: Recording | None = None, error_prefix: str = "upstream proxy error") -> bool:
        """`forward` under this destination's timeouts (the watchdog starts now)."""
        return await forward(self.upstream, method, url, headers, body, sink,
                             header_timeout=self.timeouts.response_header,
                             watchdog=Watchdog.of(self.where, self.timeouts), recording=recording,
                             error_prefix=error_prefix)


async def _guarded(watchdog: Watchdog | None, work: Awaitable[T]) -> T:
    return await (watchdog.guard(work) if watchdog is not None else work)


@dataclass
class Buffer:
    """A sink that keeps the whole answer (tasks, batches, probes), or its first `limit` bytes (-1: no
    limit; the rest is read and dropped, and `truncated` says so)."""

    limit: int = -1
    status: int = 0
    reason: str = ""
    headers: CIMultiDictProxy[str] = field(default_factory=lambda: CIMultiDictProxy(CIMultiDict()))
    failure: str | None = None  # why the answer broke off after its head
    truncated: bool = False
    _parts: list[bytes] = field(default_factory=list)
    _size: int = 0

    async def start(self, status: int, reason: str, headers: CIMultiDictProxy[str]) -> None:
        self.status, self.reason, self.headers = status, reason, headers

    async def write(self, chunk: bytes) -> None:
        if self.limit >= 0 and self._size + len(chunk) > self.limit:
            self.truncated = True
            chunk = chunk[: self.limit - self._size]
        self._parts.append(chunk)
        self._size += len(chunk)

    async def finish(self) -> None:
        return None

    async def broke(self, status: int, message: str) -> None:
        self.failure = message

    @property
    def body(self) -> bytes:
        return b"".join(self._parts)
