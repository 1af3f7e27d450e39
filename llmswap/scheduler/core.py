"""The machinery every queueing scheduler shares; FIFO and batch differ only in how they place requests.

`QueueScheduler` keeps the books — swaps in progress and their waiters, the queue, in-flight and
reserved counts, unloads in progress — and owns everything that is not a placement decision:
limits and admission, cancellation, swap and serve completion, unloads, stops, shutdown, aborting
loads nobody waits for, queue timeouts, positions, estimates and the rejection counters.

A subclass decides where a request goes (`_accept` for a newcomer, `_drain` whenever something
that blocked the queue may have changed), may hold a ready model back (`_holds`), and may keep
timers of its own (`_policy_deadline`, re-examined in `_drain` on every tick).

Invariants the books keep:
- `_reserved[model]` counts admitted requests not yet finished, errored or cancelled (queued,
  joined to a swap, or in flight); `_key_reserved` the same per API key.
- A request is in flight (`_granted`) only when `grant_serve` returned True; its `ServeDone`
  ends it. A swap whose waiters all left, or whose model was unloaded, stays "detached" on the
  books until its `SwapDone`, so one model never has two swaps in flight.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmswap.config.model import DEFAULT_CONCURRENCY_LIMIT, EMPTY, AdmissionConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.admission import (
    REASON_CONCURRENCY,
    REASON_GLOBAL_QUEUE,
    REASON_KEY,
    REASON_MODEL_QUEUE,
    REASON_SHED,
    REASON_TIMEOUT,
    Admission,
    SchedulerStats,
)
from llmswap.scheduler.errors import (
    ConcurrencyLimit,
    ModelNotFound,
    ModelUnloaded,
    QueueFull,
    QueueTimeout,
    SchedulerError,
    Shed,
)
from llmswap.scheduler.estimates import ServiceTimes, retry_after
from llmswap.scheduler.prioritizers import Prioritizer, next_late
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
from llmswap.scheduler.urgency import UrgencyMixin


@dataclass(frozen=True)
class Candidate:
    """A request past the checks every placement starts with: what the scheduler decides on."""

    state: ProcessState
    running: list[str]  # the running set the swapper saw
    evict: tuple[str, ...]


@dataclass
class ActiveSwap:
    model: str
    evict: tuple[str, ...]
    started: float
    waiters: list[HandlerRequest] = field(default_factory=list)
    # Set once nobody may join any more (aborted, or its model unloaded); its SwapDone only cleans up.
    detached: Literal["aborted", "unloaded"] | None = None

    def collides(self, target: str, evict: Sequence[str]) -> bool:
        """Whether a swap to `target` evicting `evict` would interfere with this one."""
        return self.model in evict or target in self.evict or not set(self.evict).isdisjoint(evict)


class QueueScheduler(UrgencyMixin, ABC):
    """Implements `Scheduler` except for placement. Every method runs on the router's run loop."""

    kind = "queue"  # names the default logger: llmswap.scheduler.<kind>.<router name>

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
        admission: AdmissionConfig | None = None,
        key_limits: Mapping[str, int] = EMPTY,
        times: ServiceTimes | None = None,
        prioritizer: Prioritizer | None = None,
        on_deadline: str = "ignore",
        preempt_below: int | None = None,
    ) -> None:
        self.name = name
        self._swapper = swapper
        self._effects = effects
        self._limits = limits
        self._priority = priority
        self._clock = clock
        self._log = logger or logging.getLogger(f"llmswap.scheduler.{self.kind}.{name}")
        self._admission = Admission(admission, key_limits)
        self.times = times or ServiceTimes()
        self.stats = SchedulerStats()
        self._init_urgency(prioritizer, on_deadline, preempt_below)  # issue 16: llmswap.scheduler.urgency

        self._active: dict[str, ActiveSwap] = {}
        self._queue: list[HandlerRequest] = []  # sorted by _queue_key
        self._positions: dict[HandlerRequest, int] = {}  # last position told to each queued waiter
        self._in_flight: dict[str, int] = {}  # granted and not yet ServeDone, per model
        self._granted: dict[HandlerRequest, float] = {}  # in flight: when each was granted
        # Models in flight: when each became busy or last completed a request (the start of its next gap).
        self._busy_mark: dict[str, float] = {}
        self._reserved: dict[str, int] = {}  # admitted and not yet finished, errored or cancelled
        self._key_reserved: dict[str, int] = {}  # the same, per API key that has a maxConcurrent
        self._stopping: dict[str, int] = {}  # unloads whose StopDone has not arrived, per model
        self._shutdown: SchedulerError | None = None

    # ----------------------------------------------------------------------------- policy hooks

    @abstractmethod
    def _accept(self, req: HandlerRequest) -> None:
        """Place a newly admitted request: serve it, join it to a swap, start one, or queue it."""

    @abstractmethod
    def _drain(self) -> None:
        """Re-read the queue: something that blocked it may have changed."""

    def _holds(self, model: str) -> bool:
        """Whether a ready `model` must not take new requests right now (it is making room)."""
        return False

    def _policy_deadline(self) -> float | None:
        """When the placement policy wants `_drain` to run again, or None."""
        return None

    def _arrived(self, req: HandlerRequest) -> None:
        """A request for a known model arrived (before any limit is checked)."""
        return None  # optional hook: only the batch scheduler learns from it

    def _loaded(self, model: str, duration: float) -> None:
        """A swap to `model` succeeded."""
        return None  # optional hook: only the batch scheduler learns from it

    def _finished(self, model: str) -> None:
        """A granted request of `model` finished."""
        return None  # optional hook: only the batch scheduler learns from it

    # ----------------------------------------------------------------------------- events

    def on_request(self, req: HandlerRequest) -> None:
        if self._shutdown is not None:
            self._effects.grant_error(req, self._shutdown)
            return
        if self._effects.model_state(req.model) is None:
            self._log.debug("%s: %s is not handled by this router", self.name, req.model)
            self._effects.grant_error(req, ModelNotFound(req.model))
            return
        self._arrived(req)
        limit = self._limit(req.model)
        if self._reserved.get(req.model, 0) + self._effects.inherited_in_flight(req.model) >= limit:
            self._log.debug("%s: %s is at its concurrency limit (%d)", self.name, req.model, limit)
            self._reject(req, REASON_CONCURRENCY, ConcurrencyLimit(
                f"Too many requests: {req.model} already has {limit} requests waiting or running "
                f"(its concurrencyLimit); retry later",
                retry_after=retry_after(self._model_slot_wait(req.model)),
            ))
            return
        key_limit = self._admission.key_limit(req.api_key)
        if key_limit is not None and req.api_key is not None and \
                self._key_reserved.get(req.api_key, 0) >= key_limit:
            self._log.debug("%s: an API key is at its maxConcurrent (%d)", self.name, key_limit)
            self._reject(req, REASON_KEY, ConcurrencyLimit(
                f"Too many requests for this API key: it already has {key_limit} requests waiting "
                f"or running (its maxConcurrent in apiKeys); retry later",
                retry_after=retry_after(self._key_slot_wait(req.api_key)),
            ))
            return
        victim: HandlerRequest | None = None
        if self._would_wait(req.model):
            verdict = self._admission.verdict(req, list(self._waiters()), self._rank)
            if not verdict.admit:
                self._reject(req, *self._queue_full(req, verdict.scope, verdict.bound, verdict.waiting))
                return
            victim = verdict.victim
        self._reserve(req)
        if not self._effects.admit(req):
            self._release(req)  # the client left before admission
            return
        if victim is not None:
            self._shed(victim, req)
        if self._late_rejected([req]):
            return
        self._accept(req)

    def on_cancel(self, req: HandlerRequest) -> None:
        if self._remove_waiter(req):
            self._release(req)
            self._after_removal()

    def on_swap_done(self, ev: SwapDone) -> None:
        swap = self._active.pop(ev.model, None)
        if ev.error is None:
            self.times.observe_load(ev.model, ev.duration)
            self._loaded(ev.model, ev.duration)
        if swap is not None and swap.detached is None:
            for waiter in swap.waiters:
                if ev.error is not None:
                    self._fail(waiter, ev.error)
                else:
                    self._grant(waiter, ev.model)
        self._drain()

    def on_serve_done(self, ev: ServeDone) -> None:
        granted_at = self._granted.pop(ev.request, None)
        if granted_at is None:
            self._log.warning("%s: ServeDone for %s with nothing in flight for that request (ignored)",
                              self.name, ev.model)
            return
        now = self._clock()
        self.times.observe_service(ev.model, now - granted_at)
        mark = self._busy_mark.get(ev.model)
        if mark is not None:
            self.times.observe_gap(ev.model, now - mark)
        self._busy_mark[ev.model] = now
        self._release(ev.request)
        self._finished(ev.model)
        count = self._in_flight.get(ev.model, 0)
        if count > 1:
            self._in_flight[ev.model] = count - 1
            return  # still serving: nothing it blocked can move yet
        self._in_flight.pop(ev.model, None)
        self._busy_mark.pop(ev.model, None)  # idle time is no part of any gap
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
        """Time passed: answer waiters whose queueTimeout ran out, then let the policy re-decide."""
        if self._shutdown is not None:
            return
        now = self._clock()
        expired = self._admission.expired(self._waiters(), now)
        for req in expired:
            self._remove_waiter(req)
            waited = now - req.arrived
            self.stats.count(REASON_TIMEOUT)
            self._log.info("%s: a request for %s timed out after %.1fs in the queue", self.name, req.model,
                           waited)
            self._fail(req, QueueTimeout(
                f"Waited {waited:.0f}s for {req.model} without being served "
                f"(routing.scheduler.admission.queueTimeout is {self._admission.config.queue_timeout:g}s); "
                f"retry later or raise queueTimeout",
                retry_after=retry_after(self._expected_wait(req.model, self._model_waiters(req.model))),
            ))
        if expired:
            self._after_removal()
        if self._late_rejected(list(self._waiters())):
            self._after_removal()
        self._drain()

    def next_deadline(self) -> float | None:
        late = next_late([r for r in self._waiters() if not self._deadlines.counted(r)], self._remaining)
        times = [t for t in (self._admission.next_timeout(self._waiters()), self._policy_deadline(), late)
                 if t is not None]
        return min(times) if times else None

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
        for req in self._waiters():
            waiting[req.model] = waiting.get(req.model, 0) + 1
        loading = tuple(sorted(m for m, s in self._active.items() if s.detached != "unloaded"))
        return SchedulerSnapshot(waiting=waiting, in_flight=dict(self._in_flight), loading=loading)

    def accepts(self, model: str, ahead: int = 0) -> bool:
        """Whether a request for `model` arriving now, after `ahead` others for it already on their way,
        would be taken rather than refused: within the model's concurrencyLimit (queued and running both
        count) and, if it would wait, within the queue bounds. Read-only; selectors ask it."""
        if self._shutdown is not None or self._effects.model_state(model) is None:
            return False
        taken = self._reserved.get(model, 0) + self._effects.inherited_in_flight(model) + ahead
        if taken >= self._limit(model):
            return False
        return not self._would_wait(model) or self._admission.room_for(model, list(self._waiters()), ahead)

    # ----------------------------------------------------------------------------- shared decisions

    def _start_swap(self, req: HandlerRequest, evict: tuple[str, ...], running: Sequence[str], rule: str,
                    detail: str) -> None:
        # Recorded before launching so that requests arriving meanwhile join it instead of starting another.
        self._active[req.model] = ActiveSwap(req.model, evict, self._clock(), [req])
        self._preemption.evicted(evict)
        self._swapper.on_swap_start(req.model, running)
        self._log.info("swap: start %s evict [%s] rule=%s (%s)", req.model, ", ".join(evict), rule, detail)
        self._effects.start_swap(SwapPlan(req.model, evict, rule, request_seq=req.seq, detail=detail))

    def _prepare(self, req: HandlerRequest) -> bool | Candidate:
        """The checks every placement starts with, the same for every scheduler.

        True: handled (failed, or joined the swap in progress); False: it must wait (its abandoned swap is
        still winding down, or its model is being unloaded); otherwise the state and evictions to decide on.
        """
        state = self._effects.model_state(req.model)
        if state is None:
            self._fail(req, ModelNotFound(req.model))
            return True
        swap = self._active.get(req.model)
        if swap is not None:
            if swap.detached is not None:
                return False  # its abandoned swap is still winding down
            self._join(req, swap)
            return True
        if self._stopping.get(req.model):
            return False
        running = self._running_set(exclude=req.model)
        try:
            evict = tuple(self._swapper.evictions_for(req.model, running))
        except SchedulerError as err:
            self._fail(req, err)
            return True
        return Candidate(state, running, evict)

    def _join(self, req: HandlerRequest, swap: ActiveSwap) -> None:
        swap.waiters.append(req)
        self._log.debug("%s: %s joins the swap in progress (%d waiting)", self.name, req.model,
                        len(swap.waiters))

    def _abort_unwanted_swaps(self) -> None:
        """Abort loads that nobody waits for any more once they stand in a queued request's way."""
        for swap in self._active.values():
            if swap.waiters or swap.detached is not None or not self._blocks_queue(swap):
                continue
            swap.detached = "aborted"
            self._log.info("swap: abort %s: nobody waits for it and a queued request needs it gone",
                           swap.model)
            self._effects.abort_swap(swap.model)

    def _blocks_queue(self, swap: ActiveSwap) -> bool:
        """Whether some queued request waits because of this swap (it collides with it)."""
        for req in self._queue:
            evict = self._evictions(req.model)
            if evict is not None and swap.collides(req.model, evict):
                return True
        return False

    def _evictions(self, model: str) -> list[str] | None:
        """What a swap to `model` would evict right now; None when the swapper says it can never run."""
        try:
            return self._swapper.evictions_for(model, self._running_set(exclude=model))
        except SchedulerError:
            return None

    def _running_set(self, exclude: str) -> list[str]:
        running = set(self._effects.running_models())
        running.update(m for m in self._active if m != exclude)
        return sorted(running)

    def _collides(self, model: str, evict: Sequence[str]) -> bool:
        return any(s.collides(model, evict) for m, s in self._active.items() if m != model)

    def _would_wait(self, model: str) -> bool:
        """Whether a request for `model` arriving now would wait (queued or joined to a swap)."""
        if self._effects.model_state(model) is not ProcessState.READY:
            return True
        if model in self._active or self._stopping.get(model) or self._holds(model):
            return True
        evict = self._evictions(model)
        if evict is None:
            return False  # it is answered with CannotFit at once
        return bool(evict) or self._collides(model, evict)

    # ----------------------------------------------------------------------------- admission

    def _waiters(self) -> Iterator[HandlerRequest]:
        """Every waiting request: queued, or joined to a swap in progress."""
        yield from self._queue
        for swap in self._active.values():
            yield from swap.waiters

    def _model_waiters(self, model: str) -> list[HandlerRequest]:
        waiters = [r for r in self._queue if r.model == model]
        swap = self._active.get(model)
        if swap is not None:
            waiters.extend(swap.waiters)
        return waiters

    def _rank(self, req: HandlerRequest) -> tuple[int, int]:
        return (self._priority.get(req.model, 0), req.priority)

    def _queue_full(self, req: HandlerRequest, scope: str | None, bound: int,
                    waiting: int) -> tuple[str, SchedulerError]:
        if scope == "model":
            wait = self._expected_wait(req.model, self._model_waiters(req.model))
            message = (f"Too many requests waiting for {req.model}: {waiting} already queued "
                       f"(routing.scheduler.admission.maxQueuePerModel is {bound}); retry later")
            return REASON_MODEL_QUEUE, QueueFull(message, status=429, retry_after=retry_after(wait))
        wait = self._expected_wait(req.model, list(self._waiters()))
        message = (f"The server is busy: {waiting} requests are already waiting "
                   f"(routing.scheduler.admission.maxQueue is {bound}); retry later")
        return REASON_GLOBAL_QUEUE, QueueFull(message, status=503, retry_after=retry_after(wait))

    def _shed(self, victim: HandlerRequest, newcomer: HandlerRequest) -> None:
        self._remove_waiter(victim)
        self.stats.count(REASON_SHED)
        self._log.info("%s: shed a waiting request for %s (priority %d) to admit one for %s (priority %d)",
                       self.name, victim.model, victim.priority, newcomer.model, newcomer.priority)
        wait = self._expected_wait(victim.model, self._model_waiters(victim.model))
        self._fail(victim, Shed(
            f"Dropped from the queue for {victim.model} to admit a higher-priority request "
            f"(routing.scheduler.admission.policy is shed-lowest); retry later",
            retry_after=retry_after(wait),
        ))
        self._after_removal()

    def _reject(self, req: HandlerRequest, reason: str, err: SchedulerError) -> None:
        self.stats.count(reason)
        self._effects.grant_error(req, err)

    def _remove_waiter(self, req: HandlerRequest) -> bool:
        """Take a waiter out of the queue or out of its swap; False when it is not waiting."""
        if req in self._queue:
            self._queue.remove(req)
            return True
        swap = self._active.get(req.model)
        if swap is not None and req in swap.waiters:
            swap.waiters.remove(req)
            return True
        return False

    def _after_removal(self) -> None:
        """A waiter left: others move up, a load may have lost its last waiter, the plan may change."""
        self._publish_positions()
        self._abort_unwanted_swaps()

    # ----------------------------------------------------------------------------- estimates

    def _expected_wait(self, model: str, ahead: Sequence[HandlerRequest]) -> float:
        """Seconds until a request for `model` behind `ahead` would be served: the time their models take
        to get through them (parallel upstreams get through several at once), plus a load."""
        wait = sum(self.times.per_request(r.model) for r in ahead)
        if self._would_wait(model):
            wait += self._load_remaining(model)
        return wait

    def _load_remaining(self, model: str) -> float:
        swap = self._active.get(model)
        if swap is not None and swap.detached is None:
            return max(0.0, self.times.load(model) - (self._clock() - swap.started))
        if self._effects.model_state(model) is ProcessState.READY and not self._stopping.get(model):
            return 0.0
        return self.times.load(model)

    def _model_slot_wait(self, model: str) -> float:
        """Seconds until one of `model`'s reserved requests is expected to finish and free a slot."""
        now = self._clock()
        service = self.times.service(model)
        serving = [at for req, at in self._granted.items() if req.model == model]
        if serving:
            return max(0.0, min(serving) + service - now)
        return self._load_remaining(model) + service

    def _key_slot_wait(self, api_key: str) -> float:
        """Seconds until one of this API key's requests is expected to finish."""
        now = self._clock()
        ends = [at + self.times.service(req.model) - now for req, at in self._granted.items()
                if req.api_key == api_key]
        for req in self._waiters():
            if req.api_key == api_key:
                ahead = self._model_waiters(req.model)
                ends.append(self._expected_wait(req.model, ahead) + self.times.service(req.model))
        return max(0.0, min(ends, default=0.0))

    # ----------------------------------------------------------------------------- bookkeeping

    def _limit(self, model: str) -> int:
        limit = self._limits.get(model, DEFAULT_CONCURRENCY_LIMIT)
        return limit if limit > 0 else DEFAULT_CONCURRENCY_LIMIT

    def _queue_key(self, req: HandlerRequest) -> tuple[int, int, float, int]:
        within = self._prioritizer.key(req, self._clock(), self._remaining)
        return (-self._priority.get(req.model, 0), -req.priority, within, req.seq)

    def _grant(self, req: HandlerRequest, model: str) -> None:
        if self._effects.grant_serve(req, model):
            self._in_flight[model] = self._in_flight.get(model, 0) + 1
            self._granted[req] = self._clock()
            self._busy_mark.setdefault(model, self._granted[req])
        else:
            self._release(req)  # the client left: no ServeDone will ever come for it

    def _fail(self, req: HandlerRequest, err: SchedulerError) -> None:
        self._release(req)
        self._effects.grant_error(req, err)

    def _reserve(self, req: HandlerRequest) -> None:
        self._reserved[req.model] = self._reserved.get(req.model, 0) + 1
        if self._admission.key_limit(req.api_key) is not None and req.api_key is not None:
            self._key_reserved[req.api_key] = self._key_reserved.get(req.api_key, 0) + 1

    def _release(self, req: HandlerRequest) -> None:
        self._deadlines.forget(req)
        self._preemption.ended(req)
        _decrement(self._reserved, req.model, self.name)
        if req.api_key is not None and req.api_key in self._key_reserved:
            _decrement(self._key_reserved, req.api_key, self.name)

    def _publish_positions(self) -> None:
        previous = self._positions
        self._positions = {}
        for position, req in enumerate(self._queue, start=1):
            self._positions[req] = position
            if previous.get(req) != position:
                self._effects.notify_position(req, position)


def _decrement(counts: dict[str, int], key: str, name: str) -> None:
    count = counts.get(key, 0)
    if count <= 0:
        raise RuntimeError(f"{name}: reservation underflow (scheduler bookkeeping bug)")
    if count == 1:
        del counts[key]
    else:
        counts[key] = count - 1
