"""What every queueing scheduler adds for issue 16: the prioritizer's order, deadlines, preemption.

A mixin of `QueueScheduler` (`llmswap.scheduler.core`), kept apart so that the books there stay about
queues and swaps: the order of requests within a priority class (`llmswap.scheduler.prioritizers`),
requests that can no longer meet their deadline (`llmswap.scheduler.deadlines`) and the preemption
of background work (`llmswap.scheduler.preemption`). It reads the scheduler's state and acts only
through its `Effects`, on the run loop, like the rest of the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from llmswap.scheduler.admission import REASON_DEADLINE, SchedulerStats
from llmswap.scheduler.deadlines import Deadlines
from llmswap.scheduler.preemption import Preempting
from llmswap.scheduler.prioritizers import Prioritizer
from llmswap.scheduler.types import Clock, Effects, HandlerRequest

if TYPE_CHECKING:
    from llmswap.scheduler.errors import SchedulerError
    from llmswap.scheduler.estimates import ServiceTimes


class UrgencyMixin:
    """Prioritizer order, deadlines and preemption for `QueueScheduler`."""

    # Provided by SchedulerBooks (llmswap.scheduler.books).
    name: str
    stats: SchedulerStats
    times: ServiceTimes
    _clock: Clock
    _effects: Effects
    _log: logging.Logger
    _prioritizer: Prioritizer
    _deadlines: Deadlines
    _preemption: Preempting

    if TYPE_CHECKING:  # provided by SchedulerBooks
        def _queue_key(self, req: HandlerRequest) -> tuple[int, int, float, int]: ...
        def _remaining(self, req: HandlerRequest) -> float: ...
        def _resort(self) -> None: ...
        def _serving(self) -> Iterator[HandlerRequest]: ...
        def _queued(self) -> Sequence[HandlerRequest]: ...
        def _evictions(self, model: str) -> list[str] | None: ...
        def _remove_waiter(self, req: HandlerRequest) -> bool: ...
        def _fail(self, req: HandlerRequest, err: SchedulerError) -> None: ...

    def _reorder(self) -> None:
        """Re-sort the queue when the prioritizer's keys move with time (lrs); a no-op otherwise."""
        if self._prioritizer.dynamic:
            self._resort()

    def _preempt_blocked(self) -> None:
        """Preempt the background work in the way of the first waiting request above preemptBelow."""
        if self._preemption.bound is None:
            return
        serving: dict[str, list[HandlerRequest]] = {}
        for granted in self._serving():
            serving.setdefault(granted.model, []).append(granted)
        needed: set[str] = set()
        for req in self._queued():
            evict = self._evictions(req.model) if self._preemption.may_preempt(req) else None
            if not evict:
                continue
            needed.update(evict)
            victims = self._preemption.victims(req, evict, serving)
            if not victims:
                continue
            self._preemption.started(victims)
            for p in victims:
                self.stats.preempted[p.reason] = self.stats.preempted.get(p.reason, 0) + 1
                self._log.info("%s: preempt request #%d (priority %d) on %s for request #%d of %s (priority "
                               "%d): reason=%s", self.name, p.request.seq, p.request.priority, p.model,
                               req.seq, req.model, req.priority, p.reason)
                self._effects.preempt(p.request, p.message)
            break  # one preemptor at a time: the next is looked at once this one's swap started
        self._preemption.retain(needed)

    def _late_rejected(self, requests: list[HandlerRequest]) -> bool:
        """Report the newly late among `requests`; answer them 503 under onDeadline reject (True if any)."""
        rejected = False
        for req, err in self._deadlines.check(requests, self._clock(), self._remaining, self.stats,
                                              self._log, self.name):
            if err is not None:
                self._remove_waiter(req)
                self.stats.count(REASON_DEADLINE)
                self._fail(req, err)
                rejected = True
        return rejected
