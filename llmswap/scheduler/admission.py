"""Admission control, shared by every scheduler: bounds on waiting requests, shedding, queue timeouts.

A request is *waiting* from admission until it is granted or answered with an error: queued, or
joined to a swap in progress. Requests being served are not waiting (their number is bounded by
each model's `concurrencyLimit` and each API key's `maxConcurrent`, checked by the scheduler).

- `maxQueuePerModel` / `maxQueue` bound the waiting requests of one model / of the whole router.
  A new request that would wait beyond a bound is refused (`policy: reject`: 429 for the model's
  bound, 503 for the global one), or (`policy: shed-lowest`) it displaces the lowest-ranked
  waiter in the bound's scope, the newest of those, when it outranks that waiter strictly; a
  newcomer that does not is refused as with `reject`.
- `queueTimeout` answers a waiter that has waited that long with 503.

This module only decides; the scheduler answers the requests, with a `Retry-After` computed from
its service-time estimates. Rank is the scheduler's (model priority, request priority).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmswap.config.model import EMPTY, AdmissionConfig
from llmswap.scheduler.types import HandlerRequest

POLICIES = ("reject", "shed-lowest")

# Reasons a request is refused or dropped, the keys of `SchedulerStats.rejected`.
REASON_CONCURRENCY = "concurrency_limit"  # the model's concurrencyLimit
REASON_KEY = "key_concurrency"  # the API key's maxConcurrent
REASON_MODEL_QUEUE = "queue_full_model"  # maxQueuePerModel, policy reject (or not outranking)
REASON_GLOBAL_QUEUE = "queue_full_global"  # maxQueue, policy reject (or not outranking)
REASON_SHED = "shed"  # a waiter dropped to admit a higher-ranked request
REASON_TIMEOUT = "queue_timeout"  # waited queueTimeout seconds
REASON_DEADLINE = "deadline"  # could no longer meet its deadline, and onDeadline is reject

Rank = Callable[[HandlerRequest], tuple[int, ...]]
Scope = Literal["model", "global"]


@dataclass
class SchedulerStats:
    """Counters for the metrics endpoint; mutated only on the router's run loop."""

    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count
    preempted: dict[str, int] = field(default_factory=dict)  # reason -> in-flight requests preempted
    deadline_missed: int = 0  # waiting requests that became unable to meet their deadline (rejected or not)

    def count(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


@dataclass(frozen=True)
class Verdict:
    """What admission says about a newcomer that would wait."""

    admit: bool
    scope: Scope | None = None  # the bound that was hit, if any
    bound: int = 0
    waiting: int = 0  # how many were waiting in that scope
    victim: HandlerRequest | None = None  # admit by shedding this waiter

    @property
    def status(self) -> int:
        return 429 if self.scope == "model" else 503


ADMIT = Verdict(admit=True)


class Admission:
    """The bounds and timeout of `routing.scheduler.admission`, plus per-API-key limits."""

    def __init__(self, config: AdmissionConfig | None = None, key_limits: Mapping[str, int] = EMPTY) -> None:
        self.config = config or AdmissionConfig()
        if self.config.policy not in POLICIES:
            raise ValueError(
                f"routing.scheduler.admission.policy: unknown policy {self.config.policy!r}; "
                f"use one of {', '.join(POLICIES)}"
            )
        self._key_limits = {key: limit for key, limit in key_limits.items() if limit > 0}

    @property
    def configured(self) -> bool:
        """Whether any bound or timeout applies (otherwise admission never says no)."""
        c = self.config
        return c.max_queue > 0 or c.max_queue_per_model > 0 or c.queue_timeout > 0 or bool(self._key_limits)

    def key_limit(self, api_key: str | None) -> int | None:
        """The key's `maxConcurrent`, or None when it has none."""
        if api_key is None:
            return None
        return self._key_limits.get(api_key)

    def verdict(self, req: HandlerRequest, waiting: Sequence[HandlerRequest], rank: Rank) -> Verdict:
        """May `req` join `waiting` (every request waiting right now, `req` not among them)?"""
        c = self.config
        if c.max_queue_per_model > 0:
            same_model = [w for w in waiting if w.model == req.model]
            if len(same_model) >= c.max_queue_per_model:
                return self._full(req, same_model, rank, "model", c.max_queue_per_model)
        if c.max_queue > 0 and len(waiting) >= c.max_queue:
            return self._full(req, waiting, rank, "global", c.max_queue)
        return ADMIT

    def room_for(self, model: str, waiting: Sequence[HandlerRequest], ahead: int = 0) -> bool:
        """Whether one more waiter for `model` fits within both queue bounds (shedding aside), after
        `ahead` more for it that are on their way."""
        c = self.config
        same_model = sum(1 for w in waiting if w.model == model) + ahead
        if c.max_queue_per_model > 0 and same_model >= c.max_queue_per_model:
            return False
        return not (c.max_queue > 0 and len(waiting) + ahead >= c.max_queue)

    def _full(
        self, req: HandlerRequest, scope_waiters: Sequence[HandlerRequest], rank: Rank, scope: Scope,
        bound: int,
    ) -> Verdict:
        if self.config.policy == "shed-lowest" and scope_waiters:
            victim = lowest(scope_waiters, rank)
            if rank(req) > rank(victim):
                return Verdict(True, scope, bound, len(scope_waiters), victim)
        return Verdict(False, scope, bound, len(scope_waiters))

    def expired(self, waiting: Iterable[HandlerRequest], now: float) -> list[HandlerRequest]:
        """Waiters whose `queueTimeout` has run out, oldest first."""
        timeout = self.config.queue_timeout
        if timeout <= 0:
            return []
        return sorted((w for w in waiting if now >= w.arrived + timeout), key=lambda w: w.seq)

    def next_timeout(self, waiting: Iterable[HandlerRequest]) -> float | None:
        """When the next waiter times out, or None."""
        timeout = self.config.queue_timeout
        if timeout <= 0:
            return None
        oldest = min((w.arrived for w in waiting), default=None)
        return None if oldest is None else oldest + timeout


def lowest(waiters: Iterable[HandlerRequest], rank: Rank) -> HandlerRequest:
    """The lowest-ranked waiter; among equals the newest, whose loss costs the least waiting already done."""
    return min(waiters, key=lambda w: (rank(w), -w.seq))
