"""Whether a newcomer is taken, read off the books: the concurrency limits, the queue bounds, the fast path.

Pure functions over `Books` (`llmswap.scheduler.books`); `QueueScheduler.on_request` and `try_grant_now`
apply what they return. Admission and placement are two decisions on purpose: taking a newcomer may shed a
waiter (`admission.policy: shed-lowest`), and that can abort a load nobody waits for any more, which changes
where the newcomer goes; so placement (`Books.decide`) is read after admission has been applied.

`grants_at_once` is the router's fast path: a newcomer that `on_request` would only admit and serve is
granted without the queue's round trip. It reads the same `limit_refusal` and `Books.decide` that
`on_request` and the policies use, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmswap.scheduler.admission import (
    REASON_CONCURRENCY,
    REASON_GLOBAL_QUEUE,
    REASON_KEY,
    REASON_MODEL_QUEUE,
)
from llmswap.scheduler.books import Books
from llmswap.scheduler.decision import Place
from llmswap.scheduler.errors import ConcurrencyLimit, QueueFull, SchedulerError
from llmswap.scheduler.estimates import retry_after
from llmswap.scheduler.types import HandlerRequest


@dataclass(frozen=True, slots=True)
class Admitted:
    """`admit`'s yes; `victim`: the waiting request it sheds to make room, if any."""

    victim: HandlerRequest | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """`admit`'s no: the rejection counter's reason and the error the client gets."""

    reason: str
    error: SchedulerError


def rank(books: Books, req: HandlerRequest) -> tuple[int, int]:
    """Who outranks whom when the queue is full: model priority, then request priority."""
    return (books.priority.get(req.model, 0), req.priority)


def admit(books: Books, req: HandlerRequest) -> Admitted | Refused:
    """Whether `req` is taken, and whom it sheds (`admission.policy: shed-lowest`): within the concurrency
    limits and, when it would wait, within the queue bounds."""
    refused = limit_refusal(books, req)
    if refused is not None:
        return refused
    if not books.would_wait(req.model):
        return Admitted()
    verdict = books.admission.verdict(req, list(books.waiters()), lambda r: rank(books, r))
    if not verdict.admit:
        return queue_full(books, req, verdict.scope, verdict.bound, verdict.waiting)
    return Admitted(verdict.victim)


def limit_refusal(books: Books, req: HandlerRequest) -> Refused | None:
    """The concurrency limit `req` is over (its model's concurrencyLimit, its API key's maxConcurrent),
    or None."""
    if books.model_full(req.model, books.effects.inherited_in_flight(req.model)):
        limit = books.limit(req.model)
        return Refused(REASON_CONCURRENCY, ConcurrencyLimit(
            f"Too many requests: {req.model} already has {limit} requests waiting or running "
            f"(its concurrencyLimit); retry later",
            retry_after=retry_after(_model_slot_wait(books, req.model)),
        ))
    key = req.api_key
    if key is not None and books.key_full(key):
        return Refused(REASON_KEY, ConcurrencyLimit(
            f"Too many requests for this API key: it already has {books.admission.key_limit(key)} requests "
            f"waiting or running (its maxConcurrent in apiKeys); retry later",
            retry_after=retry_after(_key_slot_wait(books, key)),
        ))
    return None


def _model_slot_wait(books: Books, model: str) -> float:
    """Seconds until one of `model`'s reserved requests is expected to finish and free a slot."""
    service = books.times.service(model)
    serving = [at for req, at in books.granted.items() if req.model == model]
    if serving:
        return max(0.0, min(serving) + service - books.clock())
    return books.load_remaining(model) + service


def _key_slot_wait(books: Books, api_key: str) -> float:
    """Seconds until one of this API key's requests is expected to finish."""
    now = books.clock()
    service = books.times.service
    ends = [at + service(req.model) - now for req, at in books.granted.items() if req.api_key == api_key]
    for req in books.waiters():
        if req.api_key == api_key:
            ahead = books.model_waiters(req.model)
            ends.append(books.expected_wait(req.model, ahead) + service(req.model))
    return max(0.0, min(ends, default=0.0))


def queue_full(books: Books, req: HandlerRequest, scope: str | None, bound: int, waiting: int) -> Refused:
    """The refusal of a newcomer that would wait beyond a queue bound, with an honest Retry-After."""
    if scope == "model":
        wait = books.expected_wait(req.model, books.model_waiters(req.model))
        message = (f"Too many requests waiting for {req.model}: {waiting} already queued "
                   f"(routing.scheduler.admission.maxQueuePerModel is {bound}); retry later")
        return Refused(REASON_MODEL_QUEUE, QueueFull(message, status=429, retry_after=retry_after(wait)))
    wait = books.expected_wait(req.model, list(books.waiters()))
    message = (f"The server is busy: {waiting} requests are already waiting "
               f"(routing.scheduler.admission.maxQueue is {bound}); retry later")
    return Refused(REASON_GLOBAL_QUEUE, QueueFull(message, status=503, retry_after=retry_after(wait)))


def grants_at_once(books: Books, req: HandlerRequest, may_skip_queue: Callable[[str], bool]) -> bool:
    """Whether `on_request(req)` would only admit and grant `req`: no deadline to judge, within every
    limit, nothing queued that the policy would place first (`may_skip_queue`), and `decide` serves it
    (its model ready and free, nothing to evict, no swap, unload, hold or preemption about it)."""
    if books.shutdown is not None or req.deadline is not None:
        return False
    if limit_refusal(books, req) is not None or not may_skip_queue(req.model):
        return False
    return books.decide(req.model, req).place is Place.SERVE
