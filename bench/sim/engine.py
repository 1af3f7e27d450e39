"""A discrete-event simulation of one router: a virtual clock, simulated processes, a real scheduler.

`Simulation` plays Router's part without processes or an event loop: it implements `Effects`,
feeds the scheduler its events one at a time in clock order, and arms the scheduler's timer
(`next_deadline` → `on_tick`) the way Router does. A swap takes its model's load time (the
victims stop at once), a granted request is served for a service time drawn per request, an
unload stops at once. The scheduler under test is the production `FifoScheduler` or
`BatchScheduler`, reading the simulation's clock.

Nothing in an `Effects` method calls back into the scheduler: every consequence is scheduled as
an event, as in the router, so the scheduler sees the same event order it would in production.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llmswap.process.state import ProcessState
from llmswap.scheduler.errors import Preempted, SchedulerError, SwapFailed
from llmswap.scheduler.types import (
    HandlerRequest,
    Scheduler,
    ServeDone,
    StopDone,
    SwapDone,
    SwapPlan,
)


@dataclass(frozen=True)
class ModelTimes:
    """How a simulated model behaves: seconds to load, and a request's service time (mean, ± spread)."""

    load: float
    service: float
    spread: float = 0.2  # each request takes service * uniform(1 - spread, 1 + spread)


@dataclass
class Outcome:
    """What happened to one simulated request."""

    request: HandlerRequest
    granted: float | None = None
    finished: float | None = None
    error: SchedulerError | None = None

    @property
    def wait(self) -> float | None:
        return None if self.granted is None else self.granted - self.request.arrived


Callback = Callable[[Outcome], None]


@dataclass
class _Client:
    outcome: Outcome
    on_done: Callback | None


@dataclass
class _Loading:
    plan: SwapPlan
    started: float
    token: int
    aborted: bool = False


@dataclass
class SimResult:
    outcomes: list[Outcome] = field(default_factory=list)
    swaps: list[SwapPlan] = field(default_factory=list)
    aborts: int = 0
    end: float = 0.0  # when the last request finished

    @property
    def waits(self) -> list[float]:
        return [o.wait for o in self.outcomes if o.wait is not None]

    @property
    def errors(self) -> int:
        return sum(1 for o in self.outcomes if o.error is not None)


SchedulerMaker = Callable[["Simulation"], Scheduler]


