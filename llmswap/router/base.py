"""BaseRouter: owns the upstream processes, the event queue and the one run-loop task; implements `Effects`.

Every scheduler call happens on `_run`, one event at a time, so scheduler state needs no locks. Slow work
(stopping victims, starting a model, stopping processes for an unload) runs in tasks started by the
`Effects` methods, and its completion comes back through the same queue as an event. A request waits on
two futures of its `Waiter`: `admitted` (passed admission: a loading stream may start) and `granted`.

A config reload retires a router in favour of a successor that adopted some of its processes
(`llmswap.router.handover`): the retired router sends its waiters and new requests to the successor,
finishes the requests it already granted, and tells the successor what it still does to adopted processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from llmswap.config.model import Config, ModelConfig
from llmswap.process import LogRing, Process
from llmswap.process.state import ProcessState
from llmswap.scheduler.errors import Preempted, SchedulerError, ShuttingDown, SwapFailed
from llmswap.scheduler.types import (
    Effects,
    HandlerRequest,
    ModelLoad,
    ProcessStopped,
    Scheduler,
    SchedulerFactory,
    SchedulerSnapshot,
    ServeDone,
    StopDone,
    SwapDone,
    SwapPlan,
    Unload,
)

if TYPE_CHECKING:
    from llmswap.router.handover import Handover

log = logging.getLogger("llmswap.router")


class Rerouted(SchedulerError):
    """A retired router hands a waiter to its successor; `acquire` catches it and waits there instead."""

    status = 503
    code = "reloading"


class ProcessLike(Protocol):
    """What the router needs of an upstream process (`llmswap.process.Process` in production)."""

    id: str
    config: ModelConfig

    @property
    def state(self) -> ProcessState: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def last_start_duration(self) -> float | None: ...
    async def ensure_ready(self) -> None: ...
    async def stop(self, timeout: float | None = None) -> None: ...
    async def shutdown(self, timeout: float = 1.0) -> None: ...
    def track_request(self) -> contextlib.AbstractContextManager[None]: ...


ProcessFactory = Callable[[ModelConfig, Callable[[Any], None]], ProcessLike]


@dataclass(eq=False)
class Waiter:
    """The router's side of one HandlerRequest: the futures its HTTP handler awaits."""

    admitted: asyncio.Future[None]
    granted: asyncio.Future[str]
    on_position: Callable[[int], None] | None = None
    position: int = 0
    gone: bool = False  # the client left; grants must fail
    load: float = 0.0  # seconds of its wait its model spent loading (for the access log)
    task: asyncio.Task[Any] | None = None  # the task serving it once granted (preemption cancels it)
    preempted: str | None = None  # set by `preempt`: why its answer is being ended


@dataclass(frozen=True)
class _Request:
    req: HandlerRequest


@dataclass(frozen=True)
class _Cancel:
    req: HandlerRequest


@dataclass(frozen=True)
class _Tick:
    pass


@dataclass(frozen=True)
class _UnloadRequest:
    unload: Unload
    done: asyncio.Future[None]


@dataclass(frozen=True)
class _Shutdown:
    pass


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


@dataclass
class _Swap:
    plan: SwapPlan
    task: asyncio.Task[None] | None = None
    starting: bool = False  # past the evictions: cancelling the task now aborts the target's start
    evicted: bool = False  # every victim is stopped
    aborted: bool = False


@dataclass
class RouterStats:
    """Counters the server's metrics read; mutated only on the loop thread."""

    swaps_by_rule: dict[str, int] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)
    swap_failures: int = 0


Observer = Callable[[object], None]


