"""The batch scheduler: serve the loaded model's requests first, swap when it is idle or a deadline presses.

FIFO swaps whenever the head of its queue can go, so agents calling several models at once make
it load a model for nearly every request. This scheduler keeps a loaded model serving while its
clients keep coming, lets other models' requests wait — bounded — and then serves each model's
accumulated requests in one residency.

Where a request goes (`_place`, in queue order, as FIFO does):
- unknown model → 404; a swap loading its model → join it; its model stopping → wait;
- ready, nothing to evict, and its model is not making room → serve;
- nothing has to stop for its model to load → start that swap now (rule `batch.free`);
  swaps that do not touch each other run in parallel, as in FIFO;
- otherwise it waits, and its model *contends* for the machine.

Which contending model loads next, and when (`_plan`; arithmetic in `batch_plan`):
- `maxWait`: no request waits longer than this because of batching. Each contending model has a
  deadline (its oldest request's arrival + maxWait) and a slot (load + minResidency + a request's
  service); from those the planner derives when the loaded models must start making room so that
  every deadline is met. From then on the earliest-deadline model goes next (`batch.max_wait`):
  the models it evicts stop taking new requests ("make room": new ones queue) and the swap starts
  as soon as their requests in flight finish.
- `minResidency`: a model loaded less than this long ago is not evicted for another model unless
  it is idle (`llmswap.scheduler.idle`: nothing in flight or waiting, and its clients did not come
  back within their observed think time). It takes precedence over `maxWait`, which is what stops
  ping-pong when loads are slow compared to `maxWait`.
- Before any deadline presses, a contending model loads only when every model it would evict is
  idle; among several, the best by priority (model, then request), urgency (depth and age) and
  tie-breaks (oldest arrival, model id) that can go first without making another miss its deadline
  (`batch.deepest_queue`; `batch.idle` when it was the only one).
- A busy model (requests in flight) is never evicted; loads nobody waits for are aborted when a
  queued request needs them gone; unloads, stops and shutdown behave as in FIFO (shared core).

Holding only where it pays (`llmswap.scheduler.arrivals`): the scheduler measures, per model, how
fast its requests arrive while it is loaded and while it is not. A closed loop (agents that wait
for their answer) sends nothing while its model is away, and holding its model saves a load per
request; open-loop traffic arrives regardless, and holding only idles the machine. Both maxWait
(how long others are deferred for a model) and minResidency are scaled by that measure: for
open-loop traffic a contender goes as soon as the models in its way have nothing in flight
(`batch.no_gain`), while the loaded model keeps serving its newcomers meanwhile — FIFO's decision,
so batch never does worse than FIFO there. It starts that way and holds once a model's clients are
measured to wait for it, or from the first exchange that shows agents (see `arrivals`). A residency is
capped at its load so that it never pushes a waiting request past maxWait + one load
(unless minResidency is the longer, which then takes precedence).

Backlog hints (`HandlerRequest.backlog`, a task type's durable queue): a model's depth counts them (the
deepest queue wins among equals); a model whose request announced more is held as a closed loop, within
maxWait.

Timers (deadlines, ends of minimum residency, ends of idle grace, queue timeouts) are reported by
`next_deadline()` and acted on in `on_tick()`; the scheduler never sleeps or reads the wall clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from llmswap.config.model import BatchSettings
from llmswap.process.state import ProcessState
from llmswap.scheduler.arrivals import RETURN_WINDOW, ArrivalRates
from llmswap.scheduler.batch_plan import (
    Contender,
    by_choice,
    by_deadline,
    can_go_first,
    first_latest_start,
    latest_starts,
)
from llmswap.scheduler.core import QueueScheduler
from llmswap.scheduler.decision import Decision, Place
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.idle import ClientGaps
from llmswap.scheduler.settings import DEFAULT_SETTINGS, QueueSettings
from llmswap.scheduler.types import Clock, Effects, HandlerRequest, Swapper
from llmswap.scheduler.urgency import reorder

RULE_FREE = "batch.free"  # nothing had to stop for the model: loaded at once
RULE_IDLE = "batch.idle"  # the models in its way went idle and it was the only one waiting
RULE_DEEPEST = "batch.deepest_queue"  # the models in its way went idle; it had the best score
RULE_MAX_WAIT = "batch.max_wait"  # its oldest request's maxWait deadline made the loaded models give way
RULE_NO_GAIN = "batch.no_gain"  # holding the loaded models saves no load (open-loop traffic): it went at once

_MAX_ROUNDS = 4  # serve/plan rounds per drain; each round that changes nothing ends it earlier


class BatchScheduler(QueueScheduler):
    """Implements `Scheduler` with swap-aware batching. Every method runs on the router's run loop."""

    kind = "batch"
    express_lane = False  # it re-plans after every grant and learns from every arrival

    def __init__(
        self,
        name: str,
        swapper: Swapper,
        effects: Effects,
        *,
        clock: Clock,
        settings: QueueSettings = DEFAULT_SETTINGS,
        batch: BatchSettings | None = None,
        logger: logging.Logger | None = None,
        times: ServiceTimes | None = None,
        rates: ArrivalRates | None = None,
    ) -> None:
        self.batch = batch or BatchSettings()
        super().__init__(name, swapper, effects, clock=clock, settings=settings, logger=logger, times=times)
        self.gaps = ClientGaps()
        self.rates = rates or ArrivalRates()
        self._loaded_at: dict[str, float] = {}  # when each model's last successful swap finished
        self._residency: dict[str, float] = {}  # the cap on each model's minimum residency, set at its load
        self._making_room: frozenset[str] = frozenset()  # ready models that take no new requests
        self._wake: float | None = None  # when the plan must be looked at again

    # ----------------------------------------------------------------------------- policy hooks

    def _accept(self, req: HandlerRequest) -> None:
        reorder(self.books)  # issue 16: lrs keys move with time
        self.books.enqueue(req)
        self._drain()

    def _drain(self) -> None:
        reorder(self.books)  # issue 16: lrs keys move with time
        for _ in range(_MAX_ROUNDS):
            moved = self._serve_round()
            changed = self._plan()
            if not (moved or changed):
                break
        self._settle()

    def _holds(self, model: str) -> bool:
        return model in self._making_room

    def _policy_deadline(self) -> float | None:
        return self._wake

    def _arrived(self, req: HandlerRequest) -> None:
        books = self.books
        quiet = not books.in_flight_of(req.model) and not any(w.model == req.model for w in books.waiters())
        self.gaps.arrived(req.model, self._clock(), quiet=quiet)
        ready = self._effects.model_state(req.model) is ProcessState.READY
        ready = ready and not books.being_evicted(req.model)
        self.rates.arrived(req.model, self._clock(), ready=ready, quiet=quiet)

    def _loaded(self, model: str, duration: float) -> None:
        self._loaded_at[model] = self._clock()
        self.books.announce(model, 0)  # announced for an earlier residency
        self.rates.loaded(model, self._clock())
        # Capped at its load: a residency longer than the waiting models' latest start would push them
        # past maxWait + load (the planner may have counted on a shorter one before holding paid).
        # Unless minResidency is the longer of the two: then it takes precedence, against ping-pong.
        if self.batch.min_residency > self.batch.max_wait:
            self._residency.pop(model, None)
            return
        now = self._clock()
        others = [replace(c, budget=None) for c in self._contenders().values() if c.model != model]
        latest = first_latest_start(others, self.batch.max_wait) - self.books.times.service_upper(model)
        self._residency[model] = max(0.0, latest - now)

    def _finished(self, model: str) -> None:
        self.gaps.finished(model, self._clock())
        self.rates.answered(model, self._clock())

    def _after_removal(self) -> None:
        super()._after_removal()
        self._drain()  # the model that lost a waiter may no longer be the one to load next

    # ----------------------------------------------------------------------------- placement

    def _serve_round(self) -> bool:
        """Serve, join or freely start what can go without evicting anyone; True if anything moved."""
        return self.books.place_queued(self._place)

    def _place(self, req: HandlerRequest) -> bool:
        """Serve, join, start a swap for, or fail `req`. False: it waits, and its model contends."""
        decision = self.books.decide(req.model, req, _contends)
        return self.books.apply(req, decision, RULE_FREE,
                                lambda: f"request #{req.seq} of {req.model}: nothing has to stop for it")

    # ----------------------------------------------------------------------------- planning

    def _plan(self) -> bool:
        """Decide which contending model goes next and whether the loaded ones must make room.

        Returns True when a swap started or the set of models making room changed (another serve
        round may then move requests).
        """
        now = self._clock()
        contenders = self._contenders()
        wakes: list[float] = []
        making_room: frozenset[str] = frozenset()
        started = False
        if contenders:
            max_wait = self.batch.max_wait
            ordered = by_deadline(list(contenders.values()), max_wait, now)
            head = ordered[0]
            evictions = self.books.evictions(head.model)
            # None: the swapper says it can never run; the serve round answers such requests first.
            head_evict = evictions or []
            in_use = [v for v in head_evict if not self._idle(v, now)]
            margin = max((self.books.times.service_upper(v) for v in in_use), default=0.0)
            switch_at = latest_starts(ordered, max_wait)[0] - margin
            # Newcomers of the loaded models are turned away ("make room") only under maxWait itself;
            # before that, a contender whose deferral budget ran out goes as soon as its way is free.
            press_at = first_latest_start([replace(c, budget=None) for c in ordered], max_wait) - margin
            if now >= switch_at:
                pressed = now >= press_at
                if pressed:
                    making_room = frozenset(v for v in head_evict if not self._protected(v, now))
                else:
                    wakes.append(press_at)
                decision = self._decide(head.model, now, pressed=True)
                if decision.place is Place.SWAP:
                    rule = RULE_MAX_WAIT if pressed else RULE_NO_GAIN
                    self._commit(head, decision, rule, contenders, now)
                    started = True
                else:
                    for v in head_evict:
                        if self._protected(v, now):
                            wakes.append(self._loaded_at[v] + self._residency_of(v, now))
                            wakes.extend(self._quiet_wakes(v))
            else:
                wakes.append(switch_at)
                started = self._choose_freely(list(contenders.values()), now, wakes)
        changed = started or making_room != self._making_room
        self._making_room = making_room
        future = [t for t in wakes if t > now]
        self._wake = min(future) if future else None
        return changed

    def _choose_freely(self, contenders: list[Contender], now: float, wakes: list[float]) -> bool:
        """No deadline presses: load the best contender whose way is clear of models still in use."""
        max_wait = self.batch.max_wait
        for c in by_choice(contenders, now, max_wait):
            if not can_go_first(c, contenders, now, max_wait):
                continue
            decision = self._decide(c.model, now, pressed=False)
            if decision.place is Place.SWAP:
                rule = RULE_DEEPEST if len(contenders) > 1 else RULE_IDLE
                self._commit(c, decision, rule, {o.model: o for o in contenders}, now)
                return True
            for v in decision.evict:
                wakes.extend(self._quiet_wakes(v))
        return False

    def _decide(self, model: str, now: float, *, pressed: bool) -> Decision:
        """What a swap to `model` would be now, under batch's rule for its victims: a SWAP starts now.

        Never while it collides with a swap in progress or stops a model that is being unloaded or
        still serving (the books' conditions). Under deadline pressure a victim must only be past its
        minimum residency (or idle); otherwise every victim must be idle.
        """

        def stops(victim: str) -> str | None:
            if self.books.in_flight_of(victim) > 0:
                return f"{victim} still serves"
            if pressed and self._protected(victim, now):
                return f"{victim} is within its minimum residency"
            if not pressed and not self._idle(victim, now):
                return f"{victim} is not idle yet"
            return None

        return self.books.decide(model, None, stops)

    def _commit(self, c: Contender, decision: Decision, rule: str, contenders: Mapping[str, Contender],
                now: float) -> None:
        req = min((r for r in self.books.queue if r.model == c.model), key=self.books.queue_key)
        self.books.dequeue(req)
        queues = ", ".join(
            f"{o.model}={o.depth} (oldest {now - o.oldest:.1f}s)"
            for o in sorted(contenders.values(), key=lambda o: o.model)
        )
        victims = ", ".join(f"{v} ({self._describe(v, now)})" for v in decision.evict) or "nothing"
        detail = (f"request #{req.seq} of {c.model} waited {now - req.arrived:.1f}s; queues: {queues}; "
                  f"evict {victims}")
        for victim in decision.evict:
            self.rates.left(victim, now, window=RETURN_WINDOW * self.books.times.load(victim))
        self.books.apply(req, decision, rule, lambda: detail)
        # Its other queued requests join the swap in the next serve round.

    def _contenders(self) -> dict[str, Contender]:
        groups: dict[str, list[HandlerRequest]] = {}
        for req in self.books.queue:
            groups.setdefault(req.model, []).append(req)
        return {model: self._contender(model, reqs) for model, reqs in groups.items()}

    def _contender(self, model: str, reqs: list[HandlerRequest]) -> Contender:
        top = max(r.priority for r in reqs)
        now = self._clock()
        books = self.books
        within = min(books.prioritizer.key(r, now, books.remaining) for r in reqs if r.priority == top)
        due = None
        if self.books.prioritizer.name != "fcfs":  # under fcfs request deadlines only count when missed
            work = self.books.times.load(model) + self.books.times.service(model)
            dues = [r.deadline - work for r in reqs if r.deadline is not None]
            due = min(dues) if dues else None
        return Contender(
            model=model,
            depth=sum(1 + r.backlog for r in reqs),  # a backlog hint counts as requests queued behind it
            oldest=min(r.arrived for r in reqs),
            model_priority=self.books.model_priority(model),
            request_priority=top,
            slot=self._slot(model),
            budget=self._budget(model),
            due=due,
            within=within,
        )

    def _budget(self, model: str) -> float:
        """How long `model`'s requests may be deferred for the models it would evict: maxWait, scaled
        down to nothing when holding those models saves no load (their traffic is open-loop)."""
        victims = self.books.evictions(model) or []
        if not self.books.preemption.models().isdisjoint(victims):
            return 0.0  # issue 16: what is in its way was preempted for it
        now = self._clock()
        closed = max((self._hold_factor(v, now) for v in victims), default=1.0)
        return self.batch.max_wait * closed

    def _slot(self, model: str) -> float:
        """How long `model` is expected to hold the machine once it goes: load, residency, a last request.

        A model whose clients come back keeps serving them for its minimum residency; one whose
        clients do not goes idle once its queued requests are served and its grace is over.
        """
        service = self.books.times.service_upper(model)
        returning = self.gaps.returning(model)
        residency = self.batch.min_residency * self._hold_factor(model, self._clock())
        if_returning = max(residency, service)
        if_not = service + self.gaps.grace(model)
        expected = returning * if_returning + (1 - returning) * min(if_returning, if_not)
        return self.books.times.load(model) + expected + service

    # ----------------------------------------------------------------------------- model status

    def _hold_factor(self, model: str, now: float) -> float:
        """1 when its last finished request, or one in flight, announced a backlog; else as measured."""
        books = self.books
        announced = books.announced(model) or any(r.backlog for r in books.granted if r.model == model)
        return 1.0 if announced else self.rates.hold_factor(model, now)

    def _busy(self, model: str) -> bool:  # an announced backlog comes next (maxWait bounds the wait for it)
        books = self.books
        return bool(books.in_flight_of(model) or books.loading(model) or books.queued_for(model)
                    or books.announced(model))

    def _idle(self, model: str, now: float) -> bool:
        """Nothing in flight, waiting or announced, not loading, and its last request's grace is over."""
        if self._busy(model):
            return False
        quiet_from = self.gaps.quiet_from(model)
        return quiet_from is None or now >= quiet_from

    def _protected(self, model: str, now: float) -> bool:
        """Loaded less than minResidency ago and not idle: not to be evicted for another model."""
        loaded_at = self._loaded_at.get(model)
        if loaded_at is None or self._effects.model_state(model) is not ProcessState.READY:
            return False
        if model in self.books.preemption.models():
            return False  # issue 16: preempted for a higher-priority request
        return now < loaded_at + self._residency_of(model, now) and not self._idle(model, now)

    def _residency_of(self, model: str, now: float) -> float:
        """minResidency, scaled by whether holding `model` pays, within the cap set at its load."""
        held = self.batch.min_residency * self._hold_factor(model, now)
        return min(held, self._residency.get(model, held))

    def _quiet_wakes(self, model: str) -> list[float]:
        """When `model` may turn idle without any event: the end of its grace, if nothing else holds it."""
        if self._busy(model):
            return []
        quiet_from = self.gaps.quiet_from(model)
        return [] if quiet_from is None else [quiet_from]

    def _describe(self, model: str, now: float) -> str:
        loaded_at = self._loaded_at.get(model)
        resident = f"resident {now - loaded_at:.1f}s" if loaded_at is not None else "resident ?"
        last = self.gaps.last_finish(model)
        quiet = f"last request {now - last:.1f}s ago" if last is not None else "never served"
        return f"{resident}, {quiet}"


def _contends(victim: str) -> str:
    """Batch's rule in a serve round: a swap that stops anything contends; `_plan` decides when it goes."""
    return f"it would evict {victim}: it contends, and the plan decides whether its model goes next"
