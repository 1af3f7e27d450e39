"""The books every queueing scheduler keeps, and the interface its placement policies read them through.

`SchedulerBooks` owns the state — swaps in progress and their waiters, the queue, in-flight and reserved
counts, unloads in progress — and the operations that keep it consistent (grant, fail, reserve,
release, join, remove a waiter) and the estimates read from it. `QueueScheduler` (core.py) adds the event
handling; FIFO and batch add placement. Subclasses read and change the books only through the methods
here (`_queued`, `_enqueue`, `_place_queued`, `_in_flight_of`, `_loading`, `_unloading`, ...).

Invariants the books keep:
- `_reserved[model]` counts admitted requests not yet finished, errored or cancelled (queued,
  joined to a swap, or in flight); `_key_reserved` the same per API key.
- A request is in flight (`_granted`) only when `grant_serve` returned True; its `ServeDone`
  ends it. A swap whose waiters all left, or whose model was unloaded, stays "detached" on the
  books until its `SwapDone`, so one model never has two swaps in flight.
- `_announced_until[model]`: a finished request of `model` announced more behind it (a backlog hint,
  `HandlerRequest.backlog`); its client's next request is on its way, so neither scheduler evicts the
  model for another before then — for at most `ANNOUNCED_GRACE`, in case it never comes.
"""

from __future__ import annotations

import bisect
import enum
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmswap.config.model import DEFAULT_CONCURRENCY_LIMIT, EMPTY, AdmissionConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.admission import Admission, SchedulerStats
from llmswap.scheduler.deadlines import Deadlines
from llmswap.scheduler.errors import ModelNotFound, SchedulerError
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.preemption import Preempting
from llmswap.scheduler.prioritizers import Prioritizer
from llmswap.scheduler.types import Clock, Effects, HandlerRequest, Swapper

# Seconds a model stays announced after a request of it finished saying more come (a task lane claims its next
# task from the database meanwhile: milliseconds); the bound, should the next one never come.
ANNOUNCED_GRACE = 3.0


class Place(enum.Enum):
    """Where a request goes, as `QueueScheduler._decide` sees it now."""

    SERVE = "serve"  # its model is ready, free to take it, nothing to evict
    JOIN = "join"  # a swap to its model is loading: it waits for that one
    SWAP = "swap"  # its model must be started (evicting `Decision.evict`); the policy says when
    WAIT = "wait"  # something in its way must end first (`Decision.why`)
    FAIL = "fail"  # it can never be served here (`Decision.error`)


@dataclass(frozen=True)
class Decision:
    """What `_decide` makes of a request: pure data, applied by the policy (`_apply`)."""

    place: Place
    evict: tuple[str, ...] = ()  # SWAP: what starting its model stops
    running: tuple[str, ...] = ()  # SWAP: the running set the swapper saw
    swap: ActiveSwap | None = None  # JOIN: the swap it joins
    error: SchedulerError | None = None  # FAIL
    why: str = ""  # WAIT, for the debug log


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


