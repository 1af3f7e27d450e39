"""The router's vocabulary: what it needs of a process, how a request asks (`AcquireOptions`), what a waiting
request holds (`Waiter`) and a granted one (`Grant`, the one owner of its end), what observers hear.

Observers receive `RouterEvent`s: a swap committed (`SwapStarted`), a swap ended (`SwapFinished`), or a
process's own `ProcessEvent`. All are frozen dataclasses; nobody reads log text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

from llmswap.config.model import ModelConfig
from llmswap.process.events import LifeTimes, ProcessEvent
from llmswap.process.state import ProcessState
from llmswap.scheduler.errors import Preempted, SchedulerError
from llmswap.scheduler.types import HandlerRequest, ServeDone, SwapPlan, Unload

log = logging.getLogger("llmswap.router")


class Rerouted(SchedulerError):
    """A retired router hands a waiter to its successor; `acquire` catches it and waits there instead."""

    status = 503
    code = "reloading"


class ProcessLike(Protocol):
    """What the router needs of an upstream process (`llmswap.process.Process` in production)."""

    id: str
    config: ModelConfig
    asleep_since: float | None  # while its server sleeps (`sleep:`/`wake:` models), since when

    @property
    def state(self) -> ProcessState: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def last_start_duration(self) -> float | None: ...
    async def ensure_ready(self) -> LifeTimes | None:
        """Ready (started or woken if need be); what its start or wake took, phase by phase, if it did one."""
    async def stop(self, timeout: float | None = None) -> LifeTimes | None:
        """Stopped; what its save and its stop took, if it was running."""
    async def sleep(self, timeout: float | None = None) -> bool:
        """Put the server to sleep instead of stopping it (a model with `sleep:`); stops it when it cannot.
        True when it sleeps; its next `ensure_ready` wakes it."""
    async def shutdown(self, timeout: float = 1.0) -> None: ...
    def request_started(self) -> None:
        """A granted request begins: the process holds its TTL until the matching `request_ended`."""
    def request_ended(self) -> None: ...


ProcessEventSink = Callable[[ProcessEvent], None]
ProcessFactory = Callable[[ModelConfig, ProcessEventSink], ProcessLike]

# How many more requests for the model the caller has queued behind this one, or a function that reads it.
Backlog = int | Callable[[], int]


@dataclass(frozen=True)
class AcquireOptions:
    """How one request asks a router for its model (`acquire`, `Dispatcher.lease`); the defaults: a plain
    request at priority 0, no key, no deadline, nobody told anything."""

    priority: int = 0  # the X-Priority header or the API key's default
    api_key: str | None = None  # identity for per-key limits (maxConcurrent)
    deadline_ms: float | None = None  # when it should be served by, milliseconds after it is asked
    # How many more requests for the model its caller has queued behind it (`HandlerRequest.backlog`), or a
    # function that reads it: read as the request is posted and again as it ends (`ServeDone.backlog`).
    backlog: Backlog = 0
    on_admitted: Callable[[ProcessState], None] | None = None  # passed admission: the model's state then
    on_position: Callable[[int], None] | None = None  # its 1-based place in the queue changed
    on_granted: Callable[[float], None] | None = None  # granted: seconds of its wait its model spent loading


NO_OPTIONS = AcquireOptions()


def read_backlog(backlog: Backlog) -> int:
    return max(0, backlog() if callable(backlog) else backlog)


@dataclass(eq=False)
class Waiter:
    """The router's side of one HandlerRequest: the futures its HTTP handler awaits.

    A request granted at once (`Scheduler.try_grant_now`) never waits: its futures stay None (made only when
    it must wait), and admitting and granting it only say whether its caller is still there."""

    admitted: asyncio.Future[None] | None = None
    granted: asyncio.Future[str] | None = None
    on_position: Callable[[int], None] | None = None
    position: int = 0
    gone: bool = False  # the client left; grants must fail
    load: float = 0.0  # seconds of its wait its model spent loading (for the access log)
    phases: tuple[SwapPhase, ...] = ()  # the phases of the swap it waited for (none: it waited for none)
    task: asyncio.Task[Any] | None = None  # what serves it once granted (preemption cancels it)
    preempted: str | None = None  # set by `preempt`: why its answer is being ended

    def admit(self) -> bool:
        if self.gone:
            return False
        if self.admitted is None:
            return True
        if self.admitted.done():
            return False
        self.admitted.set_result(None)
        return True

    def grant(self, model: str) -> bool:
        """Whether the caller was still there: only then does the grant count as in flight."""
        if self.gone:
            return False
        if self.granted is None:
            return True
        if self.granted.done():
            return False
        if self.admitted is not None and not self.admitted.done():
            self.admitted.set_result(None)
        self.granted.set_result(model)
        return True

    def fail(self, err: SchedulerError) -> None:
        if self.gone or self.admitted is None or self.granted is None:
            return  # granted at once: nothing fails it any more
        target = self.granted if self.admitted.done() else self.admitted
        if not target.done():
            target.set_exception(err)

    def tell_position(self, position: int) -> None:
        self.position = position
        if self.on_position is not None and not self.gone:
            try:
                self.on_position(position)
            except Exception:
                log.exception("position callback failed")


# A granted request while it is served (`Grant`): the one owner of its end.
#
# `RequestDesk.grant_now` and `grant` hand one out; `acquire` wraps one. From the grant to `release` the
# request counts in flight twice: on the scheduler's books (`Scheduler.try_grant_now`/`on_request` put it
# there, its `ServeDone` takes it off) and on its process (the TTL holds: `request_started`/`request_ended`).
# `release` ends both, once: a second call changes nothing. A preemption (`Effects.preempt`) cancels the task
# that was serving the request when it was granted; `release` turns that cancellation into the `Preempted`
# its caller must raise instead (the task's cancel is consumed); `with grant:` does both.


class Grant:
    """`process` serves the granted request `request` until `release`; see the comment above.

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


