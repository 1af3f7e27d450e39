"""BaseRouter: owns the upstream processes, the event queue and the one run-loop task; implements `Effects`.

Every scheduler call happens on the event loop, one event at a time and in the queue's order, so scheduler
state needs no locks: `_run` hands the scheduler each posted event; a request that finds the queue empty is
offered to it directly (`Scheduler.try_grant_now`), and a request's end that finds it empty is handled
directly (`_end`), since nothing is ahead of either and handling never awaits. Slow work
(stopping victims, starting a model, stopping processes for an unload) runs in tasks started by the
`Effects` methods, and its completion comes back through the same queue as an event. A request waits on
two futures of its `Waiter`: `admitted` (passed admission: a loading stream may start) and `granted`.

A config reload retires a router in favour of a successor that adopted some of its processes
(`llmswap.router.handover`): the retired router sends its waiters and new requests to the successor,
finishes the requests it already granted, and tells the successor what it still does to adopted processes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llmswap.config.model import Config, ModelConfig
from llmswap.kvcache.rates import KvRates
from llmswap.process import LogRing, Process
from llmswap.process.events import ProcessEvent
from llmswap.router.effects import RouterEffects, resolve
from llmswap.router.requests import RequestApi
from llmswap.router.succession import IncomingHandover, Succession
from llmswap.router.types import (
    CancelRequest,
    NewRequest,
    Observer,
    ProcessEventSink,
    ProcessFactory,
    ProcessLike,
    Rerouted,
    RouterEvent,
    RouterStats,
    Shutdown,
    Tick,
    UnloadRequest,
)

# Re-exported: observers have always imported the swap notifications from here.
from llmswap.router.types import SwapFinished as SwapFinished
from llmswap.router.types import SwapStarted as SwapStarted
from llmswap.scheduler.errors import ShuttingDown
from llmswap.scheduler.types import (
    ProcessStopped,
    QueueSnapshot,
    Scheduler,
    SchedulerFactory,
    ServeDone,
    StopDone,
    SwapDone,
    Swapper,
    Unload,
)

log = logging.getLogger("llmswap.router")


class BaseRouter(RequestApi, RouterEffects):
    """Process machinery + run loop. Concrete routers only choose the swapper and scheduler (`factory`)."""

    swapper: Swapper | None = None  # the eviction policy, set by each concrete router

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
        RouterEffects.__init__(self)
        self.name = name
        self.config = config
        self.clock = clock
        self.stats = RouterStats()
        self._observers: list[Observer] = []
        self._events: asyncio.Queue[object] = asyncio.Queue()
        self._seq = itertools.count(1)
        self._tick_handle: asyncio.TimerHandle | None = None
        self._tick_at: float | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._closing = False
        self._processed = 0  # events fully handled; tests wait on it instead of sleeping
        self._idle = asyncio.Event()
        # Config reload: the handover this router took over from (its predecessor still winding down),
        # and the one that retired it. See llmswap.router.handover.
        self.succession = Succession()
        self._rerouting = False  # the scheduler was told to hand every waiter to the successor
        # Requests posted to the run loop that the scheduler has not seen yet, per model: `load_of` counts
        # them, so two choices made in one loop step do not both see room for one.
        self._unhandled: dict[str, int] = {}
        # Every model's output also goes to one combined ring: /logs/stream/upstream tails it.
        self.upstream_log = LogRing("upstream")
        # The rates `kvCache.save: auto` decides from, shared by every process (and a reload's successor).
        self.kv_rates = KvRates()
        make = process_factory or self._make_process
        given = dict(processes or {})
        self.processes: dict[str, ProcessLike] = {
            mid: given[mid] if mid in given else make(mc, self.on_process_event)
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
            self._events.put_nowait(Shutdown())
            await self._run_task
        swap_tasks = [s.task for s in self._swaps.values() if s.task is not None]
        for task in swap_tasks:
            task.cancel()
        await asyncio.gather(*swap_tasks, return_exceptions=True)
        await self.stop_prefetches()
        grace = timeout if timeout is not None else 5.0
        # A retired router no longer owns the processes its successor adopted: the successor stops them.
        handed = self.succession.handed_away
        await asyncio.gather(
            *(p.shutdown(grace) for mid, p in self.processes.items() if mid not in handed),
            return_exceptions=True,
        )
        await asyncio.gather(*self._stop_tasks, return_exceptions=True)
        if self.succession.incoming is not None:
            await self.succession.incoming.shut_down_predecessors(timeout)

    @property
    def closing(self) -> bool:
        return self._closing

    def add_observer(self, observer: Observer) -> None:
        """Receive every `RouterEvent` (swaps and process events; on the loop thread; must not block)."""
        self._observers.append(observer)

    @property
    def observers(self) -> tuple[Observer, ...]:
        return tuple(self._observers)

    # ----------------------------------------------------------------- config reload (see handover.py)

    @property
    def handover_in(self) -> IncomingHandover | None:
        """The handover this router took over from, while its predecessor still winds down."""
        return self.succession.incoming

    @property
    def retired(self) -> bool:
        """Whether a config reload handed this router's work to a successor."""
        return self.succession.retired

    def retire(self) -> None:
        """Called once `succession.outgoing` is set: waiters and new requests go to the successor now.

        Synchronous, so no request can slip between the two routers. Requests already granted here
        finish here; the handover tracks them and the swaps still running until this router is idle.
        The scheduler hands every waiter over before it handles anything else (see _run); the tick
        only wakes the loop up for that.
        """
        self._post(Tick())

    def serving(self, model: str) -> int:
        """Granted requests of `model` whose responses have not ended yet (the scheduler's count)."""
        return self.scheduler.snapshot().in_flight.get(model, 0)

    @property
    def busy(self) -> bool:
        """Whether a swap is under way or a granted response has not ended."""
        return bool(self._swaps) or any(self.scheduler.snapshot().in_flight.values())

    def poke(self) -> None:
        """Have the scheduler re-read its queue: the world changed without an event of its own."""
        self._post(Tick())

    def finish_loop(self) -> None:
        """End the run loop of a retired router that has nothing left to do."""
        self._post(Shutdown())

    # ----------------------------------------------------------------- public request API
    async def unload(self, models: Iterable[str] | None = None, timeout: float | None = None) -> None:
        """Stop these models (all when None), failing their waiters; returns once the processes are dead."""
        if self.succession.outgoing is not None:
            await self.succession.outgoing.successor.unload(models, timeout)
            return
        targets = tuple(models) if models is not None else tuple(self.processes)
        if self._closing or self._run_task is None:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._events.put_nowait(UnloadRequest(Unload(targets, timeout), done))
        await done

    def snapshot(self) -> QueueSnapshot:
        return self.scheduler.snapshot()

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

    def _end(self, done: ServeDone) -> None:
        """A granted request ended. With no event ahead of it in the queue, its ServeDone is handled here and
        now, exactly as the run loop would handle it next (the order is the same, and handling never awaits);
        otherwise, or once this router is retired or closing, it is posted behind the others."""
        run = self._run_task
        if self._events.empty() and not self._closing and self.succession.outgoing is None and \
                run is not None and not run.done():
            # `_handle`'s ServeDone, minus what cannot apply: not retired, so no successor to tell.
            try:
                self.scheduler.on_serve_done(done)
            except Exception:
                log.exception("router %s: error handling ServeDone", self.name)
            self._processed += 1
            self._arm_tick()
        else:
            self._post(done)

    async def _run(self) -> None:
        while True:
            if self._events.empty():
                self._idle.set()
            event = await self._events.get()
            self._idle.clear()
            if self._handle(event):
                return

    def _handle(self, event: object) -> bool:
        """Hand one event to the scheduler (on the run loop, or a ServeDone with nothing ahead: `_end`);
        True once the loop must end (Shutdown)."""
        sched = self.scheduler
        if self.succession.retired and not self._rerouting:
            self._rerouting = True
            # Before anything else: a retired scheduler must not start another swap, and every
            # waiter goes on to wait on the successor (acquire catches Rerouted).
            try:
                sched.on_shutdown(Rerouted(f"{self.name} was replaced by a config reload"))
            except Exception:
                log.exception("router %s: error handing its waiters over", self.name)
        try:
            match event:
                case NewRequest(req):
                    self._handled(req)
                    sched.on_request(req)
                case CancelRequest(req):
                    sched.on_cancel(req)
                case SwapDone():
                    self._finish_swap(event)
                    sched.on_swap_done(event)
                case ServeDone():
                    sched.on_serve_done(event)
                    # A successor may wait for this model to be free of this router's requests.
                    self.succession.progress()
                case UnloadRequest(unload, done):
                    self._unload_done = done
                    try:
                        sched.on_unload(unload)
                    finally:
                        if self._unload_done is not None:  # the scheduler stopped nothing
                            resolve(self._unload_done)
                            self._unload_done = None
                case StopDone():
                    sched.on_stop_done(event)
                case ProcessStopped():
                    sched.on_process_stopped(event)
                case Tick():
                    self._tick_at = None
                    sched.on_tick()
                case Shutdown():
                    sched.on_shutdown(ShuttingDown(f"{self.name} is shutting down"))
                    self._idle.set()
                    return True
                case _:
                    log.error("router %s: unknown event %r", self.name, event)
        except Exception:
            # A scheduler bug must not kill the loop: every other waiter would hang forever.
            log.exception("router %s: error handling %s", self.name, type(event).__name__)
        self._processed += 1
        self._arm_tick()
        return False

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
            self._tick_handle = asyncio.get_running_loop().call_later(delay, self._post, Tick())

    # ----------------------------------------------------------------- process notifications

    def _make_process(self, config: ModelConfig, on_event: ProcessEventSink) -> ProcessLike:
        return Process(config, on_event=on_event, mirror=self.upstream_log, kv_rates=self.kv_rates)

    def on_process_event(self, event: ProcessEvent) -> None:
        """What one of this router's processes reports (its `on_event`)."""
        outgoing = self.succession.outgoing
        if outgoing is not None and event.model in outgoing.adopted:
            outgoing.successor.on_process_event(event)  # the process is the successor's now
            return
        # Stops the scheduler asked for come back as SwapDone/StopDone; only the others need telling.
        if event.stopped_by_itself:
            unexpected = event.kind == "exited"
            self._post(ProcessStopped(event.model, unexpected=unexpected, exit_code=event.exit_code))
        self._notify(event)

    def _notify(self, item: RouterEvent) -> None:
        for observer in self._observers:
            try:
                observer(item)
            except Exception:
                log.exception("router observer failed")