class SchedulerBooks:
    """The state of a queueing scheduler and the operations that keep it; see the module docstring."""

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
        # The order within a priority class, deadlines and preemption (llmswap.scheduler.urgency).
        self._prioritizer = prioritizer or Prioritizer()
        self._deadlines = Deadlines(on_deadline)
        self._preemption = Preempting(preempt_below)

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
        self._announced_until: dict[str, float] = {}  # see the module docstring
        self._shutdown: SchedulerError | None = None

    def _holds(self, model: str) -> bool:
        """Whether a ready `model` must not take new requests right now (it is making room)."""
        return False

    # ----------------------------------------------------------------------------- the interface

    def _queued(self) -> Sequence[HandlerRequest]:
        """The queue, in order (read only: change it with the methods below)."""
        return self._queue

    def _enqueue(self, req: HandlerRequest) -> None:
        bisect.insort(self._queue, req, key=self._queue_key)

    def _place_queued(self, place: Callable[[HandlerRequest], bool]) -> bool:
        """Offer each queued request, in order, to `place`; those it took (True) leave. True if any did."""
        if not self._queue:
            return False
        remaining = [req for req in self._queue if not place(req)]
        moved = len(remaining) != len(self._queue)
        self._queue = remaining
        return moved

    def _resort(self) -> None:
        """Sort the queue again (keys that move with time: the lrs prioritizer's slack)."""
        self._queue.sort(key=self._queue_key)

    def _serving(self) -> Iterator[HandlerRequest]:
        """The requests in flight (granted, no ServeDone yet)."""
        return iter(self._granted)

    def _dequeue(self, req: HandlerRequest) -> None:
        self._queue.remove(req)

    def _in_flight_of(self, model: str) -> int:
        return self._in_flight.get(model, 0)

    def _loading(self, model: str) -> bool:
        """Whether a swap to `model` is on the books (joinable or still winding down)."""
        return model in self._active

    def _being_evicted(self, model: str) -> bool:
        """Whether a swap in progress stops `model` to make room."""
        return any(model in swap.evict for swap in self._active.values())

    def _unloading(self, model: str) -> bool:
        """Whether an unload of `model` has not finished stopping it."""
        return bool(self._stopping.get(model))

    def _announce(self, model: str, backlog: int) -> None:
        """A request of `model` finished with `backlog` more of its client's queued behind it."""
        if backlog > 0:
            self._announced_until[model] = self._clock() + ANNOUNCED_GRACE
        else:
            self._announced_until.pop(model, None)

    def _announced(self, model: str) -> bool:
        """Whether `model`'s client announced a next request that has not had its grace yet."""
        until = self._announced_until.get(model)
        return until is not None and self._clock() < until

    def _announcement_ends(self) -> float | None:
        now = self._clock()
        return min((t for t in self._announced_until.values() if t > now), default=None)

    def _model_priority(self, model: str) -> int:
        return self._priority.get(model, 0)

    def _queued_for(self, model: str) -> bool:
        return any(r.model == model for r in self._queue)

    # ----------------------------------------------------------------------------- waiters

    def _join(self, req: HandlerRequest, swap: ActiveSwap) -> None:
        swap.waiters.append(req)
        self._log.debug("%s: %s joins the swap in progress (%d waiting)", self.name, req.model,
                        len(swap.waiters))

    def _evictions(self, model: str) -> list[str] | None:
        """What a swap to `model` would evict right now; None when the swapper says it can never run."""
        try:
            return self._swapper.evictions_for(model, self._running_set(exclude=model))
        except SchedulerError:
            return None

    def _running_set(self, exclude: str) -> list[str]:
        running = set(self._effects.running_models())
        if self._active:
            running.update(m for m in self._active if m != exclude)
        return sorted(running)

    def _collides(self, model: str, evict: Sequence[str]) -> bool:
        return any(s.collides(model, evict) for m, s in self._active.items() if m != model)

    def _would_wait(self, model: str) -> bool:
        """Whether a request for `model` arriving now would wait (queued or joined to a swap)."""
        return self._decide(model).place in (Place.JOIN, Place.SWAP, Place.WAIT)

    def _decide(self, model: str, req: HandlerRequest | None = None) -> Decision:
        """Where a request for `model` (`req`, when there is one) goes now. Read-only: the one list of
        conditions that placement (`_apply` and each policy's `_place`), the fast path (`try_grant_now`) and
        admission (`_would_wait`) share."""
        state = self._effects.model_state(model)
        if state is None:
            return Decision(Place.FAIL, error=ModelNotFound(model))
        swap = self._active.get(model)
        if swap is not None:
            if swap.detached is not None:
                return Decision(Place.WAIT, why="its abandoned swap is still winding down")
            return Decision(Place.JOIN, swap=swap)
        if self._stopping.get(model):
            return Decision(Place.WAIT, why="it is being unloaded")
        running = tuple(self._running_set(exclude=model))
        try:
            evict = tuple(self._swapper.evictions_for(model, running))
        except SchedulerError as err:
            return Decision(Place.FAIL, error=err)
        if req is not None and self._preemption.holds(model, req):
            return Decision(Place.WAIT, why="its model is being emptied for a request of higher priority")
        if self._collides(model, evict):
            return Decision(Place.WAIT, why="it collides with a swap in progress")
        if state is ProcessState.READY and not evict:
            if self._holds(model):
                return Decision(Place.WAIT, why="its model is making room")
            return Decision(Place.SERVE)
        return Decision(Place.SWAP, evict=evict, running=running)

    def _apply(self, req: HandlerRequest, decision: Decision) -> bool | None:
        """Carry out what every policy does alike: FAIL, JOIN and SERVE (True: `req` is placed) and WAIT
        (False: it stays queued); None for SWAP, whose when is the policy's."""
        if decision.place is Place.FAIL:
            assert decision.error is not None
            self._fail(req, decision.error)
            return True
        if decision.place is Place.JOIN:
            assert decision.swap is not None
            self._join(req, decision.swap)
            return True
        if decision.place is Place.SERVE:
            self._grant(req, req.model)
            return True
        if decision.place is Place.WAIT:
            self._log.debug("%s: %s waits: %s", self.name, req.model, decision.why)
            return False
        return None

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

    # ----------------------------------------------------------------------------- estimates

    def _expected_wait(self, model: str, ahead: Sequence[HandlerRequest]) -> float:
        """Seconds until a request for `model` behind `ahead` would be served: the time their models take
        to get through them (parallel upstreams get through several at once), plus a load."""
        wait = sum(self.times.per_request(r.model) for r in ahead)
        if self._would_wait(model):
            wait += self._load_remaining(model)
        return wait

    def _remaining(self, req: HandlerRequest) -> float:
        """Seconds of work still ahead of waiting `req`: its model's load if it must load, one service."""
        load = self._load_remaining(req.model) if self._would_wait(req.model) else 0.0
        return load + self.times.service(req.model)

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
