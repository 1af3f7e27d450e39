"""The FIFO scheduler: llama-swap's decision tree for each request, and its priority queue.

For every request, in order: unknown model → error; over the model's concurrency limit → 429;
admitted; a swap already loading the model → join it; ready with nothing to evict → serve; would
collide with a swap in progress, or stop a model still serving → wait in the queue; otherwise
start a swap. Swaps whose targets and evict sets do not touch each other run in parallel. The
queue is re-read, once and in order, whenever something that blocked it may have changed.

Where our asyncio contracts differ from llama-swap's Go (on purpose):
- Stopping for an unload is asynchronous (`StopDone` follows): until it arrives, the unloaded
  models are "stopping", and a request for one of them, or one that would evict one, waits.
- A swap nobody waits for any more is aborted when a queued request needs it out of the way
  (llama-swap keeps loading it, #727). Its `SwapDone` then only cleans up.
- A swap dropped by an unload, like an aborted one, stays on the books until its `SwapDone`:
  nobody may join it, it still collides, and its model is not started again before then, so one
  model never has two swaps in flight.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmswap.config.model import DEFAULT_CONCURRENCY_LIMIT, EMPTY
from llmswap.process.state import ProcessState
from llmswap.scheduler.errors import ConcurrencyLimit, ModelNotFound, ModelUnloaded, SchedulerError
from llmswap.scheduler.types import (
    Clock,
    Effects,
    HandlerRequest,
    ProcessStopped,
    SchedulerSnapshot,
    ServeDone,
    StopDone,
    SwapDone,
    Swapper,
    SwapPlan,
    Unload,
)

RULE_REQUEST = "fifo.request"  # a swap started by the request that just arrived
RULE_DRAIN = "fifo.drain"  # a swap started by a queued request once it was unblocked


@dataclass
class _ActiveSwap:
    model: str
    evict: tuple[str, ...]
    waiters: list[HandlerRequest] = field(default_factory=list)
    # Set once nobody may join any more (aborted, or its model unloaded); its SwapDone only cleans up.
    detached: Literal["aborted", "unloaded"] | None = None

    def collides(self, target: str, evict: Sequence[str]) -> bool:
        """Whether a swap to `target` evicting `evict` would interfere with this one."""
        return self.model in evict or target in self.evict or not set(self.evict).isdisjoint(evict)


class FifoScheduler:
    """Implements `Scheduler`. Every method runs on the router's run loop; none blocks or awaits."""

    def __init__(
        self,
        name: str,
        swapper: Swapper,
        effects: Effects,
        *,
        limits: Mapping[str, int] = EMPTY,
        priority: Mapping[str, int] = EMPTY,
        clock: Clock,
        logger: logging.Logger | None = None,
    ) -> None:
        self.name = name
        self._swapper = swapper
        self._effects = effects
        self._limits = limits
        self._priority = priority
        self._clock = clock
        self._log = logger or logging.getLogger(f"llmswap.scheduler.fifo.{name}")

        self._active: dict[str, _ActiveSwap] = {}
        self._queue: list[HandlerRequest] = []  # sorted by _queue_key
        self._positions: dict[HandlerRequest, int] = {}  # last position told to each queued waiter
        self._in_flight: dict[str, int] = {}  # granted and not yet ServeDone
        self._reserved: dict[str, int] = {}  # admitted and not yet finished, errored or cancelled
        self._stopping: dict[str, int] = {}  # unloads whose StopDone has not arrived, per model
        self._shutdown: SchedulerError | None = None

    # ----------------------------------------------------------------------------- events

    def on_request(self, req: HandlerRequest) -> None:
        if self._shutdown is not None:
            self._effects.grant_error(req, self._shutdown)
            return
        if self._effects.model_state(req.model) is None:
            self._log.debug("%s: %s is not handled by this router", self.name, req.model)
            self._effects.grant_error(req, ModelNotFound(req.model))
            return
        limit = self._limit(req.model)
        if self._reserved.get(req.model, 0) >= limit:
            self._log.debug("%s: %s is at its concurrency limit (%d)", self.name, req.model, limit)
            self._effects.grant_error(req, ConcurrencyLimit(
                f"Too many requests: {req.model} already has {limit} requests waiting or running "
                f"(its concurrencyLimit); retry later"
            ))
            return
        self._reserved[req.model] = self._reserved.get(req.model, 0) + 1
        if not self._effects.admit(req):
            self._release(req.model)  # the client left before admission
            return
        if not self._place(req, RULE_REQUEST):
            bisect.insort(self._queue, req, key=self._queue_key)
            self._publish_positions()
            self._abort_unwanted_swaps()

    def on_cancel(self, req: HandlerRequest) -> None:
        if req in self._queue:
            self._queue.remove(req)
            self._release(req.model)
            self._publish_positions()
            return
        swap = self._active.get(req.model)
        if swap is None or req not in swap.waiters:
            return  # already granted, errored or never seen
        swap.waiters.remove(req)
        self._release(req.model)
        self._abort_unwanted_swaps()

    def on_swap_done(self, ev: SwapDone) -> None:
        swap = self._active.pop(ev.model, None)
        if swap is not None and swap.detached is None:
            for waiter in swap.waiters:
                if ev.error is not None:
                    self._fail(waiter, ev.error)
                else:
                    self._grant(waiter, ev.model)
        self._drain()

    def on_serve_done(self, ev: ServeDone) -> None:
        count = self._in_flight.get(ev.model, 0)
        if count <= 0:
            self._log.warning("%s: ServeDone for %s with nothing in flight (ignored)", self.name, ev.model)
            return
        self._release(ev.model)
        if count > 1:
            self._in_flight[ev.model] = count - 1
            return
        del self._in_flight[ev.model]
        self._drain()

    def on_unload(self, ev: Unload) -> None:
        targets = set(ev.models)
        for model in ev.models:
            swap = self._active.get(model)
            if swap is None:
                continue
            for waiter in swap.waiters:
                self._fail(waiter, ModelUnloaded(f"{self.name}: model unloaded"))
            swap.waiters.clear()
            swap.detached = "unloaded"
        kept: list[HandlerRequest] = []
        for req in self._queue:
            if req.model in targets:
                self._fail(req, ModelUnloaded(f"{self.name}: model unloaded"))
            else:
                kept.append(req)
        self._queue = kept
        for model in targets:
            self._stopping[model] = self._stopping.get(model, 0) + 1
        # In-flight counts stay: the killed requests' handlers still post their ServeDone.
        self._effects.stop_processes(tuple(ev.models), ev.timeout)
        self._drain()
        self._publish_positions()

    def on_stop_done(self, ev: StopDone) -> None:
        for model in ev.models:
            left = self._stopping.get(model, 0) - 1
            if left > 0:
                self._stopping[model] = left
            else:
                self._stopping.pop(model, None)
        self._drain()

    def on_process_stopped(self, ev: ProcessStopped) -> None:
        self._drain()  # the running set shrank under us: evictions may have become unnecessary

    def on_tick(self) -> None:
        """FIFO keeps no timers."""

    def next_deadline(self) -> float | None:
        return None

    def on_shutdown(self, err: SchedulerError) -> None:
        self._shutdown = err
        for swap in self._active.values():
            for waiter in swap.waiters:
                self._fail(waiter, err)
            swap.waiters.clear()
        queued, self._queue = self._queue, []
        for req in queued:
            self._fail(req, err)
        self._positions.clear()

    def snapshot(self) -> SchedulerSnapshot:
        waiting: dict[str, int] = {}
        for req in self._queue:
            waiting[req.model] = waiting.get(req.model, 0) + 1
        for swap in self._active.values():
            if swap.waiters:
                waiting[swap.model] = waiting.get(swap.model, 0) + len(swap.waiters)
        loading = tuple(sorted(m for m, s in self._active.items() if s.detached != "unloaded"))
        return SchedulerSnapshot(waiting=waiting, in_flight=dict(self._in_flight), loading=loading)

    # ----------------------------------------------------------------------------- decisions

    def _place(self, req: HandlerRequest, rule: str) -> bool:
        """Serve, join, start a swap for, or fail `req`. False: it must wait in the queue."""
        state = self._effects.model_state(req.model)
        if state is None:
            self._fail(req, ModelNotFound(req.model))
            return True
        swap = self._active.get(req.model)
        if swap is not None:
            if swap.detached is not None:
                return False  # its abandoned swap is still winding down
            swap.waiters.append(req)
            self._log.debug("%s: %s joins the swap in progress (%d waiting)", self.name, req.model,
                            len(swap.waiters))
            return True
        if self._stopping.get(req.model):
            return False
        running = self._running_set(exclude=req.model)
        try:
            evict = tuple(self._swapper.evictions_for(req.model, running))
        except SchedulerError as err:
            self._fail(req, err)
            return True
        collides = any(s.collides(req.model, evict) for m, s in self._active.items() if m != req.model)
        if state is ProcessState.READY and not evict and not collides:
            self._grant(req, req.model)
            return True
        if collides:
            self._log.debug("%s: %s waits: it collides with a swap in progress", self.name, req.model)
            return False
        if any(self._stopping.get(m) for m in evict):
            self._log.debug("%s: %s waits: it would evict a model being unloaded", self.name, req.model)
            return False
        if any(self._in_flight.get(m, 0) > 0 for m in evict):
            self._log.debug("%s: %s waits: it would evict a model still serving", self.name, req.model)
            return False
        self._start_swap(req, evict, running, rule)
        return True

    def _start_swap(self, req: HandlerRequest, evict: tuple[str, ...], running: list[str], rule: str) -> None:
        # Recorded before launching so that requests arriving meanwhile join it instead of starting another.
        self._active[req.model] = _ActiveSwap(req.model, evict, [req])
        self._swapper.on_swap_start(req.model, running)
        waited = self._clock() - req.arrived
        detail = f"running [{', '.join(running)}]; request waited {waited:.1f}s; {len(self._queue)} queued"
        self._log.info("swap: start %s evict [%s] rule=%s", req.model, ", ".join(evict), rule)
        self._effects.start_swap(SwapPlan(req.model, evict, rule, request_seq=req.seq, detail=detail))

    def _drain(self) -> None:
        """One pass over the queue, in order; swaps started here are seen by the requests after."""
        if not self._queue:
            return
        remaining = [req for req in self._queue if not self._place(req, RULE_DRAIN)]
        self._queue = remaining
        self._publish_positions()
        self._abort_unwanted_swaps()

    def _abort_unwanted_swaps(self) -> None:
        """Abort loads that nobody waits for any more once they stand in a queued request's way."""
        for swap in self._active.values():
            if swap.waiters or swap.detached is not None or not self._blocks_queue(swap):
                continue
            swap.detached = "aborted"
            self._log.info("swap: abort %s: nobody waits for it and a queued request needs it gone",
                           swap.model)
            self._effects.abort_swap(swap.model)

    def _blocks_queue(self, swap: _ActiveSwap) -> bool:
        """Whether some queued request waits because of this swap (it collides with it)."""
        for req in self._queue:
            running = self._running_set(exclude=req.model)
            try:
                evict = self._swapper.evictions_for(req.model, running)
            except SchedulerError:
                continue
            if swap.collides(req.model, evict):
                return True
        return False

    def _running_set(self, exclude: str) -> list[str]:
        running = set(self._effects.running_models())
        running.update(m for m in self._active if m != exclude)
        return sorted(running)

    # ----------------------------------------------------------------------------- bookkeeping

    def _limit(self, model: str) -> int:
        limit = self._limits.get(model, DEFAULT_CONCURRENCY_LIMIT)
        return limit if limit > 0 else DEFAULT_CONCURRENCY_LIMIT

    def _queue_key(self, req: HandlerRequest) -> tuple[int, int, int]:
        return (-self._priority.get(req.model, 0), -req.priority, req.seq)

    def _grant(self, req: HandlerRequest, model: str) -> None:
        if self._effects.grant_serve(req, model):
            self._in_flight[model] = self._in_flight.get(model, 0) + 1
        else:
            self._release(model)  # the client left: no ServeDone will ever come for it

    def _fail(self, req: HandlerRequest, err: SchedulerError) -> None:
        self._release(req.model)
        self._effects.grant_error(req, err)

    def _release(self, model: str) -> None:
        count = self._reserved.get(model, 0)
        if count <= 0:
            raise RuntimeError(f"{self.name}: reservation underflow for {model} (scheduler bookkeeping bug)")
        if count == 1:
            del self._reserved[model]
        else:
            self._reserved[model] = count - 1

    def _publish_positions(self) -> None:
        previous = self._positions
        self._positions = {}
        for position, req in enumerate(self._queue, start=1):
            self._positions[req] = position
            if previous.get(req) != position:
                self._effects.notify_position(req, position)
