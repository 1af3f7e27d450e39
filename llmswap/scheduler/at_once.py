"""The router's fast path on the scheduler's side: `try_grant_now`, a grant without the queue's round trip.

A mixin of `QueueScheduler` (`llmswap.scheduler.core`) over the books (`llmswap.scheduler.books`): it grants
a newcomer here and now only when `on_request` would do exactly that and nothing else (its model ready and
free, within every limit, nothing waiting that the policy would place first), with the same counts and the
same `Effects` calls; otherwise it changes nothing and the request goes through `on_request`. Pure and
synchronous like the rest of the scheduler; the router asks it only while no event waits before the request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmswap.process.state import ProcessState
from llmswap.scheduler.books import SchedulerBooks
from llmswap.scheduler.types import HandlerRequest


class GrantAtOnce(SchedulerBooks):
    """`try_grant_now` for `QueueScheduler`; a policy narrows it with `_may_skip_queue`."""

    if TYPE_CHECKING:  # QueueScheduler's policy hook (llmswap.scheduler.core)
        def _arrived(self, req: HandlerRequest) -> None: ...

    def try_grant_now(self, req: HandlerRequest) -> bool:
        """Grant `req` here and now when `on_request` would grant it at once and change nothing else.

        The router's fast path (`RequestApi.grant_now`), asked only while no event waits in its queue: True
        when `req` was taken here exactly as `on_request` would have taken it (same counts, same `Effects`
        calls: admitted and granted, or released if its client had gone); False when the scheduler changed
        nothing and `req` must go through `on_request`.
        """
        if not self._grants_at_once(req):
            return False
        self._arrived(req)
        self._reserve(req)
        if not self._effects.admit(req):
            self._release(req)  # the client left before admission
            return True
        self._grant(req, req.model)
        return True

    def _grants_at_once(self, req: HandlerRequest) -> bool:
        """Whether `on_request(req)` would only admit and grant `req`: its model ready and free to take it
        (no swap, unload, hold or preemption about it, nothing to evict), within every limit, no deadline to
        judge, and nothing queued that the policy would place first (`_may_skip_queue`). Read-only."""
        model = req.model
        if self._shutdown is not None or req.deadline is not None:
            return False
        if self._effects.model_state(model) is not ProcessState.READY:
            return False
        if model in self._active or self._stopping.get(model) or self._holds(model):
            return False
        if self._preemption.holds(model, req) or not self._may_skip_queue(model):
            return False
        if self._reserved.get(model, 0) + self._effects.inherited_in_flight(model) >= self._limit(model):
            return False
        key_limit = self._admission.key_limit(req.api_key)
        if key_limit is not None and req.api_key is not None and \
                self._key_reserved.get(req.api_key, 0) >= key_limit:
            return False
        return self._evictions(model) == [] and not self._collides(model, ())

    def _may_skip_queue(self, model: str) -> bool:
        """Whether a request for `model` may be granted without the policy re-reading its queue: by default
        only while nothing is queued and nothing is preempted (batch re-reads both after every grant)."""
        return not self._queued() and self._preemption.idle()
