"""The books of a queueing scheduler: its state, the operations that keep it consistent, and its one decision.

`Books` is held by `QueueScheduler` (core.py), which handles the events, and read by the placement
policies (FIFO, batch) that it hands them to. Its state is public to read and is changed through the
methods here (reserve, grant, served, fail, release, enqueue, join, remove a waiter, start and end a swap,
unload, close), so the invariants below hold whoever acts; the one thing changed from outside is a swap's
own record (`ActiveSwap.detached`) when the scheduler aborts a load nobody waits for. `decide` is the one
read-only answer to "where does a request for this model go now", which placement, the fast path and
admission share; `apply` carries it out.

Invariants the books keep:
- `reserved[model]` counts admitted requests not yet finished, errored or cancelled (queued,
  joined to a swap, or in flight); `key_reserved` the same per API key.
- A request is in flight (`granted`) only when `grant_serve` returned True; its `ServeDone`
  ends it. A swap whose waiters all left, or whose model was unloaded, stays "detached" on the
  books until its `SwapDone`, so one model never has two swaps in flight.
- `announced_until[model]`: a finished request of `model` announced more behind it (a backlog hint,
  `HandlerRequest.backlog`); its client's next request is on its way, so neither scheduler evicts the
  model for another before then — for at most `ANNOUNCED_GRACE`, in case it never comes.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator, Sequence

from llmswap.config.model import DEFAULT_CONCURRENCY_LIMIT
from llmswap.process.state import ProcessState
from llmswap.scheduler.admission import Admission, SchedulerStats
from llmswap.scheduler.deadlines import Deadlines
from llmswap.scheduler.decision import ActiveSwap, Decision, Place, StopRule
from llmswap.scheduler.errors import ModelNotFound, SchedulerError
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.preemption import Preempting
from llmswap.scheduler.settings import QueueSettings
from llmswap.scheduler.types import Clock, Effects, HandlerRequest, Swapper, SwapPlan

# Seconds a model stays announced after a request of it finished saying more come (a task lane claims its next
# task from the database meanwhile: milliseconds); the bound, should the next one never come.
ANNOUNCED_GRACE = 3.0


class Books:
    """The state of a queueing scheduler and the operations that keep it; see the module docstring."""

    def __init__(
        self,
        name: str,
        swapper: Swapper,
        effects: Effects,
        settings: QueueSettings,
        *,
        clock: Clock,
        log: logging.Logger,
        holds: Callable[[str], bool],
        times: ServiceTimes | None = None,
    ) -> None:
        self.name = name
        self.swapper = swapper
        self.effects = effects
        self.clock = clock
        self.log = log
        self.limits = settings.limits
        self.priority = settings.priority
        self.admission = Admission(settings.admission, settings.key_limits)
        self.times = times or ServiceTimes()
        self.stats = SchedulerStats()
        # The order within a priority class, deadlines and preemption (llmswap.scheduler.urgency).
        self.prioritizer = settings.prioritizer
        self.deadlines = Deadlines(settings.on_deadline)
        self.preemption = Preempting(settings.preempt_below)
        # Whether a ready model must not take new requests right now (the batch policy's "making room").
        self.holds = holds

        self.active: dict[str, ActiveSwap] = {}
        self.queue: list[HandlerRequest] = []  # sorted by queue_key
        self.positions: dict[HandlerRequest, int] = {}  # last position told to each queued waiter
        self.in_flight: dict[str, int] = {}  # granted and not yet ServeDone, per model
        self.granted: dict[HandlerRequest, float] = {}  # in flight: when each was granted
        # Models in flight: when each became busy or last completed a request (the start of its next gap).
        self.busy_mark: dict[str, float] = {}
        self.reserved: dict[str, int] = {}  # admitted and not yet finished, errored or cancelled
        self.key_reserved: dict[str, int] = {}  # the same, per API key that has a maxConcurrent
        self.stopping: dict[str, int] = {}  # unloads whose StopDone has not arrived, per model
        self.announced_until: dict[str, float] = {}  # see the module docstring
        self.shutdown: SchedulerError | None = None
        # Swaps decided but waiting for requests in flight on their victims to end (`track_drains`): the
        # target, since when, and the victims still serving then. The first in queue order is prefetched.
        self.draining: dict[str, tuple[float, tuple[str, ...]]] = {}
        self.prefetching: str | None = None

    # ----------------------------------------------------------------------------- the interface

    def enqueue(self, req: HandlerRequest) -> None:
        bisect.insort(self.queue, req, key=self.queue_key)

    def place_queued(self, place: Callable[[HandlerRequest], bool]) -> bool:
        """Offer each queued request, in order, to `place`; those it took (True) leave. True if any did."""
        if not self.queue:
            return False
        remaining = [req for req in self.queue if not place(req)]
        moved = len(remaining) != len(self.queue)
        self.queue = remaining
        return moved

    def resort(self) -> None:
        """Sort the queue again (keys that move with time: the lrs prioritizer's slack)."""
        self.queue.sort(key=self.queue_key)

    def dequeue(self, req: HandlerRequest) -> None:
        self.queue.remove(req)

    def in_flight_of(self, model: str) -> int:
        return self.in_flight.get(model, 0)

    def loading(self, model: str) -> bool:
        """Whether a swap to `model` is on the books (joinable or still winding down)."""
        return model in self.active

    def being_evicted(self, model: str) -> bool:
        """Whether a swap in progress stops `model` to make room."""
        return any(model in swap.evict for swap in self.active.values())

    def calm(self) -> bool:
        """Nothing queued, loading, draining, unloading or preempted, and not shut down: no placement is
        pending, so a ready model's verdict (`decide`) changes only with an event (the express lane)."""
        if self.queue or self.active or self.draining or self.stopping or self.shutdown is not None:
            return False
        return self.preemption.bound is None or self.preemption.idle()

    def model_full(self, model: str, inherited: int = 0) -> bool:
        """Whether `model` holds its concurrencyLimit of requests waiting or running (with `inherited` from a
        reload's predecessor)."""
        return self.reserved.get(model, 0) + inherited >= self.limit(model)

    def key_full(self, key: str | None) -> bool:
        """Whether API key `key` holds its maxConcurrent of requests waiting or running."""
        if key is None:
            return False
        key_limit = self.admission.key_limit(key)
        return key_limit is not None and self.key_reserved.get(key, 0) >= key_limit

    def has_room(self, req: HandlerRequest) -> bool:
        """Whether `req` is within its model's concurrencyLimit and its API key's maxConcurrent (the express
        lane's check: no reload's requests count there, see `intake.limit_refusal`)."""
        return not self.model_full(req.model) and not self.key_full(req.api_key)

    def unloading(self, model: str) -> bool:
        """Whether an unload of `model` has not finished stopping it."""
        return bool(self.stopping.get(model))

    def announce(self, model: str, backlog: int) -> None:
        """A request of `model` finished with `backlog` more of its client's queued behind it."""
        if backlog > 0:
            self.announced_until[model] = self.clock() + ANNOUNCED_GRACE
        else:
            self.announced_until.pop(model, None)

    def announced(self, model: str) -> bool:
        """Whether `model`'s client announced a next request that has not had its grace yet."""
        until = self.announced_until.get(model)
        return until is not None and self.clock() < until

    def announcement_ends(self) -> float | None:
        now = self.clock()
        return min((t for t in self.announced_until.values() if t > now), default=None)

    def model_priority(self, model: str) -> int:
        return self.priority.get(model, 0)

    def queued_for(self, model: str) -> bool:
        return any(r.model == model for r in self.queue)

    # ----------------------------------------------------------------------------- waiters

    def join(self, req: HandlerRequest, swap: ActiveSwap) -> None:
        swap.waiters.append(req)
        self.log.debug("%s: %s joins the swap in progress (%d waiting)", self.name, req.model,
                        len(swap.waiters))

    def evictions(self, model: str) -> list[str] | None:
        """What a swap to `model` would evict right now; None when the swapper says it can never run."""
        try:
            return self.swapper.evictions_for(model, self.running_set(exclude=model))
        except SchedulerError:
            return None

    def running_set(self, exclude: str) -> list[str]:
        running = set(self.effects.running_models())
        if self.active:
            running.update(m for m in self.active if m != exclude)
        return sorted(running)

    def collides(self, model: str, evict: Sequence[str]) -> bool:
        return any(s.collides(model, evict) for m, s in self.active.items() if m != model)

    def would_wait(self, model: str) -> bool:
        """Whether a request for `model` arriving now would wait (queued or joined to a swap)."""
        return self.decide(model).place in (Place.JOIN, Place.SWAP, Place.WAIT)

    def decide(self, model: str, req: HandlerRequest | None = None,
               stops: StopRule | None = None) -> Decision:
        """Where a request for `model` (`req`, when there is one) goes now. Read-only: the one list of
        conditions that placement (`apply`), the fast path (`try_grant_now`) and admission (`would_wait`)
        share.

        With `stops`, the policy's rule for a swap's victims, a SWAP is one that starts now: a victim being
        unloaded, or one the rule keeps (its reason), makes it a WAIT. Without it, SWAP says only that its
        model needs a swap (admission, the drain's bookkeeping)."""
        state = self.effects.model_state(model)
        if state is None:
            return Decision(Place.FAIL, error=ModelNotFound(model))
        swap = self.active.get(model)
        if swap is not None:
            if swap.detached is not None:
                return Decision(Place.WAIT, why="its abandoned swap is still winding down")
            return Decision(Place.JOIN, swap=swap)
        if self.stopping.get(model):
            return Decision(Place.WAIT, why="it is being unloaded")
        running = tuple(self.running_set(exclude=model))
        try:
            evict = tuple(self.swapper.evictions_for(model, running))
        except SchedulerError as err:
            return Decision(Place.FAIL, error=err)
        if req is not None and self.preemption.holds(model, req):
            return Decision(Place.WAIT, why="its model is being emptied for a request of higher priority")
        if self.collides(model, evict):
            return Decision(Place.WAIT, why="it collides with a swap in progress")
        if state is ProcessState.READY and not evict:
            if self.holds(model):
                return Decision(Place.WAIT, why="its model is making room")
            return Decision(Place.SERVE)
        if stops is not None:
            for victim in evict:
                why = "it would evict a model being unloaded" if self.unloading(victim) else stops(victim)
                if why:
                    return Decision(Place.WAIT, evict=evict, running=running, why=why)
        return Decision(Place.SWAP, evict=evict, running=running)

    def apply(self, req: HandlerRequest, decision: Decision, rule: str = "",
              detail: Callable[[], str] | None = None) -> bool:
        """Carry out `decision` for `req`: True when it is placed (failed, joined a swap, served, or its swap
        started, under `rule`, logged with `detail`); False when it waits (it stays queued)."""
        if decision.place is Place.FAIL:
            assert decision.error is not None
            self.fail(req, decision.error)
            return True
        if decision.place is Place.JOIN:
            assert decision.swap is not None
            self.join(req, decision.swap)
            return True
        if decision.place is Place.SERVE:
            self.grant(req, req.model)
            return True
        if decision.place is Place.WAIT:
            self.log.debug("%s: %s waits: %s", self.name, req.model, decision.why)
            return False
        self.start_swap(req, decision.evict, decision.running, rule, detail() if detail is not None else "")
        return True

    def start_swap(self, req: HandlerRequest, evict: tuple[str, ...], running: Sequence[str], rule: str,
                   detail: str) -> None:
        # Recorded before launching so that requests arriving meanwhile join it instead of starting another.
        now = self.clock()
        self.active[req.model] = ActiveSwap(req.model, evict, now, [req])
        self.preemption.evicted(evict)
        self.swapper.on_swap_start(req.model, running)
        self.log.info("swap: start %s evict [%s] rule=%s (%s)", req.model, ", ".join(evict), rule, detail)
        drained = self.draining.pop(req.model, None)
        if self.prefetching == req.model:
            self.prefetching = None  # the swap owns the read from here on
        drain = None if drained is None else now - drained[0]
        self.effects.start_swap(SwapPlan(req.model, evict, rule, request_seq=req.seq, detail=detail,
                                         drain=drain, drained=drained[1] if drained is not None else ()))

    def track_drains(self) -> None:
        """After a pass over the queue: note the swaps decided but waiting for their victims' requests in
        flight to end (the `drain` phase starts then), forget those nobody waits for any more, and have the
        first of them in queue order prefetched (one read at a time: two would halve each other's speed)."""
        if not self.queue and not self.draining:
            return
        now = self.clock()
        waiting: dict[str, tuple[float, tuple[str, ...]]] = {}
        first: str | None = None
        for req in self.queue:
            if req.model in waiting or req.model in self.active:
                continue
            decision = self.decide(req.model)
            busy = tuple(m for m in decision.evict if self.in_flight_of(m) > 0)
            if decision.place is not Place.SWAP or not busy:
                continue
            since = self.draining.get(req.model)
            waiting[req.model] = since if since is not None else (now, busy)
            first = first or req.model
        self.draining = waiting
        if first != self.prefetching:
            if self.prefetching is not None:
                self.effects.cancel_prefetch(self.prefetching)
            self.prefetching = first
            if first is not None:
                self.effects.prefetch(first)

    def end_swap(self, model: str) -> ActiveSwap | None:
        """The swap to `model` is done (its SwapDone): off the books, with whoever still waits for it."""
        return self.active.pop(model, None)

    def waiters(self) -> Iterator[HandlerRequest]:
        """Every waiting request: queued, or joined to a swap in progress."""
        yield from self.queue
        for swap in self.active.values():
            yield from swap.waiters

    def model_waiters(self, model: str) -> list[HandlerRequest]:
        waiters = [r for r in self.queue if r.model == model]
        swap = self.active.get(model)
        if swap is not None:
            waiters.extend(swap.waiters)
        return waiters

    def remove_waiter(self, req: HandlerRequest) -> bool:
        """Take a waiter out of the queue or out of its swap; False when it is not waiting."""
        if req in self.queue:
            self.queue.remove(req)
            return True
        swap = self.active.get(req.model)
        if swap is not None and req in swap.waiters:
            swap.waiters.remove(req)
            return True
        return False

    # ----------------------------------------------------------------------------- estimates

    def expected_wait(self, model: str, ahead: Sequence[HandlerRequest]) -> float:
        """Seconds until a request for `model` behind `ahead` would be served: the time their models take
        to get through them (parallel upstreams get through several at once), plus a load."""
        wait = sum(self.times.per_request(r.model) for r in ahead)
        if self.would_wait(model):
            wait += self.load_remaining(model)
        return wait

    def remaining(self, req: HandlerRequest) -> float:
        """Seconds of work still ahead of waiting `req`: its model's load if it must load, one service."""
        load = self.load_remaining(req.model) if self.would_wait(req.model) else 0.0
        return load + self.times.service(req.model)

    def load_remaining(self, model: str) -> float:
        swap = self.active.get(model)
        if swap is not None and swap.detached is None:
            return max(0.0, self.times.load(model) - (self.clock() - swap.started))
        if self.effects.model_state(model) is ProcessState.READY and not self.stopping.get(model):
            return 0.0
        return self.times.load(model)

    # ----------------------------------------------------------------------------- bookkeeping

    def limit(self, model: str) -> int:
        limit = self.limits.get(model, DEFAULT_CONCURRENCY_LIMIT)
        return limit if limit > 0 else DEFAULT_CONCURRENCY_LIMIT

    def queue_key(self, req: HandlerRequest) -> tuple[int, int, float, int]:
        within = self.prioritizer.key(req, self.clock(), self.remaining)
        return (-self.priority.get(req.model, 0), -req.priority, within, req.seq)

    def grant(self, req: HandlerRequest, model: str) -> None:
        if self.effects.grant_serve(req, model):
            self.in_flight[model] = self.in_flight.get(model, 0) + 1
            self.granted[req] = self.clock()
            self.busy_mark.setdefault(model, self.granted[req])
        else:
            self.release(req)  # the client left: no ServeDone will ever come for it

    def served(self, req: HandlerRequest, model: str, backlog: int) -> bool | None:
        """Book the end of in-flight `req` of `model` (its ServeDone): its service time and its model's gap
        measured, its reservation released, its backlog announced. None when it was not in flight; True
        when `model` has nothing left in flight."""
        granted_at = self.granted.pop(req, None)
        if granted_at is None:
            return None
        now = self.clock()
        self.times.observe_service(model, now - granted_at)
        mark = self.busy_mark.get(model)
        if mark is not None:
            self.times.observe_gap(model, now - mark)
        self.busy_mark[model] = now
        self.release(req)
        self.announce(model, backlog)
        count = self.in_flight.get(model, 0)
        if count > 1:
            self.in_flight[model] = count - 1
            return False
        self.in_flight.pop(model, None)
        self.busy_mark.pop(model, None)  # idle time is no part of any gap
        return True

    def fail(self, req: HandlerRequest, err: SchedulerError) -> None:
        self.release(req)
        self.effects.grant_error(req, err)

    def reserve(self, req: HandlerRequest) -> None:
        self.reserved[req.model] = self.reserved.get(req.model, 0) + 1
        if req.api_key is not None and self.admission.key_limit(req.api_key) is not None:
            self.key_reserved[req.api_key] = self.key_reserved.get(req.api_key, 0) + 1

    def release(self, req: HandlerRequest) -> None:
        if req.deadline is not None:  # only a request with a deadline is ever counted late
            self.deadlines.forget(req)
        if self.preemption.bound is not None:  # nothing is preempted without preemptBelow
            self.preemption.ended(req)
        _decrement(self.reserved, req.model, self.name)
        if req.api_key is not None and req.api_key in self.key_reserved:
            _decrement(self.key_reserved, req.api_key, self.name)

    def unload(self, models: Sequence[str], err: SchedulerError) -> None:
        """`models` are being unloaded: fail whoever waits for them (queued, or joined to their swaps, which
        stay detached until their SwapDone), and count them stopping until their StopDone."""
        for model in models:
            swap = self.active.get(model)
            if swap is not None:
                for waiter in swap.waiters:
                    self.fail(waiter, err)
                swap.waiters.clear()
                swap.detached = "unloaded"
        targets = set(models)
        for req in [r for r in self.queue if r.model in targets]:
            self.queue.remove(req)
            self.fail(req, err)
        for model in targets:
            self.stopping[model] = self.stopping.get(model, 0) + 1

    def stopped(self, models: Sequence[str]) -> None:
        """The unloads of `models` finished stopping them (their StopDone)."""
        for model in models:
            left = self.stopping.get(model, 0) - 1
            if left > 0:
                self.stopping[model] = left
            else:
                self.stopping.pop(model, None)

    def close(self, err: SchedulerError) -> None:
        """Shut down: every waiter fails with `err`, and so does every request that arrives after."""
        self.shutdown = err
        for swap in self.active.values():
            for waiter in swap.waiters:
                self.fail(waiter, err)
            swap.waiters.clear()
        queued, self.queue = self.queue, []
        for req in queued:
            self.fail(req, err)
        self.positions.clear()

    def publish_positions(self) -> None:
        previous = self.positions
        self.positions = {}
        for position, req in enumerate(self.queue, start=1):
            self.positions[req] = position
            if previous.get(req) != position:
                self.effects.notify_position(req, position)


def _decrement(counts: dict[str, int], key: str, name: str) -> None:
    count = counts.get(key, 0)
    if count <= 0:
        raise RuntimeError(f"{name}: reservation underflow (scheduler bookkeeping bug)")
    if count == 1:
        del counts[key]
    else:
        counts[key] = count - 1
