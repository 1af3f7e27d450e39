"""The router's fast path on the scheduler's side: `try_grant_now`, a grant without the queue's round trip.

A mixin of `QueueScheduler` (`llmswap.scheduler.core`) over the books (`llmswap.scheduler.books`): it grants
a newcomer here and now only when `on_request` would do exactly that and nothing else, read off the same
`_limit_refusal` and `_decide` that `on_request` and the policies use (no second list of conditions), with
the same counts and the same `Effects` calls; otherwise it changes nothing and the request goes through
`on_request`. Pure and
synchronous like the rest of the scheduler; the router asks it only while no event waits before the request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmswap.scheduler.books import Place, SchedulerBooks
from llmswap.scheduler.types import HandlerRequest


class GrantAtOnce(SchedulerBooks):
    """`try_grant_now` for `QueueScheduler`; a policy narrows it with `_may_skip_queue`."""

    if TYPE_CHECKING:  # QueueScheduler's (llmswap.scheduler.core)
        def _arrived(self, req: HandlerRequest) -> None: ...
        def _limit_refusal(self, req: HandlerRequest) -> object | None: ...

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
        """Whether `on_request(req)` would only admit and grant `req`: no deadline to judge, within every
        limit, nothing queued that the policy would place first (`_may_skip_queue`), and `_decide` serves
        it (its model ready and free, nothing to evict, no swap, unload, hold or preemption about it).
        Read-only."""
        if self._shutdown is not None or req.deadline is not None:
            return False
        if self._limit_refusal(req) is not None or not self._may_skip_queue(req.model):
            return False
        return self._decide(req.model, req).place is Place.SERVE

    def _may_skip_queue(self, model: str) -> bool:
        """Whether a request for `model` may be granted without the policy re-reading its queue: by default
        only while nothing is queued and nothing is preempted (batch re-reads both after every grant)."""
        return not self._queued() and self._preemption.idle()
