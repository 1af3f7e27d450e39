"""The scheduling contracts: events in, `Effects` out, pure `Scheduler` and `Swapper` in between.

Every `Scheduler.on_*` call happens on the router's event loop, one event at a time and in order (its
run-loop task, or a request's task when no event waits before it), so scheduler state needs no locks.
A scheduler never awaits, never does I/O and never reads a clock directly: it is handed one (`Clock`)
and acts on the world only through `Effects`. Slow work (loading a model, stopping processes) is
started through `Effects` and its completion comes back as another event, so no decision ever waits
for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmswap.process.state import ProcessState
from llmswap.scheduler.errors import SchedulerError

Clock = Callable[[], float]  # monotonic seconds


@dataclass(eq=False, slots=True)
class HandlerRequest:
    """One client request waiting for a decision. Identity, not value, is what matters (eq=False)."""

    model: str  # the real model id (aliases already resolved)
    seq: int  # arrival order, unique and increasing: the last deterministic tie-break
    arrived: float  # scheduler clock reading at arrival
    priority: int = 0  # per-request priority (X-Priority header or the API key's default)
    api_key: str | None = None  # identity for per-key limits; never logged
    deadline: float | None = None  # scheduler clock reading by which it should be served (X-Deadline-Ms...)
    # Requests of the same client queued behind this one (a task type's durable queue): the batch scheduler
    # counts them in its model's depth and keeps the model while they come; FIFO ignores it.
    backlog: int = 0
    handle: Any = None  # the router's waiter; schedulers never touch it


@dataclass(frozen=True)
class SwapPlan:
    """A swap the scheduler commits to, with why: the record behind swap logs and metrics."""

    model: str
    evict: tuple[str, ...]
    rule: str  # short machine-readable reason, e.g. "fifo.head", "batch.deepest_queue", "batch.max_wait"
    request_seq: int | None = None  # the request that triggered it
    detail: str = ""  # human-readable: queue depths, ages, costs...
    # Seconds the swap waited, once decided, for requests in flight on `drained` (victims) to end: its
    # `drain` phase. None when nothing was in flight on its victims.
    drain: float | None = None
    drained: tuple[str, ...] = ()


@dataclass(frozen=True)
class SwapDone:
    model: str
    error: SchedulerError | None = None
    duration: float = 0.0  # seconds from the swap's start (evictions included) to ready or failure


@dataclass(frozen=True)
class ServeDone:
    """A granted request finished (completed, failed or client gone). Posted exactly once per grant."""

    model: str
    request: HandlerRequest
    backlog: int | None = None  # its client's backlog as it ended (a task lane's queue now); None: as it came


@dataclass(frozen=True)
class Unload:
    models: tuple[str, ...]  # real model ids; the router expands "all"
    timeout: float | None = None  # None = each model's own unloadTimeout


@dataclass(frozen=True)
class StopDone:
    """Processes stopped by `Effects.stop_processes` are all dead."""

    models: tuple[str, ...]


@dataclass(frozen=True)
class ProcessStopped:
    """A process stopped without the scheduler asking: TTL expiry or an unexpected exit."""

    model: str
    unexpected: bool = False
    exit_code: int | None = None


@dataclass(frozen=True)
class QueueSnapshot:
    """A read-only view for /running, metrics and the loading feedback."""

    waiting: Mapping[str, int] = field(default_factory=dict)  # model -> queued + joined-swap waiters
    in_flight: Mapping[str, int] = field(default_factory=dict)
    loading: tuple[str, ...] = ()  # models with a swap in progress


@dataclass(frozen=True)
class ModelLoad:
    """One model's load as a request arriving now would meet it (read by selectors)."""

    state: ProcessState
    in_flight: int = 0  # granted, response not ended
    waiting: int = 0  # queued or joined to a swap, or posted to the router and not yet handled
    loading: bool = False  # a swap to it is under way
    accepts: bool = True  # one more request would be taken within its limits and queue bounds