class Simulation:
    """Virtual time, simulated processes, and one scheduler driven through `Effects`."""

    def __init__(self, models: Mapping[str, ModelTimes], make_scheduler: SchedulerMaker, *, seed: int = 1,
                 start: float = 0.0) -> None:
        self.models = dict(models)
        self.now = start
        self._start = start
        self._rng = random.Random(seed)
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._seq = itertools.count(1)
        self._tokens = itertools.count(1)
        self.states: dict[str, ProcessState] = {m: ProcessState.STOPPED for m in models}
        self._loading: dict[str, _Loading] = {}
        self._clients: dict[HandlerRequest, _Client] = {}
        self._factors: dict[HandlerRequest, float] = {}  # each request's service time factor
        self._preempted: set[HandlerRequest] = set()  # ended early: their service completion is void
        self._armed: float | None = None
        self._arm_token = 0
        self.result = SimResult()
        self.scheduler = make_scheduler(self)

    # ----------------------------------------------------------------------------- the clock

    def clock(self) -> float:
        return self.now

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(when, self.now), next(self._order), action))

    def after(self, delay: float, action: Callable[[], None]) -> None:
        self.at(self.now + delay, action)

    def run(self, until: float | None = None) -> SimResult:
        """Play events in clock order until none are left (or `until`)."""
        while self._heap:
            when, _, action = heapq.heappop(self._heap)
            if until is not None and when > until:
                break
            self.now = when
            action()
        return self.result

    # ----------------------------------------------------------------------------- clients

    def submit(self, model: str, *, priority: int = 0, api_key: str | None = None,
               on_done: Callback | None = None) -> Outcome:
        """A client sends a request for `model` now; `on_done` runs when it is answered and served."""
        req = HandlerRequest(model=model, seq=next(self._seq), arrived=self.now, priority=priority,
                             api_key=api_key)
        outcome = Outcome(req)
        self.result.outcomes.append(outcome)
        # Drawn at arrival, not at grant: the same request then takes the same time under every
        # scheduler (common random numbers), so their numbers differ by their decisions alone.
        self._factors[req] = self._rng.uniform(-1.0, 1.0)
        self._clients[req] = _Client(outcome, on_done)
        self._deliver(lambda: self.scheduler.on_request(req))
        return outcome

    def _deliver(self, event: Callable[[], None]) -> None:
        """Hand the scheduler one event, then re-arm its timer as Router does."""
        event()
        self._arm()

    def _arm(self) -> None:
        deadline = self.scheduler.next_deadline()
        if deadline == self._armed:
            return
        self._armed = deadline
        self._arm_token += 1
        if deadline is not None:
            token = self._arm_token
            self.at(deadline, lambda: self._tick(token))

    def _tick(self, token: int) -> None:
        if token != self._arm_token:
            return  # re-armed since
        self._armed = None
        self._deliver(self.scheduler.on_tick)

    # ----------------------------------------------------------------------------- Effects

    def model_state(self, model: str) -> ProcessState | None:
        return self.states.get(model)

    def running_models(self) -> Mapping[str, ProcessState]:
        return {m: s for m, s in self.states.items() if s.is_running}

    def start_swap(self, plan: SwapPlan) -> None:
        self.result.swaps.append(plan)
        for victim in plan.evict:
            self.states[victim] = ProcessState.STOPPED
        self.states[plan.model] = ProcessState.STARTING
        loading = _Loading(plan, self.now, next(self._tokens))
        self._loading[plan.model] = loading
        self.after(self.models[plan.model].load, lambda: self._loaded(loading))

    def _loaded(self, loading: _Loading) -> None:
        if loading.aborted or self._loading.get(loading.plan.model) is not loading:
            return
        del self._loading[loading.plan.model]
        self.states[loading.plan.model] = ProcessState.READY
        done = SwapDone(loading.plan.model, None, self.now - loading.started)
        self._deliver(lambda: self.scheduler.on_swap_done(done))

    def prefetch(self, model: str) -> None:
        """The simulation models no page cache: a load costs its measured time whatever was read before."""

    def cancel_prefetch(self, model: str) -> None:
        """See `prefetch`."""

    def abort_swap(self, model: str) -> None:
        loading = self._loading.pop(model, None)
        if loading is None:
            return
        loading.aborted = True
        self.result.aborts += 1
        self.states[model] = ProcessState.STOPPED
        done = SwapDone(model, SwapFailed(f"loading {model} was aborted"), self.now - loading.started)
        self.after(0.0, lambda: self._deliver(lambda: self.scheduler.on_swap_done(done)))

    def admit(self, req: HandlerRequest) -> bool:
        return True

    def inherited_in_flight(self, model: str) -> int:
        return 0  # the simulation never reloads its config

    def grant_serve(self, req: HandlerRequest, model: str) -> bool:
        client = self._clients[req]
        client.outcome.granted = self.now
        times = self.models[model]
        service = times.service * (1 + times.spread * self._factors.pop(req, 0.0))
        self.after(service, lambda: self._served(req, model))
        return True

    def _served(self, req: HandlerRequest, model: str) -> None:
        if req in self._preempted:
            self._preempted.discard(req)
            self._clients.pop(req, None)
            return  # its ServeDone went out when it was preempted
        client = self._clients.pop(req)
        client.outcome.finished = self.now
        self.result.end = max(self.result.end, self.now - self._start)
        self._deliver(lambda: self.scheduler.on_serve_done(ServeDone(model, req)))
        if client.on_done is not None:
            client.on_done(client.outcome)

    def grant_error(self, req: HandlerRequest, err: SchedulerError) -> None:
        client = self._clients.pop(req)
        client.outcome.error = err
        if client.on_done is not None:
            on_done, outcome = client.on_done, client.outcome
            self.after(0.0, lambda: on_done(outcome))

    def preempt(self, req: HandlerRequest, message: str) -> None:
        """The request's answer ends now: its client gets `Preempted`, the scheduler its ServeDone."""
        client = self._clients.get(req)
        if client is None or client.outcome.finished is not None:
            return
        client.outcome.error = Preempted(message)
        client.outcome.finished = self.now
        self._preempted.add(req)
        model = req.model
        self.after(0.0, lambda: self._deliver(lambda: self.scheduler.on_serve_done(ServeDone(model, req))))

    def stop_processes(self, models: Sequence[str], timeout: float | None) -> None:
        for model in models:
            self.states[model] = ProcessState.STOPPED
        stopped = tuple(models)
        self.after(0.0, lambda: self._deliver(lambda: self.scheduler.on_stop_done(StopDone(stopped))))

    def notify_position(self, req: HandlerRequest, position: int) -> None:
        """Positions feed the loading stream of real clients; the simulation has none."""
