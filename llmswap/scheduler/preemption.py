"""Preemption of background work: a request above the bound takes the memory that lower work holds.

Background work (tasks at `tasks.priority` -10, batch-key requests) runs below interactive traffic.
Without preemption an interactive request whose model needs the memory of a model busy with such
work waits until every one of those requests has finished — minutes for a long task batch. With
`routing.scheduler.settings.preemptBelow: B` (off unless set; miniVLLM's preemption of the lowest
priority, seed 002):

- a waiting request of priority >= B whose swap would evict a model that is serving only requests of
  priority < B preempts them: the scheduler asks `Effects.preempt` to end each (its upstream request
  is aborted; its client is answered `Preempted`), and that model takes no new request below B
  until they are gone (`preempting`);
- once their `ServeDone`s arrive the swap starts as it would for any idle model;
- a model serving any request of priority >= B is waited for as usual: interactive requests (0) are
  never preempted unless B is raised above their priority.

Each preemption is logged and counted (`SchedulerStats.preempted`, by reason) with the request that
caused it. What the client of a preempted request does is its own business: the task queue puts the
task back at the head of its durable queue with its attempt counted (see README).

Pure bookkeeping; the decisions are taken on the scheduler's run loop like every other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmswap.scheduler.types import HandlerRequest

REASON_PRIORITY = "higher_priority"  # a request of priority >= preemptBelow needed the memory


@dataclass(frozen=True)
class Preemption:
    """One in-flight request ended to make room: what, for whom, and why (the typed event at the seam)."""

    request: HandlerRequest  # the preempted (in-flight) request
    model: str  # the model it was served by, being evicted
    by: HandlerRequest  # the waiting request that needed the memory
    reason: str = REASON_PRIORITY

    @property
    def message(self) -> str:
        return (f"preempted: {self.model} was needed for a request of priority {self.by.priority} "
                f"(this one has priority {self.request.priority}, below "
                f"routing.scheduler.settings.preemptBelow); retry it later")


class Preempting:
    """Which in-flight requests are being preempted, per model."""

    def __init__(self, bound: int | None) -> None:
        self.bound = bound  # None: preemption is off
        self._models: dict[str, set[int]] = {}  # model -> seq of its requests being preempted
        self._freed: set[str] = set()  # preempted models whose requests are gone, until they are evicted

    def may_preempt(self, by: HandlerRequest) -> bool:
        return self.bound is not None and by.priority >= self.bound

    def preemptible(self, req: HandlerRequest) -> bool:
        return self.bound is not None and req.priority < self.bound

    def victims(self, by: HandlerRequest, evict: Iterable[str],
                serving: Mapping[str, list[HandlerRequest]]) -> list[Preemption]:
        """The in-flight requests to end so that `by`'s swap may evict `evict`; [] when it must wait.

        Every model in the way that still serves something must serve only preemptible requests;
        models already being preempted are not asked twice."""
        if not self.may_preempt(by):
            return []
        out: list[Preemption] = []
        for model in evict:
            requests = serving.get(model, [])
            if not requests or model in self._models:
                continue
            if not all(self.preemptible(r) for r in requests):
                return []  # someone in the way is not preemptible: wait as usual
            out.extend(Preemption(r, model, by) for r in requests)
        return out

    def started(self, preemptions: Iterable[Preemption]) -> None:
        for p in preemptions:
            self._models.setdefault(p.model, set()).add(p.request.seq)

    def holds(self, model: str, req: HandlerRequest) -> bool:
        """Whether `req` may not have `model` now: `model` is being emptied and `req` is below the bound."""
        return (model in self._models or model in self._freed) and self.preemptible(req)

    def ended(self, req: HandlerRequest) -> None:
        """A request finished (its ServeDone): a model whose preempted requests are all gone is free."""
        seqs = self._models.get(req.model)
        if seqs is None:
            return
        seqs.discard(req.seq)
        if not seqs:
            del self._models[req.model]
            self._freed.add(req.model)

    def evicted(self, models: Iterable[str]) -> None:
        """A swap evicting `models` started: what was preempted for it is done."""
        for model in models:
            self._freed.discard(model)

    def retain(self, needed: Iterable[str]) -> None:
        """Keep holding only freed models some waiting preemptor still needs (its client may have left)."""
        self._freed &= set(needed)

    def idle(self) -> bool:
        """Whether no model is preempted or held for a preemptor (`models()` is empty)."""
        return not self._models and not self._freed

    def models(self) -> frozenset[str]:
        """Models preempted (or freed by it) and not yet evicted: they take nothing below the bound."""
        return frozenset(self._models) | frozenset(self._freed)