class Effects(Protocol):
    """The scheduler's whole window onto the world, implemented by `Router`."""

    def model_state(self, model: str) -> ProcessState | None:
        """The process state, or None when this router does not handle `model`."""

    def running_models(self) -> Mapping[str, ProcessState]:
        """Every model whose process is starting, ready or stopping."""

    def start_swap(self, plan: SwapPlan) -> None:
        """Stop `plan.evict`, then start `plan.model`; returns at once, a `SwapDone` follows."""

    def abort_swap(self, model: str) -> None:
        """Abort a load nobody waits for any more; its `SwapDone` still follows (with an error)."""

    def admit(self, req: HandlerRequest) -> bool:
        """Tell the waiter it passed admission (a loading stream may begin). False: the client is gone."""

    def grant_serve(self, req: HandlerRequest, model: str) -> bool:
        """Hand the waiter its upstream. False: the client is gone, and no `ServeDone` will come."""

    def grant_error(self, req: HandlerRequest, err: SchedulerError) -> None:
        """Answer the waiter with an error."""

    def stop_processes(self, models: Sequence[str], timeout: float | None) -> None:
        """Stop these processes in parallel; returns at once, a `StopDone` follows."""

    def notify_position(self, req: HandlerRequest, position: int) -> None:
        """The waiter's 1-based place in the queue changed (for the loading feedback)."""

    def preempt(self, req: HandlerRequest, message: str) -> None:
        """End in-flight `req` early to make room (preemption, `llmswap.scheduler.preemption`): abort its
        upstream request and answer its client `Preempted(message)`. Its `ServeDone` still follows."""

    def prefetch(self, model: str) -> None:
        """A swap to `model` is decided and waits for its victims' requests to end: read its files into the
        page cache meanwhile (a no-op when prefetch is off or under way). Never delays anything."""

    def cancel_prefetch(self, model: str) -> None:
        """No swap to `model` waits any more (its requests left): stop reading its files, unless a swap to
        it has started (the swap then owns the read)."""

    def inherited_in_flight(self, model: str) -> int:
        """Requests of `model` that a predecessor router (before a config reload) is still serving: they
        count toward `concurrencyLimit` here too, or a reload would briefly double the limit."""


class Scheduler(Protocol):
    def on_request(self, req: HandlerRequest) -> None: ...
    def try_grant_now(self, req: HandlerRequest) -> bool:
        """Grant `req` at once, as `on_request` would, when that is all `on_request` would do (its model
        ready and free, within every limit, nothing queued that comes first); False: nothing changed, and
        `req` must go through `on_request`. Asked only when no other event is pending before it."""
    def world_changed(self) -> None:
        """A process changed state on its own (outside the scheduler's events): drop whatever was
        concluded from the old state (`try_grant_now`'s verdicts)."""
    def on_cancel(self, req: HandlerRequest) -> None: ...
    def on_swap_done(self, ev: SwapDone) -> None: ...
    def on_serve_done(self, ev: ServeDone) -> None: ...
    def on_unload(self, ev: Unload) -> None: ...
    def on_stop_done(self, ev: StopDone) -> None: ...
    def on_process_stopped(self, ev: ProcessStopped) -> None: ...
    def on_tick(self) -> None:
        """Time passed: re-examine timers (queue timeouts, batching waits)."""

    def next_deadline(self) -> float | None:
        """The clock reading at which `on_tick` should next run, or None when no timer is pending."""

    def on_shutdown(self, err: SchedulerError) -> None: ...
    def snapshot(self) -> QueueSnapshot: ...
    def accepts(self, model: str, ahead: int = 0) -> bool:
        """Whether a request for `model` arriving now (after `ahead` more on their way) would be taken,
        not refused by a limit or a queue bound."""


class Swapper(Protocol):
    """Eviction policy: a pure function of its inputs; raises `CannotFit` when `target` can never run."""

    def evictions_for(self, target: str, running: Sequence[str]) -> list[str]:
        """Models in `running` that must stop for `target` to run. Speculative: must not log or mutate."""

    def on_swap_start(self, target: str, running: Sequence[str]) -> None:
        """Called once when a swap is committed: the one place a swapper logs."""


SchedulerFactory = Callable[[Effects], Scheduler]
