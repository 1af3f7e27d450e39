"""The machinery every queueing scheduler shares; FIFO and batch differ only in how they place requests.

`QueueScheduler` holds its books (`llmswap.scheduler.books`: swaps in progress and their waiters, the queue,
in-flight and reserved counts, unloads in progress, and the one placement decision, `Books.decide`) and
handles the events over them: admission (`llmswap.scheduler.intake`), cancellation, swap and serve
completion, unloads, stops, shutdown, aborting loads nobody waits for, queue timeouts, positions, the
rejection counters, and the router's fast path (`try_grant_now`).

A subclass is a placement policy: it decides where a request goes (`_accept` for a newcomer, `_drain`
whenever something that blocked the queue may have changed), may hold a ready model back (`_holds`), and may
keep timers of its own (`_policy_deadline`, re-examined in `_drain` on every tick). Each placement reads
`books.decide` (pure: serve, join, swap, wait or fail), has `books.apply` carry out all but a swap, and
decides when a swap starts (`books.start_swap`); it reads the books' state and changes it only through
their methods.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from llmswap.process.state import ProcessState
from llmswap.scheduler.admission import REASON_SHED, REASON_TIMEOUT, SchedulerStats
from llmswap.scheduler.books import Books
from llmswap.scheduler.decision import ActiveSwap
from llmswap.scheduler.errors import ModelNotFound, ModelUnloaded, QueueTimeout, SchedulerError, Shed
from llmswap.scheduler.estimates import ServiceTimes, retry_after
from llmswap.scheduler.intake import Refused, admit, grants_at_once
from llmswap.scheduler.prioritizers import next_late
from llmswap.scheduler.settings import DEFAULT_SETTINGS, QueueSettings
from llmswap.scheduler.types import (
    Clock,
    Effects,
    HandlerRequest,
    ProcessStopped,
    QueueSnapshot,
    ServeDone,
    StopDone,
    SwapDone,
    Swapper,
    Unload,
)
from llmswap.scheduler.urgency import late_rejected, preempt_blocked


class QueueScheduler(ABC):
    """Implements `Scheduler` except for placement. Every method runs on the router's run loop."""

    kind = "queue"  # names the default logger: llmswap.scheduler.<kind>.<router name>

    def __init__(
        self,
        name: str,
        swapper: Swapper,
        effects: Effects,
        *,
        clock: Clock,
        settings: QueueSettings = DEFAULT_SETTINGS,
        logger: logging.Logger | None = None,
        times: ServiceTimes | None = None,
    ) -> None:
        self.name = name
        self._effects = effects
        self._clock = clock
        self._log = logger or logging.getLogger(f"llmswap.scheduler.{self.kind}.{name}")
        self.books = Books(name, swapper, effects, settings, clock=clock, log=self._log, times=times,
                           holds=self._holds)
        # The express lane (`try_grant_now`): models a plain request was found granted at once for, kept
        # while nothing the finding depends on can have changed. Every event handled here drops them (but
        # a request's end while the books are calm: `on_serve_done`), and so does `world_changed`.
        self._express: set[str] = set()

    @property
    def times(self) -> ServiceTimes:
        """The measured load and service times its estimates (Retry-After, deadlines) come from."""
        return self.books.times

    @property
    def stats(self) -> SchedulerStats:
        """The rejection and preemption counters (metrics read them)."""
        return self.books.stats

    # ----------------------------------------------------------------------------- policy hooks

    @abstractmethod
    def _accept(self, req: HandlerRequest) -> None:
        """Place a newly admitted request: serve it, join it to a swap, start one, or queue it."""

    @abstractmethod
    def _drain(self) -> None:
        """Re-read the queue: something that blocked it may have changed."""

    def _holds(self, model: str) -> bool:
        """Whether a ready `model` must not take new requests right now (it is making room)."""
        return False

    # Whether the express lane may keep its verdicts at all: the batch policy re-plans after every grant.
    express_lane = True

    def _may_skip_queue(self, model: str) -> bool:
        """Whether a request for `model` may be granted without the policy re-reading its queue: by default
        only while nothing is queued and nothing is preempted (batch re-reads both after every grant)."""
        return not self.books.queue and self.books.preemption.idle()

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
        self._express.clear()
        if self.books.shutdown is not None:
            self._effects.grant_error(req, self.books.shutdown)
            return
        if self._effects.model_state(req.model) is None:
            self._log.debug("%s: %s is not handled by this router", self.name, req.model)
            self._effects.grant_error(req, ModelNotFound(req.model))
            return
        self._arrived(req)
        admission = admit(self.books, req)
        if isinstance(admission, Refused):
            self._log.debug("%s: a request for %s is refused: %s", self.name, req.model, admission.reason)
            self._reject(req, admission.reason, admission.error)
            return
        victim = admission.victim
        self.books.reserve(req)
        if not self._effects.admit(req):
            self.books.release(req)  # the client left before admission
            return
        if victim is not None:
            self._shed(victim, req)
        if late_rejected(self.books, [req]):
            return
        self._accept(req)

    def try_grant_now(self, req: HandlerRequest) -> bool:
        """Grant `req` here and now when `on_request` would grant it at once and change nothing else.

        The router's fast path (`RequestDesk.grant_now`), asked only while no event waits in its queue: True
        when `req` was taken here exactly as `on_request` would have taken it (same counts, same `Effects`
        calls: admitted and granted, or released if its client had gone); False when the scheduler changed
        nothing and `req` must go through `on_request` (`intake.grants_at_once` decides).

        The express lane: once `grants_at_once` said yes for a model while the books were calm (nothing
        queued, loading, draining, unloading or preempted; no reload's requests still counted), the next
        request for it needs only what changes from one request to the next: its model still ready, and
        its concurrency limits. The calm can only end with an event, which drops the verdict."""
        books = self.books
        model = req.model
        if model in self._express and req.deadline is None and \
                self._effects.model_state(model) is ProcessState.READY:
            if not books.has_room(req):
                return False
        elif grants_at_once(books, req, self._may_skip_queue):
            if self.express_lane and books.calm() and not self._effects.inherited_in_flight(model):
                self._express.add(model)
        else:
            return False
        self._arrived(req)
        self.books.reserve(req)
        if not self._effects.admit(req):
            self.books.release(req)  # the client left before admission
            return True
        self.books.grant(req, req.model)
        return True

    def on_cancel(self, req: HandlerRequest) -> None:
        self._express.clear()
        if self.books.remove_waiter(req):
            self.books.release(req)
            self._after_removal()

    def on_swap_done(self, ev: SwapDone) -> None:
        self._express.clear()
        swap = self.books.end_swap(ev.model)
        if ev.error is None:
            self.books.times.observe_load(ev.model, ev.duration)
            self._loaded(ev.model, ev.duration)
        if swap is not None and swap.detached is None:
            for waiter in swap.waiters:
                if ev.error is not None:
                    self.books.fail(waiter, ev.error)
                else:
                    self.books.grant(waiter, ev.model)
        self._drain()

    def on_serve_done(self, ev: ServeDone) -> None:
        # Calm books (nothing queued, loading, held or preempted): the end of a request can unblock nothing,
        # so the express lane keeps its verdicts and the queue is not re-read (it would do nothing).
        calm = self.express_lane and self.books.calm()
        if not calm:
            self._express.clear()
        backlog = ev.request.backlog if ev.backlog is None else ev.backlog
        emptied = self.books.served(ev.request, ev.model, backlog)
        if emptied is None:
            self._log.warning("%s: ServeDone for %s with nothing in flight for that request (ignored)",
                              self.name, ev.model)
            return
        self._finished(ev.model)
        if emptied and not calm:  # still serving otherwise: nothing it blocked can move yet
            self._drain()

    def world_changed(self) -> None:
        """Something the scheduler reads changed outside its events (a process changed state on its own):
        drop the express lane's verdicts."""
        self._express.clear()

    def on_unload(self, ev: Unload) -> None:
        self._express.clear()
        self.books.unload(ev.models, ModelUnloaded(f"{self.name}: model unloaded"))
        # In-flight counts stay: the killed requests' handlers still post their ServeDone.
        self._effects.stop_processes(tuple(ev.models), ev.timeout)
        self._drain()
        self.books.publish_positions()

    def on_stop_done(self, ev: StopDone) -> None:
        self._express.clear()
        self.books.stopped(ev.models)
        self._drain()

    def on_process_stopped(self, ev: ProcessStopped) -> None:
        self._express.clear()
        self._drain()  # the running set shrank under us: evictions may have become unnecessary

    def on_tick(self) -> None:
        """Time passed: answer waiters whose queueTimeout ran out, then let the policy re-decide."""
        self._express.clear()
        books = self.books
        if books.shutdown is not None:
            return
        now = self._clock()
        expired = books.admission.expired(books.waiters(), now)
        for req in expired:
            books.remove_waiter(req)
            waited = now - req.arrived
            books.stats.count(REASON_TIMEOUT)
            self._log.info("%s: a request for %s timed out after %.1fs in the queue", self.name, req.model,
                           waited)
            books.fail(req, QueueTimeout(
                f"Waited {waited:.0f}s for {req.model} without being served "
                f"(routing.scheduler.admission.queueTimeout is {books.admission.config.queue_timeout:g}s); "
                f"retry later or raise queueTimeout",
                retry_after=retry_after(books.expected_wait(req.model, books.model_waiters(req.model))),
            ))
        if expired:
            self._after_removal()
        if late_rejected(books, list(books.waiters())):
            self._after_removal()
        self._drain()

    def next_deadline(self) -> float | None:
        books = self.books
        if not books.queue and not books.active and not books.announced_until:
            return self._policy_deadline()  # nothing waits, nothing announced: the only timer left (hot path)
        late = next_late([r for r in books.waiters() if not books.deadlines.counted(r)], books.remaining)
        times = [t for t in (books.admission.next_timeout(books.waiters()), self._policy_deadline(), late,
                             books.announcement_ends()) if t is not None]
        return min(times) if times else None

    def on_shutdown(self, err: SchedulerError) -> None:
        self._express.clear()
        self.books.close(err)

    def snapshot(self) -> QueueSnapshot:
        waiting: dict[str, int] = {}
        for req in self.books.waiters():
            waiting[req.model] = waiting.get(req.model, 0) + 1
        loading = tuple(sorted(m for m, s in self.books.active.items() if s.detached != "unloaded"))
        return QueueSnapshot(waiting=waiting, in_flight=dict(self.books.in_flight), loading=loading)

    def accepts(self, model: str, ahead: int = 0) -> bool:
        """Whether a request for `model` arriving now, after `ahead` others for it already on their way,
        would be taken rather than refused: within the model's concurrencyLimit (queued and running both
        count) and, if it would wait, within the queue bounds. Read-only; selectors ask it."""
        books = self.books
        if books.shutdown is not None or self._effects.model_state(model) is None:
            return False
        taken = books.reserved.get(model, 0) + self._effects.inherited_in_flight(model) + ahead
        if taken >= books.limit(model):
            return False
        return not books.would_wait(model) or books.admission.room_for(model, list(books.waiters()), ahead)

    # ----------------------------------------------------------------------------- shared decisions

    def _abort_unwanted_swaps(self) -> None:
        """Abort loads that nobody waits for any more once they stand in a queued request's way."""
        for swap in self.books.active.values():
            if swap.waiters or swap.detached is not None or not self._blocks_queue(swap):
                continue
            swap.detached = "aborted"
            self._log.info("swap: abort %s: nobody waits for it and a queued request needs it gone",
                           swap.model)
            self._effects.abort_swap(swap.model)

    def _blocks_queue(self, swap: ActiveSwap) -> bool:
        """Whether some queued request waits because of this swap (it collides with it)."""
        for req in self.books.queue:
            evict = self.books.evictions(req.model)
            if evict is not None and swap.collides(req.model, evict):
                return True
        return False

    # ----------------------------------------------------------------------------- admission

    def _shed(self, victim: HandlerRequest, newcomer: HandlerRequest) -> None:
        self.books.remove_waiter(victim)
        self.books.stats.count(REASON_SHED)
        self._log.info("%s: shed a waiting request for %s (priority %d) to admit one for %s (priority %d)",
                       self.name, victim.model, victim.priority, newcomer.model, newcomer.priority)
        wait = self.books.expected_wait(victim.model, self.books.model_waiters(victim.model))
        self.books.fail(victim, Shed(
            f"Dropped from the queue for {victim.model} to admit a higher-priority request "
            f"(routing.scheduler.admission.policy is shed-lowest); retry later",
            retry_after=retry_after(wait),
        ))
        self._after_removal()

    def _reject(self, req: HandlerRequest, reason: str, err: SchedulerError) -> None:
        self.books.stats.count(reason)
        self._effects.grant_error(req, err)

    def _settle(self) -> None:
        """After a placement pass: preempt what blocks the queue, tell the waiters their positions, abort
        loads nobody waits for any more."""
        preempt_blocked(self.books)  # issue 16
        self.books.publish_positions()
        self._abort_unwanted_swaps()
        self.books.track_drains()

    def _after_removal(self) -> None:
        """A waiter left: others move up, a load may have lost its last waiter, the plan may change."""
        self.books.publish_positions()
        self._abort_unwanted_swaps()
        self.books.track_drains()

