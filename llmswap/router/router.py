"""The router: one object, composed of what it does for requests, what it does to processes, and its run loop.

- `RunLoop` (`llmswap.router.loop`): the queue of events the scheduler is handed one at a time, and its tick.
- `RequestDesk` (`llmswap.router.requests`): `acquire`/`grant` (at once when the model is ready and free,
  else through the queue), a request's end, `load_of`.
- `SwapWork` (`llmswap.router.effects`): the scheduler's `Effects`: the swaps and unloads it decides, run as
  tasks whose completion comes back through the queue as an event.
- `RouterPolicy` (`llmswap.router.policy`): the swapper, and what a policy adds to a swap (the vram
  router's memory waits and footprints).

The router builds the four, hands each event to the part it concerns (`_handle`), and answers for the
whole (lifecycle, observers, a config reload's succession). Every scheduler call happens on the event loop,
one event at a time and in the queue's order, so scheduler state needs no locks. A request waits on two
futures of its `Waiter`: `admitted` (passed admission: a loading stream may start) and `granted`.

A config reload retires a router in favour of a successor that adopted some of its processes
(`llmswap.router.handover`): the retired router sends its waiters and new requests to the successor,
finishes the requests it already granted, and tells the successor what it still does to adopted processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llmswap.config.model import Config, ModelConfig
from llmswap.kvcache.keeper import KvShared
from llmswap.process import LogRing, Process
from llmswap.process.events import ProcessEvent
from llmswap.process.state import ProcessState
from llmswap.router.effects import SwapWork
from llmswap.router.loop import RunLoop
from llmswap.router.policy import RouterParts, RouterPolicy
from llmswap.router.requests import RequestDesk
from llmswap.router.schedulers import scheduler_factory
from llmswap.router.succession import IncomingHandover, Succession
from llmswap.router.types import (
    NO_OPTIONS,
    AcquireOptions,
    CancelRequest,
    Grant,
    LoadProgress,
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
    ModelLoad,
    ProcessStopped,
    QueueSnapshot,
    Scheduler,
    ServeDone,
    StopDone,
    SwapDone,
    Unload,
)

log = logging.getLogger("llmswap.router")


class Router:
    """One router (see the module docstring); `policy` names it and decides its evictions."""

    def __init__(
        self,
        config: Config,
        policy: RouterPolicy,
        *,
        process_factory: ProcessFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = policy.name
        self.config = config
        self.policy = policy
        self.clock = clock
        self.stats = RouterStats()
        self._observers: list[Observer] = []
        self._closing = False
        # Config reload: the handover this router took over from (its predecessor still winding down),
        # and the one that retired it. See llmswap.router.handover.
        self.succession = Succession()
        self._rerouting = False  # the scheduler was told to hand every waiter to the successor
        # Every model's output also goes to one combined ring: /logs/stream/upstream tails it.
        self.upstream_log = LogRing("upstream")
        # What every process's KV keeper shares (and a reload's successor): `kvCache.save: auto`'s rates,
        # the saves being restored.
        self.kv = KvShared()
        make = process_factory or self._make_process
        self.processes: dict[str, ProcessLike] = {
            mid: make(mc, self.on_process_event) for mid, mc in config.models.items()
        }
        self.loop = RunLoop(self.name, self._handle, self._next_deadline, clock)
        self.work = SwapWork(self.name, config, self.processes, policy, self.succession, self.stats, clock,
                             self.loop.post, self._notify, lambda: self._closing)
        self.scheduler: Scheduler = scheduler_factory(config, self.name, policy.swapper, clock)(self.work)
        self.work.scheduler = self.scheduler
        self.desk = RequestDesk(self.name, self.loop, self.scheduler, self.processes, self.succession, clock,
                                self.work.model_state, lambda: self._closing)
        policy.bind(RouterParts(self.processes, self.stats, clock, self._busy))

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the run loop on the running event loop."""
        if not self.loop.started:
            self.loop.start()
            self.policy.begin()

    async def shutdown(self, timeout: float | None = None) -> None:
        """Fail every waiter, stop every process concurrently, end the run loop."""
        if self._closing:
            raise RuntimeError(f"{self.name}: shutdown already in progress")
        self._closing = True
        try:
            await self.loop.stop()
            await self.work.wind_down()
        finally:
            await self.policy.end()  # before the processes stop: the vram policy samples no dying one
        grace = timeout if timeout is not None else 5.0
        # A retired router no longer owns the processes its successor adopted: the successor stops them.
        handed = self.succession.handed_away
        await asyncio.gather(
            *(p.shutdown(grace) for mid, p in self.processes.items() if mid not in handed),
            return_exceptions=True,
        )
        await self.work.stopped()
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

    # ----------------------------------------------------------------- requests (the desk)

    def acquire(self, model: str, options: AcquireOptions = NO_OPTIONS
                ) -> contextlib.AbstractAsyncContextManager[ProcessLike]:
        """Wait until `model` may serve, yield its process, and report the end of the request."""
        return self.desk.acquire(model, options)

    async def grant(self, model: str, options: AcquireOptions = NO_OPTIONS) -> Grant:
        """Wait until `model` may serve and return its grant (see `RequestDesk.grant`)."""
        return await self.desk.grant(model, options)

    def grant_now(self, model: str, options: AcquireOptions = NO_OPTIONS) -> Grant | None:
        return self.desk.grant_now(model, options)

    def load_of(self, model: str) -> ModelLoad | None:
        """What a request for `model` arriving now would meet; None when this router lacks the model."""
        if self.succession.outgoing is not None:
            return self.succession.outgoing.successor.load_of(model)
        return self.desk.load_of(model)

    # ----------------------------------------------------------------- what it does to processes (the work)

    def model_state(self, model: str) -> ProcessState | None:
        return self.work.model_state(model)

    def running_models(self) -> Mapping[str, ProcessState]:
        return self.work.running_models()

    def inherited_in_flight(self, model: str) -> int:
        return self.work.inherited_in_flight(model)

    def swap_claims(self) -> dict[str, ProcessState]:
        return self.work.swap_claims()

    def load_progress(self, model: str) -> LoadProgress | None:
        return self.work.load_progress(model)

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
        self.loop.post(Tick())

    def serving(self, model: str) -> int:
        """Granted requests of `model` whose responses have not ended yet (the scheduler's count)."""
        return self.scheduler.snapshot().in_flight.get(model, 0)

    @property
    def busy(self) -> bool:
        """Whether a swap is under way or a granted response has not ended."""
        return bool(self.work.swapping) or any(self.scheduler.snapshot().in_flight.values())

    def poke(self) -> None:
        """Have the scheduler re-read its queue: the world changed without an event of its own."""
        self.loop.post(Tick())

    def finish_loop(self) -> None:
        """End the run loop of a retired router that has nothing left to do."""
        self.loop.post(Shutdown())

    # ----------------------------------------------------------------- unloads and reports

    async def unload(self, models: Iterable[str] | None = None, timeout: float | None = None) -> None:
        """Stop these models (all when None), failing their waiters; returns once the processes are dead."""
        if self.succession.outgoing is not None:
            await self.succession.outgoing.successor.unload(models, timeout)
            return
        targets = tuple(models) if models is not None else tuple(self.processes)
        if self._closing or not self.loop.started:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.loop.put(UnloadRequest(Unload(targets, timeout), done))
        await done

    def snapshot(self) -> QueueSnapshot:
        return self.scheduler.snapshot()

    def model_extras(self, model: str) -> dict[str, Any]:
        """Router-specific facts about a model for /running and /v1/models (vram: its footprint)."""
        return self.policy.model_extras(model)

    def router_extras(self) -> dict[str, Any]:
        """Router-specific facts for /running (the vram router adds its budget in use)."""
        return self.policy.router_extras()

    # ----------------------------------------------------------------- run loop

    @property
    def _processed(self) -> int:
        return self.loop.processed

    async def wait_idle(self) -> None:
        """Wait until every posted event has been handled (tests use this instead of sleeping)."""
        await self.loop.wait_idle()

    def _next_deadline(self) -> float | None:
        return self.scheduler.next_deadline()

    def _busy(self, model: str) -> bool:
        """A request of `model` in flight here or at a reload's predecessor, or a swap to it under way."""
        handover = self.succession.incoming
        return self.serving(model) > 0 or model in self.work.swapping or \
            (handover is not None and handover.serving(model) > 0)

    def _handle(self, event: object) -> bool:
        """Hand one event to the part it concerns (on the run loop); True once the loop must end."""
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
                    self.desk.handled(req)
                    sched.on_request(req)
                case CancelRequest(req):
                    sched.on_cancel(req)
                case SwapDone():
                    self.work.finish_swap(event)
                    sched.on_swap_done(event)
                case ServeDone():
                    sched.on_serve_done(event)
                    # A successor may wait for this model to be free of this router's requests.
                    self.succession.progress()
                case UnloadRequest(unload, done):
                    with self.work.unloading(done):
                        sched.on_unload(unload)
                case StopDone():
                    sched.on_stop_done(event)
                case ProcessStopped():
                    sched.on_process_stopped(event)
                case Tick():
                    self.loop.tick_now()
                    sched.on_tick()
                case Shutdown():
                    sched.on_shutdown(ShuttingDown(f"{self.name} is shutting down"))
                    return True
                case _:
                    log.error("router %s: unknown event %r", self.name, event)
        except Exception:
            # A scheduler bug must not kill the loop: every other waiter would hang forever.
            log.exception("router %s: error handling %s", self.name, type(event).__name__)
        return False

    # ----------------------------------------------------------------- process notifications

    def _make_process(self, config: ModelConfig, on_event: ProcessEventSink) -> ProcessLike:
        return Process(config, on_event=on_event, mirror=self.upstream_log, kv=self.kv)

    def on_process_event(self, event: ProcessEvent) -> None:
        """What one of this router's processes reports (its `on_event`)."""
        outgoing = self.succession.outgoing
        if outgoing is not None and event.model in outgoing.adopted:
            outgoing.successor.on_process_event(event)  # the process is the successor's now
            return
        self.policy.process_event(event)
        self.scheduler.world_changed()  # its state changed: the express lane must look again
        # Stops the scheduler asked for come back as SwapDone/StopDone; only the others need telling.
        if event.stopped_by_itself:
            unexpected = event.kind == "exited"
            self.loop.post(ProcessStopped(event.model, unexpected=unexpected, exit_code=event.exit_code))
        self._notify(event)

    def _notify(self, item: RouterEvent) -> None:
        for observer in self._observers:
            try:
                observer(item)
            except Exception:
                log.exception("router observer failed")