class BaseRouter(Effects):
    """Process machinery + run loop. Concrete routers only choose the swapper and scheduler (`factory`)."""

    def __init__(
        self,
        name: str,
        config: Config,
        factory: SchedulerFactory,
        *,
        process_factory: ProcessFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
        processes: Mapping[str, ProcessLike] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.clock = clock
        self.stats = RouterStats()
        self._observers: list[Observer] = []
        self._events: asyncio.Queue[object] = asyncio.Queue()
        self._seq = itertools.count(1)
        self._swaps: dict[str, _Swap] = {}
        self._stop_tasks: set[asyncio.Task[None]] = set()
        self._unload_done: asyncio.Future[None] | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._tick_at: float | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._closing = False
        self._processed = 0  # events fully handled; tests wait on it instead of sleeping
        self._idle = asyncio.Event()
        self._loads: dict[str, tuple[float, float]] = {}  # each model's last successful load: (start, ready)
        self._serving: dict[str, int] = {}  # granted requests whose response has not ended, per model
        # Requests posted to the run loop that the scheduler has not seen yet, per model: `load_of` counts
        # them, so two choices made in one loop step do not both see room for one.
        self._unhandled: dict[str, int] = {}
        # Config reload: the handover this router took over from (its predecessor still winding down),
        # and the one that retired it. See llmswap.router.handover.
        self._handover_in: Handover | None = None
        self._handover_out: Handover | None = None
        self._rerouting = False  # the scheduler was told to hand every waiter to the successor
        # Every model's output also goes to one combined ring: /logs/stream/upstream tails it.
        self.upstream_log = LogRing("upstream")
        make = process_factory or self._make_process
        given = dict(processes or {})
        self.processes: dict[str, ProcessLike] = {
            mid: given[mid] if mid in given else make(mc, self._on_process_event)
            for mid, mc in config.models.items()
        }
        self.scheduler: Scheduler = factory(self)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the run loop on the running event loop."""
        if self._run_task is None:
            self._run_task = asyncio.get_running_loop().create_task(self._run(), name=f"router:{self.name}")

    async def shutdown(self, timeout: float | None = None) -> None:
        """Fail every waiter, stop every process concurrently, end the run loop."""
        if self._closing:
            raise RuntimeError(f"{self.name}: shutdown already in progress")
        self._closing = True
        if self._run_task is not None:
            self._events.put_nowait(_Shutdown())
            await self._run_task
        swap_tasks = [s.task for s in self._swaps.values() if s.task is not None]
        for task in swap_tasks:
            task.cancel()
        await asyncio.gather(*swap_tasks, return_exceptions=True)
        grace = timeout if timeout is not None else 5.0
        # A retired router no longer owns the processes its successor adopted: the successor stops them.
        handed = self._handover_out.adopted if self._handover_out is not None else frozenset()
        await asyncio.gather(
            *(p.shutdown(grace) for mid, p in self.processes.items() if mid not in handed),
            return_exceptions=True,
        )
        await asyncio.gather(*self._stop_tasks, return_exceptions=True)
        predecessor = self._handover_in
        if predecessor is not None and not predecessor.old.closing:
            await predecessor.old.shutdown(timeout)

    @property
    def closing(self) -> bool:
        return self._closing

    def add_observer(self, observer: Observer) -> None:
        """Receive swap and process notifications (on the loop thread; must not block)."""
        self._observers.append(observer)

    @property
    def observers(self) -> tuple[Observer, ...]:
        return tuple(self._observers)

    # ----------------------------------------------------------------- config reload (see handover.py)

    @property
    def handover_in(self) -> Handover | None:
        """The handover this router took over from, while its predecessor still winds down."""
        return self._handover_in

    @property
    def retired(self) -> bool:
        """Whether a config reload handed this router's work to a successor."""
        return self._handover_out is not None

    def hand_over(self, handover: Handover) -> None:
        """Retire in favour of `handover.new`: waiters and new requests go there from now on.

        Synchronous, so no request can slip between the two routers. Requests already granted here
        finish here; `handover` tracks them and the swaps still running until this router is idle.
        """
        if handover.old is not self or self._handover_out is not None:
            raise RuntimeError(f"{self.name}: already handed over, or the handover is not from this router")
        self._handover_out = handover
        handover.new._handover_in = handover
        # The scheduler hands every waiter over before it handles anything else (see _run); the tick
        # only wakes the loop up for that.
        self._post(_Tick())

    def swap_claims(self) -> dict[str, ProcessState]:
        """What this router's unfinished swaps are doing to processes: the target is starting, victims
        not yet stopped are stopping. A successor reads this for the processes it adopted."""
        claims: dict[str, ProcessState] = {}
        for swap in self._swaps.values():
            if not swap.evicted:
                for victim in swap.plan.evict:
                    claims[victim] = ProcessState.STOPPING
        for model, swap in self._swaps.items():
            if not swap.aborted:
                claims.setdefault(model, ProcessState.STARTING)
        return claims

    def serving(self, model: str) -> int:
        """Granted requests of `model` whose responses have not ended yet."""
        return self._serving.get(model, 0)

    @property
    def busy(self) -> bool:
        """Whether a swap is under way or a granted response has not ended."""
        return bool(self._swaps) or any(self._serving.values())

    def poke(self) -> None:
        """Have the scheduler re-read its queue: the world changed without an event of its own."""
        self._post(_Tick())

    def finish_loop(self) -> None:
        """End the run loop of a retired router that has nothing left to do."""
        self._post(_Shutdown())

    def _handover_progress(self) -> None:
        if self._handover_out is not None:
            self._handover_out.changed()

    # ----------------------------------------------------------------- public request API

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
    ) -> AsyncIterator[ProcessLike]:
        """Wait until `model` may serve, yield its process, and report the end of the request.

        Raises the `SchedulerError` the scheduler chose (unknown model, limits, failed swap...). Honours
        cancellation at every point: a cancelled waiter leaves the queue and never triggers a swap.
        """
        if self._handover_out is not None:
            async with self._handover_out.new.acquire(
                model, priority=priority, api_key=api_key, on_admitted=on_admitted, on_position=on_position,
                deadline_ms=deadline_ms, on_granted=on_granted,
            ) as process:
                yield process
            return
        if self._closing or self._run_task is None:
            raise ShuttingDown(f"{self.name} is shutting down")
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), loop.create_future(), on_position)
        arrived = self.clock()
        req = HandlerRequest(
            model=model, seq=next(self._seq), arrived=arrived, priority=priority,
            api_key=api_key, handle=waiter,
            deadline=arrived + deadline_ms / 1000 if deadline_ms else None,
        )
        self._unhandled[model] = self._unhandled.get(model, 0) + 1
        self._events.put_nowait(_Request(req))
        admitted_told = False
        try:
            await waiter.admitted
            if on_admitted is not None:
                admitted_told = True
                on_admitted(self.model_state(model) or ProcessState.STOPPED)
            granted_model = await waiter.granted
        except Rerouted:
            granted_model = None
        except asyncio.CancelledError:
            waiter.gone = True
            if _succeeded(waiter.granted):
                # Granted in the same instant the client left: the grant counted, so it must be released.
                self._served(waiter.granted.result(), req)
            else:
                self._post(_Cancel(req))
            raise
        if granted_model is None:
            # This router was retired while the request waited: wait on the successor instead. The
            # loading stream (if any) has already begun and must not begin twice.
            assert self._handover_out is not None
            async with self._handover_out.new.acquire(
                model, priority=priority, api_key=api_key,
                on_admitted=None if admitted_told else on_admitted, on_position=on_position,
                # The same deadline, not a new one from now: what is left of it (already late: barely any).
                deadline_ms=None if req.deadline is None else max(1e-3, (req.deadline - self.clock()) * 1000),
                on_granted=on_granted,
            ) as process:
                yield process
            return
        process = self.processes[granted_model]
        if on_granted is not None:
            on_granted(waiter.load)  # seconds of the wait spent on its model's load
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
            self._served(granted_model, req)

    def _served(self, model: str, req: HandlerRequest) -> None:
        """A granted request ended: tell the scheduler, and a successor waiting for this model to be free."""
        self._post(ServeDone(model, req))
        left = self._serving.get(model, 0) - 1
        if left > 0:
            self._serving[model] = left
        else:
            self._serving.pop(model, None)
            self._handover_progress()

    async def unload(self, models: Iterable[str] | None = None, timeout: float | None = None) -> None:
        """Stop these models (all when None), failing their waiters; returns once the processes are dead."""
        if self._handover_out is not None:
            await self._handover_out.new.unload(models, timeout)
            return
        targets = tuple(models) if models is not None else tuple(self.processes)
        if self._closing or self._run_task is None:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._events.put_nowait(_UnloadRequest(Unload(targets, timeout), done))
        await done

    def snapshot(self) -> SchedulerSnapshot:
        return self.scheduler.snapshot()

    def load_of(self, model: str) -> ModelLoad | None:
        """What a request for `model` arriving now would meet; None when this router lacks the model."""
        if self._handover_out is not None:
            return self._handover_out.new.load_of(model)
        state = self.model_state(model)
        if state is None:
            return None
        counts = self.scheduler.snapshot()
        ahead = self._unhandled.get(model, 0)
        return ModelLoad(state, counts.in_flight.get(model, 0), counts.waiting.get(model, 0) + ahead,
                         model in counts.loading, self.scheduler.accepts(model, ahead))

    def model_extras(self, model: str) -> dict[str, Any]:
        """Router-specific facts about a model for /running and /v1/models (vram: its footprint)."""
        return {}

    def router_extras(self) -> dict[str, Any]:
        """Router-specific facts for /running (the vram router adds its budget in use)."""
        return {}

    async def wait_idle(self) -> None:
        """Wait until every posted event has been handled (tests use this instead of sleeping)."""
        while not self._events.empty() or not self._idle.is_set():
            self._idle.clear()
            await self._idle.wait()

    # ----------------------------------------------------------------- run loop

    def _post(self, event: object) -> None:
        if self._run_task is not None and not self._run_task.done():
            self._events.put_nowait(event)

    async def _run(self) -> None:
        sched = self.scheduler
        while True:
            if self._events.empty():
                self._idle.set()
            event = await self._events.get()
            self._idle.clear()
            if self._handover_out is not None and not self._rerouting:
                self._rerouting = True
                # Before anything else: a retired scheduler must not start another swap, and every
                # waiter goes on to wait on the successor (acquire catches Rerouted).
                try:
                    sched.on_shutdown(Rerouted(f"{self.name} was replaced by a config reload"))
                except Exception:
                    log.exception("router %s: error handing its waiters over", self.name)
            try:
                match event:
                    case _Request(req):
                        _decrement(self._unhandled, req.model)
                        sched.on_request(req)
                    case _Cancel(req):
                        sched.on_cancel(req)
                    case SwapDone():
                        self._finish_swap(event)
                        sched.on_swap_done(event)
                    case ServeDone():
                        sched.on_serve_done(event)
                    case _UnloadRequest(unload, done):
                        self._unload_done = done
                        try:
                            sched.on_unload(unload)
                        finally:
                            if self._unload_done is not None:  # the scheduler stopped nothing
                                _resolve(self._unload_done)
                                self._unload_done = None
                    case StopDone():
                        sched.on_stop_done(event)
                    case ProcessStopped():
                        sched.on_process_stopped(event)
                    case _Tick():
                        self._tick_at = None
                        sched.on_tick()
                    case _Shutdown():
                        sched.on_shutdown(ShuttingDown(f"{self.name} is shutting down"))
                        self._idle.set()
                        return
                    case _:
                        log.error("router %s: unknown event %r", self.name, event)
            except Exception:
                # A scheduler bug must not kill the loop: every other waiter would hang forever.
                log.exception("router %s: error handling %s", self.name, type(event).__name__)
            self._processed += 1
            self._arm_tick()

    def _arm_tick(self) -> None:
        deadline = self.scheduler.next_deadline()
        if deadline == self._tick_at:
            return
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        self._tick_at = deadline
        if deadline is not None:
            delay = max(0.0, deadline - self.clock())
            self._tick_handle = asyncio.get_running_loop().call_later(delay, self._post, _Tick())

    # ----------------------------------------------------------------- Effects

    def model_state(self, model: str) -> ProcessState | None:
        process = self.processes.get(model)
        return self._visible_state(model, process.state) if process is not None else None

    def running_models(self) -> Mapping[str, ProcessState]:
        states = {mid: self._visible_state(mid, p.state) for mid, p in self.processes.items()}
        return {mid: state for mid, state in states.items() if state.is_running}

    def inherited_in_flight(self, model: str) -> int:
        total = 0
        handover = self._handover_in
        while handover is not None:  # reloads may chain: every router still winding down counts
            total += handover.old.snapshot().in_flight.get(model, 0)
            handover = handover.old.handover_in
        return total

    def _visible_state(self, model: str, state: ProcessState) -> ProcessState:
        # An adopted process that a predecessor is still starting or stopping is in that state for
        # this scheduler too, even before the predecessor's swap has touched it.
        if self._handover_in is not None:
            claimed = self._handover_in.claim(model)
            if claimed is not None:
                return claimed
        return state

    def start_swap(self, plan: SwapPlan) -> None:
        self.stats.swaps_by_rule[plan.rule] = self.stats.swaps_by_rule.get(plan.rule, 0) + 1
        for victim in plan.evict:
            self.stats.evictions[victim] = self.stats.evictions.get(victim, 0) + 1
        swap = _Swap(plan)
        swap.task = asyncio.get_running_loop().create_task(self._do_swap(swap), name=f"swap:{plan.model}")
        self._swaps[plan.model] = swap
        self._notify(SwapStarted(plan))

    def abort_swap(self, model: str) -> None:
        swap = self._swaps.get(model)
        if swap is None or swap.aborted:
            return
        swap.aborted = True
        # Victims being stopped are left to finish (a half-stopped process helps nobody); the swap
        # checks `aborted` before starting its target. Once starting, cancelling aborts the start.
        if swap.starting and swap.task is not None:
            swap.task.cancel()

    def admit(self, req: HandlerRequest) -> bool:
        waiter: Waiter = req.handle
        if waiter.gone or waiter.admitted.done():
            return False
        waiter.admitted.set_result(None)
        return True

    def grant_serve(self, req: HandlerRequest, model: str) -> bool:
        waiter: Waiter = req.handle
        if waiter.gone or waiter.granted.done():
            return False
        if not waiter.admitted.done():
            waiter.admitted.set_result(None)
        waiter.granted.set_result(model)
        load = self._loads.get(model)
        if load is not None and load[1] >= req.arrived:  # its model finished loading while it waited
            waiter.load = load[1] - max(load[0], req.arrived)
        # Counted from the grant, not from when the handler resumes: a successor must never see this
        # model as free in between.
        self._serving[model] = self._serving.get(model, 0) + 1
        return True

    def grant_error(self, req: HandlerRequest, err: SchedulerError) -> None:
        waiter: Waiter = req.handle
        if waiter.gone:
            return
        target = waiter.granted if waiter.admitted.done() else waiter.admitted
        if not target.done():
            target.set_exception(err)

    def preempt(self, req: HandlerRequest, message: str) -> None:
        """End in-flight `req` early (preemption): cancel the task serving it, which closes its upstream
        request; `acquire` turns the cancellation into `Preempted(message)` and posts its ServeDone."""
        waiter: Waiter = req.handle
        if waiter is None or waiter.preempted is not None:
            return
        waiter.preempted = message
        log.info("%s: preempting a request of %s: %s", self.name, req.model, message)
        if waiter.task is not None and not waiter.task.done():
            waiter.task.cancel(message)

    def stop_processes(self, models: Sequence[str], timeout: float | None) -> None:
        done, self._unload_done = self._unload_done, None
        task = asyncio.get_running_loop().create_task(self._do_stop(tuple(models), timeout, done))
        self._stop_tasks.add(task)
        task.add_done_callback(self._stop_tasks.discard)

    def notify_position(self, req: HandlerRequest, position: int) -> None:
        waiter: Waiter = req.handle
        waiter.position = position
        if waiter.on_position is not None and not waiter.gone:
            try:
                waiter.on_position(position)
            except Exception:
                log.exception("position callback failed")

    # ----------------------------------------------------------------- slow work, off the loop

    async def _do_swap(self, swap: _Swap) -> None:
        plan = swap.plan
        started = self.clock()
        error: SchedulerError | None = None
        target = self.processes[plan.model]
        try:
            if plan.evict:
                await asyncio.gather(*(self._evict(m) for m in plan.evict))
            swap.evicted = True
            self._handover_progress()
            if plan.evict:
                await self.after_evictions(plan)
            if self._handover_in is not None:
                await self._handover_in.before_start()
            if swap.aborted:
                raise asyncio.CancelledError
            swap.starting = True
            await self.start_target(target)
        except asyncio.CancelledError:
            # Aborted because nobody waits: make sure no half-started child stays behind. (On shutdown,
            # shutdown() itself stops every process.)
            if not self._closing:
                with contextlib.suppress(Exception):
                    await asyncio.shield(target.stop())
            error = SwapFailed(f"loading {plan.model} was aborted: no request waits for it")
        except SchedulerError as exc:
            error = exc
        except Exception as exc:
            error = SwapFailed(str(exc) or type(exc).__name__)
        duration = self.clock() - started
        if error is None:
            log.info("swap: %s ready in %.2fs (evicted %s, rule %s)", plan.model, duration,
                     list(plan.evict) or "nothing", plan.rule)
        else:
            log.warning("swap: %s failed after %.2fs: %s", plan.model, duration, error)
        self._post(SwapDone(plan.model, error, duration))

    async def _evict(self, model: str) -> None:
        # llama-swap uses healthCheckTimeout (default 120 s) as the eviction grace; the victim's own
        # unloadTimeout is what users actually configure for "how long may it take to stop".
        if self._handover_in is not None:
            await self._handover_in.before_evict(model)
        process = self.processes[model]
        await process.stop(process.config.unload_timeout)

    async def after_evictions(self, plan: SwapPlan) -> None:
        """Hook between stopping the victims and starting the target (the vram router waits for memory)."""

    async def start_target(self, process: ProcessLike) -> None:
        """Hook: bring the target up (the vram router adds out-of-memory recovery)."""
        await process.ensure_ready()

    def _finish_swap(self, ev: SwapDone) -> None:
        swap = self._swaps.pop(ev.model, None)
        if swap is None:
            return
        if ev.error is not None:
            self.stats.swap_failures += 1
        else:
            ready = self.clock()
            self._loads[ev.model] = (ready - ev.duration, ready)
        self._notify(SwapFinished(swap.plan, ev.error, ev.duration))
        self._handover_progress()

    async def _do_stop(
        self, models: tuple[str, ...], timeout: float | None, done: asyncio.Future[None] | None
    ) -> None:
        try:
            await asyncio.gather(
                *(self.processes[m].stop(timeout) for m in models if m in self.processes),
                return_exceptions=True,
            )
        finally:
            self._post(StopDone(models))
            if done is not None:
                _resolve(done)

    # ----------------------------------------------------------------- process notifications

    def _make_process(self, config: ModelConfig, on_event: Callable[[Any], None]) -> ProcessLike:
        return Process(config, on_event=on_event, mirror=self.upstream_log)

    def _on_process_event(self, event: Any) -> None:
        handover = self._handover_out
        if handover is not None and getattr(event, "model", None) in handover.adopted:
            handover.new._on_process_event(event)  # the process is the successor's now
            return
        # Stops the scheduler asked for come back as SwapDone/StopDone; only the others need telling.
        kind = getattr(event, "kind", "")
        if kind == "exited" or (kind == "stopped" and getattr(event, "detail", "") == "ttl expired"):
            self._post(ProcessStopped(event.model, unexpected=kind == "exited",
                                      exit_code=getattr(event, "exit_code", None)))
        self._notify(event)

    def _notify(self, item: object) -> None:
        for observer in self._observers:
            try:
                observer(item)
            except Exception:
                log.exception("router observer failed")


def _succeeded(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

