"""Prioritizers: the order of waiting requests within a priority class; when a deadline can no longer be met.

Both schedulers order their queue by model priority, then request priority (`X-Priority` or the API
key's), then — within that class — by what `routing.scheduler.settings.prioritizer` says (the
request prioritizers of Vajra, seed 004), then by arrival (`seq`, unique), so the order is always
deterministic:

- `fcfs` (default): arrival order.
- `edf`: earliest absolute deadline first. A request's deadline is its arrival plus `X-Deadline-Ms`,
  else its API key's `deadlineMs`, else its model's `deadlineMs`; requests without one go after
  every request with one.
- `lrs`: least remaining slack first. Slack is deadline - now - the work still ahead of the request
  (its model's remaining load if it must be loaded, plus one service time, both measured in
  `llmswap.scheduler.estimates`). Unlike a deadline it changes as models load and estimates move,
  so the queue is re-sorted before every pass over it.

A request is *late* once now + its remaining work is past its deadline: it can no longer be served in
time. Late requests are counted (once each) and logged; with `onDeadline: reject` they are answered
503 before they are served, which frees the machine for requests that can still make it.

Pure functions over `HandlerRequest`s; the expected remaining work comes from the scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from llmswap.config.model import ON_DEADLINE, PRIORITIZERS
from llmswap.scheduler.types import HandlerRequest

__all__ = ["ON_DEADLINE", "PRIORITIZERS", "Prioritizer", "is_late", "next_late", "slack"]

Remaining = Callable[[HandlerRequest], float]  # seconds of work still ahead of a waiting request


@dataclass(frozen=True)
class Prioritizer:
    """One of `PRIORITIZERS`; `key` orders requests within a priority class (lower goes first)."""

    name: str = "fcfs"

    def __post_init__(self) -> None:
        if self.name not in PRIORITIZERS:
            raise ValueError(f"unknown prioritizer {self.name!r}; use one of {', '.join(PRIORITIZERS)}")

    @property
    def dynamic(self) -> bool:
        """Whether keys change while requests wait (the queue must be re-sorted before each pass)."""
        return self.name == "lrs"

    def key(self, req: HandlerRequest, now: float, remaining: Remaining) -> float:
        if self.name == "fcfs" or req.deadline is None:
            return 0.0 if self.name == "fcfs" else math.inf
        if self.name == "edf":
            return req.deadline
        return slack(req, now, remaining)


def slack(req: HandlerRequest, now: float, remaining: Remaining) -> float:
    """Seconds to spare before `req` misses its deadline; infinity without one."""
    if req.deadline is None:
        return math.inf
    return req.deadline - now - remaining(req)


def is_late(req: HandlerRequest, now: float, remaining: Remaining) -> bool:
    """Whether `req` can no longer be served by its deadline (no time to spare is late: the timer for
    the moment it turns late then finds it late, rather than firing again at the same instant)."""
    return slack(req, now, remaining) <= 0


def next_late(requests: list[HandlerRequest], remaining: Remaining) -> float | None:
    """The earliest time one of `requests` becomes late (with the work estimates of now), or None."""
    times = [r.deadline - remaining(r) for r in requests if r.deadline is not None]
    return min(times) if times else None
