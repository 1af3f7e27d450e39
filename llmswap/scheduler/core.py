"""The machinery every queueing scheduler shares; FIFO and batch differ only in how they place requests.

`QueueScheduler` handles the events over the books it inherits (`llmswap.scheduler.books`: swaps in
progress and their waiters, the queue, in-flight and reserved counts, unloads in progress; the router's
fast path, `try_grant_now`, is `llmswap.scheduler.at_once`) and owns
everything that is not a placement decision: limits and admission, cancellation, swap and serve
completion, unloads, stops, shutdown, aborting loads nobody waits for, queue timeouts, positions and
the rejection counters.

A subclass decides where a request goes (`_accept` for a newcomer, `_drain` whenever something
that blocked the queue may have changed), may hold a ready model back (`_holds`), and may keep
timers of its own (`_policy_deadline`, re-examined in `_drain` on every tick). Each placement reads
`_decide` (pure: serve, join, swap, wait or fail), has `_apply` carry out all but a swap, and decides
when a swap starts; it reads and changes the books only through their interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from llmswap.scheduler.admission import (
    REASON_CONCURRENCY,
    REASON_GLOBAL_QUEUE,
    REASON_KEY,
    REASON_MODEL_QUEUE,
    REASON_SHED,
    REASON_TIMEOUT,
)
from llmswap.scheduler.at_once import GrantAtOnce
from llmswap.scheduler.books import ActiveSwap
from llmswap.scheduler.errors import (
    ConcurrencyLimit,
    ModelNotFound,
    ModelUnloaded,
    QueueFull,
    QueueTimeout,
    SchedulerError,
    Shed,
)
from llmswap.scheduler.estimates import retry_after
from llmswap.scheduler.prioritizers import next_late
from llmswap.scheduler.types import (
    HandlerRequest,
    ProcessStopped,
    QueueSnapshot,
    ServeDone,
    StopDone,
    SwapDone,
    SwapPlan,
    Unload,
)
from llmswap.scheduler.urgency import UrgencyMixin


@dataclass(frozen=True, slots=True)
class Admitted:
    """`_admit`'s yes; `victim`: the waiting request it sheds to make room, if any."""

    victim: HandlerRequest | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """`_admit`'s no: the rejection counter's reason and the error the client gets."""

    reason: str
    error: SchedulerError


class QueueScheduler(UrgencyMixin, GrantAtOnce, ABC):
    """Implements `Scheduler` except for placement. Every method runs on the router's run loop."""

    # ----------------------------------------------------------------------------- policy hooks

    @abstractmethod
    def _accept(self, req: HandlerRequest) -> None:
        """Place a newly admitted request: serve it, join it to a swap, start one, or queue it."""

    @abstractmethod
    def _drain(self) -> None:
        """Re-read the queue: something that blocked it may have changed."""

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
        admission = self._admit(req)
        if isinstance(admission, Refused):
            self._log.debug("%s: a request for %s is refused: %s", self.name, req.model, admission.reason)
            self._reject(req, admission.reason, admission.error)
            return
        victim = admission.victim
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
        self._announce(ev.model, ev.request.backlog if ev.backlog is None else ev.backlog)
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
        if not self._queue and not self._active and not self._announced_until:
            return self._policy_deadline()  # nothing waits, nothing announced: the only timer left (hot path)
        late = next_late([r for r in self._waiters() if not self._deadlines.counted(r)], self._remaining)
        times = [t for t in (self._admission.next_timeout(self._waiters()), self._policy_deadline(), late,
                             self._announcement_ends()) if t is not None]
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

    def snapshot(self) -> QueueSnapshot:
        waiting: dict[str, int] = {}
        for req in self._waiters():
            waiting[req.model] = waiting.get(req.model, 0) + 1
        loading = tuple(sorted(m for m, s in self._active.items() if s.detached != "unloaded"))
        return QueueSnapshot(waiting=waiting, in_flight=dict(self._in_flight), loading=loading)

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

    def _admit(self, req: HandlerRequest) -> Admitted | Refused:
        """Whether `req` is taken, and whom it sheds (`admission.policy: shed-lowest`): within the concurrency
        limits and, when it would wait, within the queue bounds. Read-only; `on_request` applies it."""
        refused = self._limit_refusal(req)
        if refused is not None:
            return refused
        if not self._would_wait(req.model):
            return Admitted()
        verdict = self._admission.verdict(req, list(self._waiters()), self._rank)
        if not verdict.admit:
            return Refused(*self._queue_full(req, verdict.scope, verdict.bound, verdict.waiting))
        return Admitted(verdict.victim)

    def _limit_refusal(self, req: HandlerRequest) -> Refused | None:
        """The concurrency limit `req` is over (its model's concurrencyLimit, its API key's maxConcurrent),
        or None. Read-only: `_admit` and the fast path share it."""
        limit = self._limit(req.model)
        if self._reserved.get(req.model, 0) + self._effects.inherited_in_flight(req.model) >= limit:
            return Refused(REASON_CONCURRENCY, ConcurrencyLimit(
                f"Too many requests: {req.model} already has {limit} requests waiting or running "
                f"(its concurrencyLimit); retry later",
                retry_after=retry_after(self._model_slot_wait(req.model)),
            ))
        key_limit = self._admission.key_limit(req.api_key)
        if key_limit is not None and req.api_key is not None and \
                self._key_reserved.get(req.api_key, 0) >= key_limit:
            return Refused(REASON_KEY, ConcurrencyLimit(
                f"Too many requests for this API key: it already has {key_limit} requests waiting "
                f"or running (its maxConcurrent in apiKeys); retry later",
                retry_after=retry_after(self._key_slot_wait(req.api_key)),
            ))
        return None

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

    # ----------------------------------------------------------------------------- admission

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

    def _after_removal(self) -> None:
        """A waiter left: others move up, a load may have lost its last waiter, the plan may change."""
        self._publish_positions()
        self._abort_unwanted_swaps()

