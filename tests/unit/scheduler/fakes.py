"""Test doubles for the pure schedulers: a recording `Effects`, a manual clock, a scripted swapper.

Everything is synchronous: a test drives `Scheduler.on_*` directly, changes the fake world
(`effects.states`, `effects.gone`) the way the router would, and asserts on what was recorded.

    clock = ManualClock()
    effects = FakeEffects({"a": ProcessState.STOPPED})
    requests = RequestFactory(clock)
    sched = FifoScheduler("test", ScriptedSwapper(), effects, clock=clock)
    r = requests.make("a")
    sched.on_request(r)
    effects.complete_swap(sched, "a")      # target ready, victims stopped, SwapDone delivered
    assert effects.was_served(r)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmswap.process.state import ProcessState
from llmswap.scheduler.errors import CannotFit, SchedulerError
from llmswap.scheduler.types import HandlerRequest, Scheduler, ServeDone, StopDone, SwapDone, SwapPlan


class ManualClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        self.now += seconds


class RequestFactory:
    """Builds requests with increasing `seq` and `arrived` read from the clock."""

    def __init__(self, clock: ManualClock) -> None:
        self._clock = clock
        self._seq = itertools.count(1)

    def make(self, model: str, *, priority: int = 0, api_key: str | None = None,
             deadline_in: float | None = None, backlog: int = 0) -> HandlerRequest:
        """`deadline_in`: seconds from now by which it should be served (X-Deadline-Ms / 1000); `backlog`:
        requests its client has queued behind it (a task lane's hint)."""
        now = self._clock()
        return HandlerRequest(
            model=model, seq=next(self._seq), arrived=now, priority=priority, api_key=api_key,
            deadline=None if deadline_in is None else now + deadline_in, backlog=backlog,
        )


@dataclass(frozen=True)
class Grant:
    """One `grant_serve` or `grant_error` call."""

    request: HandlerRequest
    model: str
    error: SchedulerError | None = None
    received: bool = False  # serve grants: what grant_serve returned

    @property
    def served(self) -> bool:
        return self.error is None and self.received


@dataclass(frozen=True)
class Stop:
    models: tuple[str, ...]
    timeout: float | None


class FakeEffects:
    """An in-memory `Effects`: the test programs process states and departed clients."""

    def __init__(self, states: Mapping[str, ProcessState] | None = None) -> None:
        self.states: dict[str, ProcessState] = dict(states or {})  # missing = not handled by the router
        self.gone: set[HandlerRequest] = set()  # clients that left: admit and grant_serve say False
        self.refuse_serve: set[str] = set()  # models whose grant_serve always says False
        self.inherited: dict[str, int] = {}  # requests a predecessor router still serves, per model

        self.starts: list[SwapPlan] = []
        self.preempted: list[tuple[HandlerRequest, str]] = []  # preempt calls, in order
        self.aborts: list[str] = []
        self.admitted: list[HandlerRequest] = []
        self.grants: list[Grant] = []
        self.stops: list[Stop] = []
        self.positions: dict[HandlerRequest, list[int]] = {}
        self.calls: list[tuple[str, object]] = []  # every call, in order
        self.prefetches: list[tuple[str, str]] = []  # prefetch and cancel_prefetch calls, in order

    # ----------------------------------------------------------------------------- Effects

    def model_state(self, model: str) -> ProcessState | None:
        return self.states.get(model)

    def running_models(self) -> Mapping[str, ProcessState]:
        return {m: s for m, s in self.states.items() if s.is_running}

    def start_swap(self, plan: SwapPlan) -> None:
        self.calls.append(("start_swap", plan))
        self.starts.append(plan)

    def abort_swap(self, model: str) -> None:
        self.calls.append(("abort_swap", model))
        self.aborts.append(model)

    def admit(self, req: HandlerRequest) -> bool:
        self.calls.append(("admit", req))
        if req in self.gone:
            return False
        self.admitted.append(req)
        return True

    def inherited_in_flight(self, model: str) -> int:
        return self.inherited.get(model, 0)

    def grant_serve(self, req: HandlerRequest, model: str) -> bool:
        received = req not in self.gone and model not in self.refuse_serve
        self.calls.append(("grant_serve", req))
        self.grants.append(Grant(req, model, None, received))
        return received

    def grant_error(self, req: HandlerRequest, err: SchedulerError) -> None:
        self.calls.append(("grant_error", req))
        self.grants.append(Grant(req, req.model, err))

    def preempt(self, req: HandlerRequest, message: str) -> None:
        self.calls.append(("preempt", req))
        self.preempted.append((req, message))

    def stop_processes(self, models: Sequence[str], timeout: float | None) -> None:
        self.calls.append(("stop_processes", tuple(models)))
        self.stops.append(Stop(tuple(models), timeout))

    def prefetch(self, model: str) -> None:
        self.prefetches.append(("prefetch", model))

    def cancel_prefetch(self, model: str) -> None:
        self.prefetches.append(("cancel", model))

    def notify_position(self, req: HandlerRequest, position: int) -> None:
        self.calls.append(("notify_position", (req, position)))
        self.positions.setdefault(req, []).append(position)

    # ----------------------------------------------------------------------------- the world moves

    def complete_swap(
        self, sched: Scheduler, model: str, error: SchedulerError | None = None, duration: float = 0.0
    ) -> None:
        """Finish the latest swap to `model` as the router would: victims stopped, target ready (or not)."""
        plan = self.last_start(model)
        assert plan is not None, f"no swap to {model} was started"
        for victim in plan.evict:
            self.states[victim] = ProcessState.STOPPED
        self.states[model] = ProcessState.STOPPED if error is not None else ProcessState.READY
        sched.on_swap_done(SwapDone(model, error, duration))

    def finish_serving(self, sched: Scheduler, req: HandlerRequest, backlog: int | None = None) -> None:
        """The granted request's response ended: post its ServeDone (`backlog`: its client's, by then)."""
        grant = self.serve_grant(req)
        assert grant is not None and grant.received, "only a received grant posts ServeDone"
        sched.on_serve_done(ServeDone(grant.model, req, backlog))

    def complete_stop(self, sched: Scheduler, index: int = -1) -> None:
        """The processes of one `stop_processes` call are dead."""
        stop = self.stops[index]
        for model in stop.models:
            if model in self.states:
                self.states[model] = ProcessState.STOPPED
        sched.on_stop_done(StopDone(stop.models))

    # ----------------------------------------------------------------------------- queries

    def starts_for(self, model: str) -> int:
        return sum(1 for plan in self.starts if plan.model == model)

    def last_start(self, model: str) -> SwapPlan | None:
        return next((plan for plan in reversed(self.starts) if plan.model == model), None)

    def served(self, model: str | None = None) -> int:
        return sum(1 for g in self.grants if g.served and (model is None or g.model == model))

    def errored(self, model: str | None = None) -> int:
        return sum(1 for g in self.grants if g.error is not None and (model is None or g.model == model))

    def grants_for(self, req: HandlerRequest) -> list[Grant]:
        return [g for g in self.grants if g.request is req]

    def serve_grant(self, req: HandlerRequest) -> Grant | None:
        return next((g for g in self.grants if g.request is req and g.error is None), None)

    def was_served(self, req: HandlerRequest) -> bool:
        grant = self.serve_grant(req)
        return grant is not None and grant.received

    def error_of(self, req: HandlerRequest) -> SchedulerError | None:
        return next((g.error for g in self.grants if g.request is req and g.error is not None), None)

    def is_pending(self, req: HandlerRequest) -> bool:
        """Neither served nor errored yet (queued or waiting on a swap)."""
        return not self.grants_for(req)

    def last_position(self, req: HandlerRequest) -> int | None:
        seen = self.positions.get(req)
        return seen[-1] if seen else None


def advance(sched: Scheduler, clock: ManualClock, seconds: float) -> int:
    """Move the clock forward, firing the scheduler's timer at each deadline on the way as Router does.

    Returns how many ticks fired.
    """
    target = clock.now + seconds
    ticks = 0
    while True:
        deadline = sched.next_deadline()
        if deadline is None or deadline > target:
            break
        assert ticks < 10_000, "the scheduler keeps asking for ticks without progress"
        clock.now = max(clock.now, deadline)
        sched.on_tick()
        ticks += 1
    clock.now = target
    return ticks


class ScriptedSwapper:
    """A `Swapper` with a fixed answer per target (whatever is running), like llama-swap's stubPlanner."""

    def __init__(
        self, evict: Mapping[str, Sequence[str]] | None = None, *, cannot_fit: Mapping[str, str] | None = None
    ) -> None:
        self.evict = {target: list(models) for target, models in (evict or {}).items()}
        self.cannot_fit = dict(cannot_fit or {})
        self.swap_starts: list[tuple[str, tuple[str, ...]]] = []

    def evictions_for(self, target: str, running: Sequence[str]) -> list[str]:
        if target in self.cannot_fit:
            raise CannotFit(self.cannot_fit[target])
        return list(self.evict.get(target, ()))

    def on_swap_start(self, target: str, running: Sequence[str]) -> None:
        self.swap_starts.append((target, tuple(running)))