# The run loop's own events, beside the scheduler's (SwapDone, ServeDone, StopDone, ProcessStopped).

@dataclass(frozen=True)
class NewRequest:
    req: HandlerRequest


@dataclass(frozen=True)
class CancelRequest:
    req: HandlerRequest


@dataclass(frozen=True)
class Tick:
    pass


@dataclass(frozen=True)
class UnloadRequest:
    unload: Unload
    done: asyncio.Future[None]


@dataclass(frozen=True)
class Shutdown:
    pass




PHASES = ("drain", "save", "stop", "prefetch", "start", "restore", "wake")  # in the order a swap runs them


@dataclass(frozen=True)
class SwapPhase:
    """One measured phase of a swap: `drain`, `save` and `stop` concern a victim, `prefetch`, `start`,
    `restore` and `wake` the model started (`PHASES`)."""

    phase: str
    model: str
    seconds: float


def ordered_phases(phases: tuple[SwapPhase, ...]) -> list[SwapPhase]:
    """A swap's phases in the order it runs them (`PHASES`)."""
    return sorted(phases, key=lambda p: PHASES.index(p.phase))


def phases_text(phases: tuple[SwapPhase, ...]) -> str:
    """`drain:1.2s,stop:0.3s,start:2.1s` — a swap's phases in their order, for log lines."""
    return ",".join(f"{p.phase}:{p.seconds:.2f}s" for p in ordered_phases(phases))


@dataclass(frozen=True)
class SwapStarted:
    """Observer notification: a swap was committed (the plan says why)."""

    plan: SwapPlan


@dataclass(frozen=True)
class SwapFinished:
    """Observer notification: a swap ended; `error` is None on success."""

    plan: SwapPlan
    error: SchedulerError | None
    duration: float
    phases: tuple[SwapPhase, ...] = ()  # what it spent where (`SwapPhase`), as far as it got


RouterEvent = SwapStarted | SwapFinished | ProcessEvent
Observer = Callable[[RouterEvent], None]


@dataclass
class RouterStats:
    """Counters the server's metrics read; mutated only on the loop thread."""

    swaps_by_rule: dict[str, int] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)
    swap_failures: int = 0


@dataclass(frozen=True)
class LoadProgress:
    """How far a model's load is, as far as llmswap can tell: the time it has taken so far against the
    time its loads took before (`expected`; None before the first). No server llmswap fronts reports its
    own load progress, so `fraction` is that estimate, held below 1 until the model is ready."""

    model: str
    elapsed: float
    expected: float | None

    @property
    def fraction(self) -> float | None:
        if self.expected is None or self.expected <= 0:
            return None
        return min(MOST_BEFORE_READY, self.elapsed / self.expected)

    def as_dict(self) -> dict[str, Any]:
        fraction = self.fraction
        return {"model": self.model, "elapsed_seconds": round(self.elapsed, 2),
                "expected_seconds": None if self.expected is None else round(self.expected, 2),
                "progress": None if fraction is None else round(fraction, 3)}


MOST_BEFORE_READY = 0.99  # an estimate never says a load is done: only the ready model does
