"""The FIFO scheduler: llama-swap's decision tree for each request, and its priority queue.

For every request, in order: unknown model → error; over the model's concurrency limit → 429;
admission bounds (if configured); admitted; a swap already loading the model → join it; ready
with nothing to evict → serve; would collide with a swap in progress, or stop a model still
serving → wait in the queue; otherwise start a swap. A model whose last request announced a backlog
(a task lane's queue, `HandlerRequest.backlog`) counts as still serving until its next request came,
within a few seconds (`ANNOUNCED_GRACE`): the queue keeps arrival order. Swaps whose targets and
evict sets do not touch each other run in parallel. The queue is re-read, once and in order,
whenever something that blocked it may have changed. The bookkeeping shared with the batch
scheduler lives in `llmswap.scheduler.core` and the books it holds (`llmswap.scheduler.books`).

Where our asyncio contracts differ from llama-swap's Go (on purpose):
- Stopping for an unload is asynchronous (`StopDone` follows): until it arrives, the unloaded
  models are "stopping", and a request for one of them, or one that would evict one, waits.
- A swap nobody waits for any more is aborted when a queued request needs it out of the way
  (llama-swap keeps loading it, #727). Its `SwapDone` then only cleans up.
- A swap dropped by an unload, like an aborted one, stays on the books until its `SwapDone`:
  nobody may join it, it still collides, and its model is not started again before then, so one
  model never has two swaps in flight.
- The 429 of a concurrency limit carries a `Retry-After` estimated from measured service times
  (llama-swap always says 1 s).
"""

from __future__ import annotations

from llmswap.scheduler.core import QueueScheduler
from llmswap.scheduler.types import HandlerRequest
from llmswap.scheduler.urgency import preempt_blocked, reorder

RULE_REQUEST = "fifo.request"  # a swap started by the request that just arrived
RULE_DRAIN = "fifo.drain"  # a swap started by a queued request once it was unblocked


class FifoScheduler(QueueScheduler):
    """Implements `Scheduler`. Every method runs on the router's run loop; none blocks or awaits."""

    kind = "fifo"

    def _accept(self, req: HandlerRequest) -> None:
        if not self._place(req, RULE_REQUEST):
            reorder(self.books)  # issue 16: lrs keys move with time
            self.books.enqueue(req)
            self._settle()

    def _may_skip_queue(self, model: str) -> bool:
        # A newcomer is placed before the queue is re-read (`_accept`), so only a queued request of its own
        # model could be overtaken.
        return not self.books.queued_for(model)

    def _drain(self) -> None:
        """One pass over the queue, in order; swaps started here are seen by the requests after."""
        if not self.books.queue:
            preempt_blocked(self.books)  # issue 16: releases holds nobody needs any more
            return
        reorder(self.books)  # issue 16: lrs keys move with time
        self.books.place_queued(lambda req: self._place(req, RULE_DRAIN))
        self._settle()

    def _place(self, req: HandlerRequest, rule: str) -> bool:
        """Serve, join, start a swap for, or fail `req`. False: it must wait in the queue."""
        books = self.books
        decision = books.decide(req.model, req, self._stops)

        def detail() -> str:
            waited = self._clock() - req.arrived
            return (f"request #{req.seq} waited {waited:.1f}s; running [{', '.join(decision.running)}]; "
                    f"{len(books.queue)} queued")

        return books.apply(req, decision, rule, detail)

    def _stops(self, victim: str) -> str | None:
        """FIFO's rule: a swap starts once none of its victims serves or expects its client's next request."""
        if self.books.in_flight_of(victim) > 0:
            return f"it would evict {victim}, still serving"
        if self.books.announced(victim):
            return f"it would evict {victim}, whose client announced its next request"
        return None
