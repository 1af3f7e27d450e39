"""What every queueing scheduler adds for issue 16: the prioritizer's order, deadlines, preemption.

Functions over the books (`llmswap.scheduler.books`), kept apart so that the books stay about queues and
swaps: the order of requests within a priority class (`llmswap.scheduler.prioritizers`), requests that can
no longer meet their deadline (`llmswap.scheduler.deadlines`) and the preemption of background work
(`llmswap.scheduler.preemption`). They act only through the books and their `Effects`, on the run loop,
like the rest of the scheduler.
"""

from __future__ import annotations

from llmswap.scheduler.admission import REASON_DEADLINE
from llmswap.scheduler.books import Books
from llmswap.scheduler.types import HandlerRequest


def reorder(books: Books) -> None:
    """Re-sort the queue when the prioritizer's keys move with time (lrs); a no-op otherwise."""
    if books.prioritizer.dynamic:
        books.resort()


def preempt_blocked(books: Books) -> None:
    """Preempt the background work in the way of the first waiting request above preemptBelow."""
    preemption = books.preemption
    if preemption.bound is None:
        return
    serving: dict[str, list[HandlerRequest]] = {}
    for granted in books.granted:
        serving.setdefault(granted.model, []).append(granted)
    needed: set[str] = set()
    for req in books.queue:
        evict = books.evictions(req.model) if preemption.may_preempt(req) else None
        if not evict:
            continue
        needed.update(evict)
        victims = preemption.victims(req, evict, serving)
        if not victims:
            continue
        preemption.started(victims)
        for p in victims:
            books.stats.preempted[p.reason] = books.stats.preempted.get(p.reason, 0) + 1
            books.log.info("%s: preempt request #%d (priority %d) on %s for request #%d of %s (priority "
                           "%d): reason=%s", books.name, p.request.seq, p.request.priority, p.model,
                           req.seq, req.model, req.priority, p.reason)
            books.effects.preempt(p.request, p.message)
        break  # one preemptor at a time: the next is looked at once this one's swap started
    preemption.retain(needed)


def late_rejected(books: Books, requests: list[HandlerRequest]) -> bool:
    """Report the newly late among `requests`; answer them 503 under onDeadline reject (True if any)."""
    rejected = False
    for req, err in books.deadlines.check(requests, books.clock(), books.remaining, books.stats,
                                          books.log, books.name):
        if err is not None:
            books.remove_waiter(req)
            books.stats.count(REASON_DEADLINE)
            books.fail(req, err)
            rejected = True
    return rejected
