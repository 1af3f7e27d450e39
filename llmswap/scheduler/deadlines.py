"""Which waiting requests have become late, counted once each, and what `onDeadline` does with them.

A waiting request is late once its deadline is nearer than the work still ahead of it
(`llmswap.scheduler.prioritizers.is_late`). The scheduler asks on every arrival and every tick
(`next_deadline` includes the moment the next waiter would turn late); each late request is
counted once in `SchedulerStats.deadline_missed` and logged, and with `onDeadline: reject` it is
answered `DeadlineMissed` (503) instead of being served late.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from llmswap.scheduler.admission import SchedulerStats
from llmswap.scheduler.errors import DeadlineMissed
from llmswap.scheduler.prioritizers import ON_DEADLINE, Remaining, is_late
from llmswap.scheduler.types import HandlerRequest

LateOutcome = tuple[HandlerRequest, DeadlineMissed | None]  # a late request, and its 503 under reject


class Deadlines:
    """The late requests seen so far (by identity) and the configured reaction."""

    def __init__(self, on_deadline: str = "ignore") -> None:
        if on_deadline not in ON_DEADLINE:
            raise ValueError(f"unknown onDeadline {on_deadline!r}; use one of {', '.join(ON_DEADLINE)}")
        self.reject = on_deadline == "reject"
        self._counted: set[int] = set()  # seq of late requests already counted

    def newly_late(self, requests: Iterable[HandlerRequest], now: float,
                   remaining: Remaining) -> list[HandlerRequest]:
        """The requests of `requests` that are late and were not reported before (now they are)."""
        late = [r for r in requests if r.deadline is not None and r.seq not in self._counted
                and is_late(r, now, remaining)]
        self._counted.update(r.seq for r in late)
        return late

    def check(self, requests: Iterable[HandlerRequest], now: float, remaining: Remaining,
              stats: SchedulerStats, log: logging.Logger, name: str) -> list[LateOutcome]:
        """Count and log each newly late request; pair it with the error to answer it (reject) or None."""
        out: list[LateOutcome] = []
        for req in self.newly_late(requests, now, remaining):
            stats.deadline_missed += 1
            short = now + remaining(req) - (req.deadline if req.deadline is not None else now)
            log.info("%s: request #%d for %s can no longer meet its deadline (%.1fs short)%s", name, req.seq,
                     req.model, short, "; rejected (onDeadline: reject)" if self.reject else "")
            err = DeadlineMissed(
                f"Cannot serve {req.model} by this request's deadline: about {short:.1f}s more would be "
                f"needed (routing.scheduler.settings.onDeadline is reject); send a later X-Deadline-Ms "
                f"or retry later"
            ) if self.reject else None
            out.append((req, err))
        return out

    def counted(self, req: HandlerRequest) -> bool:
        return req.seq in self._counted

    def forget(self, req: HandlerRequest) -> None:
        """`req` is no longer waiting or in flight."""
        self._counted.discard(req.seq)
