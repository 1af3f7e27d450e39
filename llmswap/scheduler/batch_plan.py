"""The batch scheduler's arithmetic: which waiting model goes next, and how long the loaded ones may stay.

Pure functions over `Contender`s (one per model with queued requests); no scheduler state.

Deadlines. A model's *deadline* is when its oldest queued request has waited its *budget*: maxWait,
scaled down by how much holding the models in its way pays (`llmswap.scheduler.arrivals`; none for
open-loop traffic, so it goes as FIFO would). Its swap should have started by then. Models go one
after another on a machine that holds one of them at a time (the worst case the planner assumes),
each occupying it for its *slot*: its load time, the minimum residency it is then granted, and one
request's service time. Walking the models in deadline order (earliest deadline first) from the last
one back, the *latest start* of each is the later-bounded of its own deadline and the next one's
latest start minus its slot. The first model's latest start is when the loaded models must begin
making room so that every deadline can still be met (least-slack scheduling: seeds 003/004).

Request deadlines (prioritizer edf or lrs). A model whose most urgent request carries a deadline
(`X-Deadline-Ms`...) must start by that deadline minus its load and one service time: its deadline
is the earlier of the two (`due`). Among models already past their deadline — all must go now —
the queue's own order decides, as in FIFO: priority, then the prioritizer's key (`within`), then
arrival.

Choice. While no deadline presses, the model to load next is the best by `choice_key`: model
priority, then the highest request priority among its waiters, then urgency (queue depth, grown
with the age of its oldest request relative to `maxWait`), then oldest arrival, then model id —
among the models that can go first without making any other model miss its deadline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Contender:
    """A model with queued requests, as the planner sees it."""

    model: str
    depth: int  # queued requests
    oldest: float  # arrival (clock reading) of its oldest queued request
    model_priority: int
    request_priority: int  # the highest among its queued requests
    slot: float  # seconds it holds the machine once it goes: load + minimum residency + one service
    # Seconds it may be deferred for the loaded models (maxWait scaled by whether holding them pays,
    # `llmswap.scheduler.arrivals`); None: the full maxWait.
    budget: float | None = None
    # Under edf/lrs: when it must start so that its most urgent request meets its own deadline
    # (X-Deadline-Ms...), and that request's prioritizer key (lower goes first among equals).
    due: float | None = None
    within: float = 0.0


def deadline(c: Contender, max_wait: float) -> float:
    waited = c.oldest + (max_wait if c.budget is None else min(c.budget, max_wait))
    return waited if c.due is None else min(waited, c.due)


DeadlineKey = tuple[float, int, int, float, float, str]


def deadline_key(c: Contender, max_wait: float, now: float = -math.inf) -> DeadlineKey:
    # Among models already past their deadline (all must go now) the queue's own order decides, as in FIFO:
    # priority, then the prioritizer, then arrival.
    return (max(deadline(c, max_wait), now), -c.model_priority, -c.request_priority, c.within, c.oldest,
            c.model)


def by_deadline(contenders: Sequence[Contender], max_wait: float, now: float = -math.inf) -> list[Contender]:
    return sorted(contenders, key=lambda c: deadline_key(c, max_wait, now))


def latest_starts(ordered: Sequence[Contender], max_wait: float) -> list[float]:
    """The latest start of each model of `ordered` (deadline order) so that all deadlines are met."""
    latest = [0.0] * len(ordered)
    following = math.inf
    for i in range(len(ordered) - 1, -1, -1):
        c = ordered[i]
        latest[i] = min(deadline(c, max_wait), following - c.slot)
        following = latest[i]
    return latest


def first_latest_start(contenders: Sequence[Contender], max_wait: float) -> float:
    """The latest start of whichever of `contenders` must go first; infinity when there are none."""
    if not contenders:
        return math.inf
    return latest_starts(by_deadline(contenders, max_wait), max_wait)[0]


def urgency(c: Contender, now: float, max_wait: float) -> float:
    """Queue depth, weighted up by how close the oldest request is to its `maxWait` (1x fresh, 2x due)."""
    age = max(0.0, now - c.oldest)
    return c.depth * (1.0 + (age / max_wait if max_wait > 0 else age))


def choice_key(c: Contender, now: float, max_wait: float) -> tuple[int, int, float, float, str]:
    return (-c.model_priority, -c.request_priority, -urgency(c, now, max_wait), c.oldest, c.model)


def by_choice(contenders: Sequence[Contender], now: float, max_wait: float) -> list[Contender]:
    return sorted(contenders, key=lambda c: choice_key(c, now, max_wait))


def can_go_first(c: Contender, contenders: Sequence[Contender], now: float, max_wait: float) -> bool:
    """Whether loading `c` now still leaves every other contender able to start by its deadline."""
    others = [o for o in contenders if o.model != c.model]
    return now + c.slot <= first_latest_start(others, max_wait)
